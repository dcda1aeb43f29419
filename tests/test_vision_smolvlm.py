"""SmolVLM's (Idefics3's) vision tower and image splitting against llama.cpp's libmtmd
and a float64 reference: the tiles and the global image, the text mtmd puts around
them, their embeddings, and the first token's logits after them (causal, as mtmd
decodes every projector but Gemma 3's).

The synthetic model (tests/data/vision/smolvlm-tiny*) and llama.cpp's recording come
from scripts/make_synth_smolvlm.py."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import vision_reference
from conftest import DATA, available_isas, forced_isa
from gguf import GGUFValueType
from PIL import Image
from test_vision_gemma3 import rewrite

from pyengine.api import LLM
from pyengine.errors import ImageError, ModelError, UnsupportedError
from pyengine.ml.context import Backend
from pyengine.sample import SamplingOptions
from pyengine.session import prepare_chat
from pyengine.vision import image
from pyengine.vision.idefics3 import tiled
from pyengine.vision.projector import load_projector
from pyengine.vision.prompt import MARKER, encode_with_images

VISION = DATA / "vision"
TEXT, MMPROJ = VISION / "smolvlm-tiny.gguf", VISION / "smolvlm-tiny.mmproj.gguf"
PNG = VISION / "smolvlm-tiny.png"
RECORDED = json.loads((VISION / "smolvlm-tiny.embd.json").read_text())
# 150x110: shrunk both ways before it is tiled (mtmd resamples the width first)
SHRUNK_PNG = VISION / "smolvlm-tiny-shrunk.png"
SHRUNK = json.loads((VISION / "smolvlm-tiny-shrunk.embd.json").read_text())
TOLERANCE = 1e-3   # relative: the largest difference over the largest value


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def png_of(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def projector():
    proj = load_projector(MMPROJ, n_embd_text=64)
    yield proj
    proj.close()


def rows_of(recording: dict) -> np.ndarray:
    return np.array(recording["embeddings"], np.float64).reshape(recording["n_tokens"], recording["n_embd"])


@pytest.fixture(scope="module")
def recorded() -> np.ndarray:
    return rows_of(RECORDED)


# ---------------------------------------------------------------- the projector file

def test_projector_reads_the_files_hyper_parameters(projector):
    c = projector.tower.cfg
    assert (projector.kind, c.image_size, c.patch_size, c.shuffle, c.longest_edge) == ("idefics3", 32, 4, 2, 96)
    assert (c.n_merged, projector.n_embd, projector.n_image_tokens) == (128, 64, 16)
    assert not projector.attends_both_ways


@pytest.mark.parametrize("case, error, message", [
    ("no_longest_edge", UnsupportedError, "preproc_image_size"),
    ("shuffle", ModelError, "scale_factor = 3"),
    ("missing_fc", ModelError, "mm.model.fc.weight"),
    ("silu", UnsupportedError, "GELU"),
])
def test_bad_projectors_fail_typed(tmp_path, case, error, message):
    U, B = GGUFValueType.UINT32, GGUFValueType.BOOL
    keys, drop = {
        "no_longest_edge": ({"clip.vision.preproc_image_size": (0, U)}, ()),
        "shuffle": ({"clip.vision.projector.scale_factor": (3, U)}, ()),
        "missing_fc": ({}, ("mm.model.fc.weight",)),
        "silu": ({"clip.use_gelu": (False, B)}, ()),
    }[case]
    with pytest.raises(error, match=message):
        load_projector(rewrite(tmp_path / "p.gguf", keys=keys, drop=drop, src=MMPROJ))


# ---------------------------------------------------------------- splitting

@pytest.mark.parametrize("size, grid", [((40, 60), (2, 3)), ((60, 40), (3, 2)), ((50, 50), (3, 3)),
                                        ((20, 96), (1, 3)), ((31, 32), (3, 3))])
def test_an_image_is_cut_into_whole_tiles(size, grid):
    refined, rows, cols = tiled(noise(*size), 32, 96)
    assert (rows, cols) == grid and refined.shape == (rows * 32, cols * 32, 3)


def test_too_narrow_an_image_is_refused(projector):
    with pytest.raises(ImageError, match="too narrow"):
        projector.embed(png_of(noise(1, 200)))


def test_pieces_are_mtmds_text_and_tiles(projector):
    """The tiles row by row with <row_R_col_C>, newlines between rows, the global image last."""
    pieces = projector.embed_pieces(PNG.read_bytes())
    text = [p if isinstance(p, str) else len(p) for p in pieces]
    tile = "<fake_token_around_image><row_{}_col_{}>"
    assert text == [tile.format(1, 1), 16, tile.format(1, 2), 16, tile.format(1, 3), 16, "\n",
                    tile.format(2, 1), 16, tile.format(2, 2), 16, tile.format(2, 3), 16,
                    "\n\n<fake_token_around_image><global-img>", 16, "<fake_token_around_image>"]


@pytest.fixture(scope="module")
def llm():
    with LLM(TEXT, n_ctx=256, n_threads=2, mmproj=MMPROJ) as model:
        yield model


def our_prompt(llm, png: bytes):
    """(ids, spans) of the recorded prompt with `png` at its marker, as pyengine cuts it
    (both recordings hold the same prompt)."""
    def first(piece: str) -> list[int]:
        return llm.tokenizer.encode(piece, add_special=True, parse_special=True)
    return encode_with_images(llm.tokenizer, first, RECORDED["prompt"].format(marker=MARKER), [png],
                              llm.projector)


@pytest.mark.parametrize("png, recording", [(PNG, RECORDED), (SHRUNK_PNG, SHRUNK)])
def test_the_prompt_is_cut_as_libmtmd_cuts_it(llm, png, recording):
    ids, spans = our_prompt(llm, png.read_bytes())
    expected, starts = [], []
    for seg in recording["segments"]:
        if "tokens" in seg:
            expected += seg["tokens"]
        else:
            starts.append(len(expected))
            expected += [0] * seg["image"]
    assert ids == expected
    assert [s for s, _ in spans] == starts and [len(r) for _, r in spans] == recording["blocks"]


# ---------------------------------------------------------------- the tower

@pytest.mark.parametrize("png, recording, n_blocks", [(PNG, RECORDED, 7), (SHRUNK_PNG, SHRUNK, 10)])
def test_embeddings_match_llama_cpp(projector, png, recording, n_blocks):
    ours = projector.embed(png.read_bytes())
    assert ours.shape == (n_blocks * 16, 64) and ours.dtype == np.float32
    assert recording["blocks"] == [16] * n_blocks
    assert relative(ours, rows_of(recording)) < TOLERANCE


def test_resampling_the_height_first_lands_off_llama_cpp():
    """Pillow shrinks an image the height first when both sides shrink; mtmd the width
    first: the rounding differs enough to show."""
    rgb = image.decode(SHRUNK_PNG.read_bytes())
    right = np.concatenate(vision_reference.idefics3_embeddings(MMPROJ, rgb))
    wrong = np.concatenate(vision_reference.idefics3_embeddings(MMPROJ, rgb, "height_first"))
    assert relative(right, rows_of(SHRUNK)) < TOLERANCE < 10 * TOLERANCE < relative(wrong, rows_of(SHRUNK))


@pytest.mark.parametrize("size", [(40, 60), (72, 30), (33, 33)])
def test_embeddings_match_the_float64_reference(projector, size):
    rgb = noise(*size, seed=size[0])
    reference = np.concatenate(vision_reference.idefics3_embeddings(MMPROJ, rgb))
    assert relative(projector.embed_pixels(rgb), reference) < TOLERANCE


def test_the_reference_is_llama_cpps_tower_too(recorded):
    reference = vision_reference.idefics3_embeddings(MMPROJ, image.decode(PNG.read_bytes()))
    assert relative(recorded, np.concatenate(reference)) < TOLERANCE


@pytest.mark.parametrize("variant", vision_reference.IDEFICS3_VARIANTS)
def test_a_wrong_tower_lands_far_from_llama_cpp(recorded, variant):
    wrong = vision_reference.idefics3_embeddings(MMPROJ, image.decode(PNG.read_bytes()), variant)
    assert relative(np.concatenate(wrong), recorded) > 50 * TOLERANCE


def test_same_bits_on_every_isa_and_thread_count(projector):
    tiles = projector.tower.preprocess(image.decode(PNG.read_bytes()))
    results = []
    for isa in available_isas():
        with forced_isa(isa):
            for threads in (1, 3):
                results.append((isa, threads, np.concatenate(projector.tower.encode(tiles, Backend(threads)))))
    for isa, threads, out in results[1:]:
        assert np.array_equal(out, results[0][2]), (isa, threads)


# ---------------------------------------------------------------- the image in the text sequence

def first_top(llm, ids, spans) -> dict[int, float]:
    handle = llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True, top_logprobs=10,
                               images=spans)
    return dict(handle.result().logprobs[0].top)


def distance_to_recorded(top: dict[int, float], recording: dict = RECORDED) -> float:
    """The largest difference of a recorded top-10 logit from ours, both taken relative to
    the best token's (log-probabilities differ from logits by one constant)."""
    best, best_logit = recording["top_logits"][0]
    return max(abs((top[t] - top[best]) - (v - best_logit)) if t in top else np.inf
               for t, v in recording["top_logits"])


@pytest.mark.parametrize("png, recording", [(PNG, RECORDED), (SHRUNK_PNG, SHRUNK)])
def test_first_token_logits_after_the_image_match_llama_cpp(llm, png, recording):
    top = first_top(llm, *our_prompt(llm, png.read_bytes()))
    assert next(iter(top)) == recording["top_logits"][0][0]
    assert distance_to_recorded(top, recording) < 0.05


def with_recorded_rows(spans, recorded: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """The spans with llama.cpp's own rows in place of ours."""
    ends = np.cumsum([len(r) for _, r in spans])
    return [(s, recorded[e - len(r):e].astype(np.float32)) for (s, r), e in zip(spans, ends)]


def test_llama_cpps_rows_fed_causally_give_llama_cpps_logits(llm, recorded):
    ids, spans = our_prompt(llm, PNG.read_bytes())
    assert distance_to_recorded(first_top(llm, ids, with_recorded_rows(spans, recorded))) < 1e-3


def test_an_image_attended_both_ways_lands_off_llama_cpp(recorded):
    """Gemma 3's way of feeding an image is wrong here: mtmd decodes Idefics3's causally."""
    with LLM(TEXT, n_ctx=256, n_threads=2, mmproj=MMPROJ) as fresh:   # nothing cached from a causal feed
        fresh.engine.images_both_ways = True
        ids, spans = our_prompt(fresh, PNG.read_bytes())
        top = first_top(fresh, ids, with_recorded_rows(spans, recorded))
    assert distance_to_recorded(top) > 0.01


def test_tiles_in_another_order_land_far_from_llama_cpp(llm):
    ids, spans = our_prompt(llm, PNG.read_bytes())
    rows = [r for _, r in spans]
    shuffled = [(s, r) for (s, _), r in zip(spans, rows[::-1])]   # the global image first, the tiles reversed
    assert distance_to_recorded(first_top(llm, ids, shuffled)) > 0.1


# ---------------------------------------------------------------- in a chat

def ask(llm, png: bytes, question: str):
    """(the first token's log-probabilities, the completion, the prepared prompt)."""
    prepared = prepare_chat(llm, [{"role": "user", "content": question, "images": [png]}])
    result = llm.engine.submit(prepared.ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True,
                               top_logprobs=8, images=prepared.images).result()
    return dict(result.logprobs[0].top), result, prepared


def test_a_chat_places_every_tile_and_reuses_them_for_the_same_image(llm):
    first, _, prepared = ask(llm, PNG.read_bytes(), "What is it?")
    assert [len(rows) for _, rows in prepared.images] == [16] * 7
    starts = [start for start, _ in prepared.images]
    assert all(b - a > 16 for a, b in zip(starts, starts[1:]))        # text between the tiles
    again, done, _ = ask(llm, PNG.read_bytes(), "What is it?")
    assert done.cached_tokens > starts[-1] + 16 and again == first  # all seven blocks reused, the same bits
    other, done, _ = ask(llm, SHRUNK_PNG.read_bytes(), "What is it?")
    assert done.cached_tokens <= starts[0] and other != first


def test_the_chat_api_answers_with_a_split_image(llm):
    reply = llm.chat([{"role": "user", "content": "Describe it.", "images": [SHRUNK_PNG.read_bytes()]}],
                     max_tokens=3, temperature=0)
    assert reply["prompt_eval_count"] > 10 * 16 and reply["eval_count"] >= 1
