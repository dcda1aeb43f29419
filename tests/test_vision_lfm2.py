"""LFM2-VL's vision tower against llama.cpp's libmtmd and a float64 reference: the
image resized to whole tokens, the position grid resized to the patches, the pixel
unshuffle and MLP projector, a large image's tiles and thumbnail, and the first
token's logits after the image (fed causally, as mtmd does).

The synthetic model (tests/data/vision/lfm2vl-tiny*) and llama.cpp's recording come
from scripts/make_synth_lfm2vl.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import vision_reference
from conftest import DATA, available_isas, forced_isa
from gguf import GGUFValueType
from test_vision_gemma3 import rewrite

from pyengine.api import LLM
from pyengine.errors import ModelError
from pyengine.ml.context import Backend
from pyengine.sample import SamplingOptions
from pyengine.vision import image
from pyengine.vision.lfm2 import should_tile, smart_size, tile_grid
from pyengine.vision.projector import load_projector
from pyengine.vision.prompt import MARKER, encode_with_images

VISION = DATA / "vision"
TEXT, MMPROJ, PNG = VISION / "lfm2vl-tiny.gguf", VISION / "lfm2vl-tiny.mmproj.gguf", VISION / "lfm2vl-tiny.png"
RECORDED = json.loads((VISION / "lfm2vl-tiny.embd.json").read_text())
TOLERANCE = 1e-3   # relative: the largest difference over the largest value
ALIGN, MIN_PIXELS, MAX_PIXELS = 32, 64 * 32 * 32, 256 * 32 * 32   # 16-pixel patches, 2x2 unshuffle


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def gradient(h: int, w: int, seed: int = 0) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 100 / (w + h)], axis=-1)
    return np.clip(base + np.random.default_rng(seed).integers(0, 30, base.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def projector():
    proj = load_projector(MMPROJ, n_embd_text=64)
    yield proj
    proj.close()


@pytest.fixture(scope="module")
def recorded() -> np.ndarray:
    return np.array(RECORDED["embeddings"], np.float64).reshape(RECORDED["n_tokens"], RECORDED["n_embd"])


def test_projector_reads_the_files_hyper_parameters(projector):
    c = projector.tower.cfg
    assert (projector.kind, c.patch_size, c.merge, c.align, c.n_merged) == ("lfm2", 16, 2, ALIGN, 128)
    assert (c.min_pixels, c.max_pixels, projector.n_embd) == (MIN_PIXELS, MAX_PIXELS, 64)
    assert not projector.attends_both_ways


@pytest.mark.parametrize("case, message", [("merge", "scale_factor = 1"), ("missing_mm1", "mm.1.weight")])
def test_bad_projectors_fail_typed(tmp_path, case, message):
    keys, drop = {"merge": ({"clip.vision.projector.scale_factor": (1, GGUFValueType.UINT32)}, ()),
                  "missing_mm1": ({}, ("mm.1.weight",))}[case]
    with pytest.raises(ModelError, match=message):
        load_projector(rewrite(tmp_path / "p.gguf", keys=keys, drop=drop, src=MMPROJ))


# ---------------------------------------------------------------- sizes (each checked live against libmtmd)

@pytest.mark.parametrize("size, resized", [((300, 200), (320, 224)), ((256, 256), (256, 256)),
                                           ((900, 640), (576, 416)), ((17, 23), (224, 320)),
                                           ((2000, 100), (2016, 96))])
def test_an_image_is_resized_to_whole_tokens_within_the_limits(size, resized):
    assert smart_size(*size, ALIGN, MIN_PIXELS, MAX_PIXELS) == resized


@pytest.mark.parametrize("size, grid", [((900, 640), (3, 2)), ((1300, 420), (3, 1)), ((600, 1000), (2, 3))])
def test_a_large_image_is_tiled_on_the_grid_nearest_its_aspect(size, grid):
    assert should_tile(*size, 16, ALIGN, MAX_PIXELS) and tile_grid(*size) == grid


@pytest.mark.parametrize("size", [(300, 200), (2000, 100), (700, 700)])
def test_a_smaller_image_is_not_tiled(size):
    assert not should_tile(*size, 16, ALIGN, MAX_PIXELS)


def test_a_tiled_image_has_mtmds_pieces(projector):
    pieces = projector.embed_pieces(image_png(gradient(640, 900)))
    text = [p if isinstance(p, str) else len(p) for p in pieces]
    tiles = [f"<|img_row_{r}_col_{c}|>" for r in (1, 2) for c in (1, 2, 3)]
    assert text == ["<|image_start|>", *[x for t in tiles for x in (t, 256)], "<|img_thumbnail|>", 18 * 13,
                    "<|image_end|>"]


def image_png(rgb: np.ndarray) -> bytes:
    import io

    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


# ---------------------------------------------------------------- the tower

def test_embeddings_match_llama_cpp(projector, recorded):
    ours = projector.embed(PNG.read_bytes())
    assert ours.shape == (70, 64) and RECORDED["blocks"] == [70]
    assert relative(ours, recorded) < TOLERANCE


@pytest.mark.parametrize("size", [(224, 320), (256, 256), (384, 160)])   # (height, width): whole tokens
def test_embeddings_match_the_float64_reference(projector, size):
    rgb = gradient(*size, seed=size[0])
    reference = vision_reference.lfm2_embeddings(MMPROJ, rgb)
    assert relative(projector.tower.encode_pixels(rgb), reference) < TOLERANCE


def test_the_reference_is_llama_cpps_tower_too(recorded):
    resized = image.resize(image.decode(PNG.read_bytes()), 320, 224, "bilinear")
    assert relative(recorded, vision_reference.lfm2_embeddings(MMPROJ, resized)) < TOLERANCE


@pytest.mark.parametrize("variant", vision_reference.LFM2_VARIANTS)
def test_a_wrong_tower_lands_far_from_llama_cpp(recorded, variant):
    resized = image.resize(image.decode(PNG.read_bytes()), 320, 224, "bilinear")
    assert relative(vision_reference.lfm2_embeddings(MMPROJ, resized, variant), recorded) > 10 * TOLERANCE


def test_same_bits_on_every_isa_and_thread_count(projector):
    rgb = gradient(224, 320)
    results = []
    for isa in available_isas():
        with forced_isa(isa):
            for threads in (1, 3):
                results.append((isa, threads, projector.tower.encode_pixels(rgb, Backend(threads))))
    for isa, threads, out in results[1:]:
        assert np.array_equal(out, results[0][2]), (isa, threads)


# ---------------------------------------------------------------- the image in the text sequence

@pytest.fixture(scope="module")
def llm():
    with LLM(TEXT, n_ctx=512, n_threads=2, mmproj=MMPROJ) as model:
        yield model


def our_prompt(llm):
    def first(piece: str) -> list[int]:
        return llm.tokenizer.encode(piece, add_special=True, parse_special=True)
    return encode_with_images(llm.tokenizer, first, RECORDED["prompt"].format(marker=MARKER), [PNG.read_bytes()],
                              llm.projector)


def first_top(llm, ids, spans) -> dict[int, float]:
    handle = llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True, top_logprobs=20,
                               images=spans)
    return dict(handle.result().logprobs[0].top)


def distance_to_recorded(top: dict[int, float]) -> float:
    """The largest difference of a recorded top-10 logit from ours, both relative to the best token's."""
    best, best_logit = RECORDED["top_logits"][0]
    return max(abs((top[t] - top[best]) - (v - best_logit)) if t in top else np.inf
               for t, v in RECORDED["top_logits"])


def test_the_prompt_is_cut_as_libmtmd_cuts_it(llm):
    ids, spans = our_prompt(llm)
    expected = [t for seg in RECORDED["segments"] for t in seg.get("tokens", [0] * seg.get("image", 0))]
    assert ids == expected and [len(r) for _, r in spans] == [70]


def test_first_token_logits_after_the_image_match_llama_cpp(llm):
    top = first_top(llm, *our_prompt(llm))
    assert next(iter(top)) == RECORDED["top_logits"][0][0]
    assert distance_to_recorded(top) < 0.05


def test_llama_cpps_rows_give_its_logits_and_both_ways_does_not(recorded):
    with LLM(TEXT, n_ctx=512, n_threads=2, mmproj=MMPROJ) as fresh:
        ids, spans = our_prompt(fresh)
        theirs = [(spans[0][0], recorded.astype(np.float32))]
        assert distance_to_recorded(first_top(fresh, ids, theirs)) < 1e-3
    with LLM(TEXT, n_ctx=512, n_threads=2, mmproj=MMPROJ) as fresh:   # nothing cached from a causal feed
        fresh.engine.images_both_ways = True
        assert distance_to_recorded(first_top(fresh, ids, theirs)) > 0.01


def test_a_chat_reuses_the_image_in_the_hybrid_text_model(llm):
    """LFM2's convolution layers keep a state: a second question about the same image
    resumes from a checkpoint past it and gives the bits of computing it afresh."""
    from pyengine.session import prepare_chat

    def ask(png: bytes, question: str):
        prepared = prepare_chat(llm, [{"role": "user", "content": question, "images": [png]}])
        result = llm.engine.submit(prepared.ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True,
                                   top_logprobs=8, images=prepared.images).result()
        return dict(result.logprobs[0].top), result, prepared

    first, _, prepared = ask(PNG.read_bytes(), "What is it?")
    (start, rows), = prepared.images
    again, done, _ = ask(PNG.read_bytes(), "What is it?")
    assert done.cached_tokens >= start + len(rows) and again == first
    other, done, _ = ask(image_png(gradient(200, 300, seed=3)), "What is it?")
    assert done.cached_tokens <= start and other != first
