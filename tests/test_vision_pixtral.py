"""Pixtral's vision tower (projector type pixtral: Pixtral-12B, and with its 2x2 patch
merger Mistral Small 3.1) against llama.cpp's libmtmd and a float64 reference, and its
image in the text sequence (causal rows, [IMG_BREAK] rows, [IMG_END] after).

The synthetic models (tests/data/vision/pixtral-tiny*) and llama.cpp's embeddings of
their test images come from scripts/make_synth_pixtral.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import vision_reference
from conftest import DATA, available_isas, forced_isa
from test_vision_gemma3 import (
    GGUFValueType,
    encoded,
    new_forward,
    noise,
    prompt_logits,
    relative,
    rewrite,
    top_logit_distance,
)

from pyengine.errors import ImageError, ModelError, UnsupportedError
from pyengine.ml.context import Backend
from pyengine.vision import image, pixtral
from pyengine.vision.projector import load_projector

VISION = DATA / "vision"
TEXT = VISION / "pixtral-tiny.gguf"
MMPROJ, MERGE_MMPROJ = VISION / "pixtral-tiny.mmproj.gguf", VISION / "pixtral-tiny-merge.mmproj.gguf"
RECORDED = json.loads((VISION / "pixtral-tiny.embd.json").read_text())
CASES = {(c["mmproj"], c["image"]): c for c in RECORDED["cases"]}
TOLERANCE = 1e-3   # relative: the largest difference over the largest value


def case_id(case) -> str:
    return f"{case[0].split('.')[0]}:{case[1]}"


@pytest.fixture(scope="module")
def projectors():
    loaded = {path.name: load_projector(path, n_embd_text=64) for path in (MMPROJ, MERGE_MMPROJ)}
    yield loaded
    for proj in loaded.values():
        proj.close()


def recorded_rows(case) -> np.ndarray:
    return np.array(CASES[case]["embeddings"], np.float64)


def rgb_of(case) -> np.ndarray:
    return image.decode((VISION / case[1]).read_bytes())


def test_projector_reads_the_files_hyper_parameters(projectors):
    plain, merged = projectors[MMPROJ.name], projectors[MERGE_MMPROJ.name]
    assert (plain.kind, plain.tower.cfg.merge, plain.tower.cfg.patch_size) == ("pixtral", 1, 4)
    assert (merged.kind, merged.tower.cfg.merge, merged.n_embd) == ("pixtral", 2, 64)
    assert (plain.tower.IMAGE_BEGIN, plain.tower.IMAGE_END, plain.attends_both_ways) == ("", "[IMG_END]", False)


@pytest.mark.parametrize("case", sorted(CASES), ids=case_id)
def test_embeddings_match_llama_cpp(projectors, case):
    """40x24 (a multiple of the patches: not resized, a non-square grid), 50x30 (resized
    up to 52x32 with padding; with the merger down to 48x29 in 48x32), and the merger's
    2x2 blocks; [IMG_BREAK] rows included."""
    ours = projectors[case[0]].embed((VISION / case[1]).read_bytes())
    want = recorded_rows(case)
    assert ours.shape == want.shape and ours.dtype == np.float32
    assert relative(ours, want) < TOLERANCE


def test_token_counts_follow_the_grid(projectors):
    # 40x24 in 4-pixel patches: 6 rows of 10, a break after each row but the last
    assert CASES[(MMPROJ.name, "pixtral-tiny.png")]["n_tokens"] == 6 * 10 + 5
    assert CASES[(MMPROJ.name, "pixtral-tiny-odd.png")]["n_tokens"] == 8 * 13 + 7     # 52x32
    assert CASES[(MERGE_MMPROJ.name, "pixtral-tiny.png")]["n_tokens"] == 3 * 5 + 2   # merged 2x2
    assert CASES[(MERGE_MMPROJ.name, "pixtral-tiny-odd.png")]["n_tokens"] == 4 * 6 + 3   # 48x32
    assert CASES[(MERGE_MMPROJ.name, "pixtral-tiny-tall.png")]["n_tokens"] == 8 * 2 + 7   # 16x64
    rows = projectors[MMPROJ.name].embed(encoded(noise(24, 40, seed=3), "PNG"))
    brk = np.frombuffer(np.ascontiguousarray(projectors[MMPROJ.name].tower.img_break.weight.data).tobytes(),
                        np.float32)
    assert all(np.array_equal(rows[r * 11 + 10], brk) for r in range(5))


@pytest.mark.parametrize("case", sorted(CASES), ids=case_id)
def test_embeddings_match_the_float64_reference(projectors, case):
    proj = projectors[case[0]]
    rgb = rgb_of(case)
    width, height = pixtral.target_size(rgb.shape[1], rgb.shape[0], proj.tower.cfg)
    reference = vision_reference.pixtral_embeddings(VISION / case[0], pixtral.resize_fit(rgb, width, height))
    assert relative(proj.embed_pixels(rgb), reference) < TOLERANCE
    assert relative(recorded_rows(case), reference) < TOLERANCE   # the reference is llama.cpp's tower too


@pytest.mark.parametrize("variant", vision_reference.PIXTRAL_VARIANTS)
def test_a_wrong_tower_lands_far_from_llama_cpp(variant):
    case = (MERGE_MMPROJ.name if variant == "merger_channel_order" else MMPROJ.name, "pixtral-tiny.png")
    wrong = vision_reference.pixtral_embeddings(VISION / case[0], rgb_of(case), variant)
    want = recorded_rows(case)
    if wrong.shape != want.shape:   # no [IMG_BREAK]s: the image's rows land one row off from the second on
        wrong = wrong[:len(want)]
        want = want[:len(wrong)]
    assert relative(wrong, want) > 50 * TOLERANCE


def test_pillows_own_resize_lands_outside_the_bound(projectors):
    """llama.cpp's resampler is Pillow's algorithm, but this Pillow's bicubic gives other
    pixels on the merger's 18x65 -> 16x58: enough to leave the bound."""
    from PIL import Image

    proj, case = projectors[MERGE_MMPROJ.name], (MERGE_MMPROJ.name, "pixtral-tiny-tall.png")
    rgb = rgb_of(case)
    padded = np.zeros((64, 16, 3), np.uint8)
    padded[3:61] = np.asarray(Image.fromarray(rgb).resize((16, 58), Image.BICUBIC))
    ours = pixtral.resize_fit(rgb, 16, 64)
    assert not ours[:3].any() and not ours[61:].any()                   # the same black rows
    assert 0 < np.abs(ours.astype(int) - padded).max() <= 3             # a few levels apart
    c = proj.tower.cfg
    planes = image.normalize(padded, c.image_mean, c.image_std)
    pillow = proj.tower.encode(pixtral.Pixels(image.patches(planes, 4), 16, 4))
    assert relative(pillow, recorded_rows(case)) > 2 * TOLERANCE


@pytest.mark.parametrize("size, want", [
    ((40, 24), (40, 24)),        # already aligned
    ((50, 30), (52, 32)),        # rounded to the patch side
    ((5, 3), (16, 12)),          # too few tokens: scaled up (ceiled) to at least 8
    ((1000, 200), (284, 56)),    # too many: scaled down (floored) under 1024 tokens
])
def test_target_sizes_keep_the_aspect_within_the_token_limits(projectors, size, want):
    assert pixtral.target_size(*size, projectors[MMPROJ.name].tower.cfg) == want


def test_other_images_and_sizes_give_other_embeddings(projectors):
    proj = projectors[MMPROJ.name]
    a = proj.embed((VISION / "pixtral-tiny.png").read_bytes())
    b = proj.embed(encoded(noise(24, 40, seed=5), "PNG"))
    tall = proj.embed(encoded(noise(40, 24, seed=6), "PNG"))       # 10 rows of 6: another graph
    assert relative(a, b) > 0.05 and tall.shape == (10 * 7 - 1, 64)
    again = proj.embed_pixels(image.decode((VISION / "pixtral-tiny.png").read_bytes()))   # the kept graph, rerun
    assert np.array_equal(again, a)


def test_same_bits_on_every_isa_and_thread_count(projectors):
    proj = projectors[MERGE_MMPROJ.name]
    pixels = proj.tower.preprocess(rgb_of((MERGE_MMPROJ.name, "pixtral-tiny.png")))
    results = []
    for isa in available_isas():
        with forced_isa(isa):
            for threads in (1, 3):
                results.append((isa, threads, proj.tower.encode(pixels, Backend(threads))))
    for isa, threads, out in results[1:]:
        assert np.array_equal(out, results[0][2]), (isa, threads)


def test_bad_pixtral_projectors_and_inputs_fail_typed(tmp_path, projectors):
    B, U = GGUFValueType.BOOL, GGUFValueType.UINT32
    with pytest.raises(UnsupportedError, match="SwiGLU"):
        load_projector(rewrite(tmp_path / "a.gguf", keys={"clip.use_silu": (False, B)}, src=MMPROJ))
    with pytest.raises(ModelError, match="spatial_merge_size 2 needs mm.patch_merger"):
        load_projector(rewrite(tmp_path / "b.gguf", drop=("mm.patch_merger.weight",), src=MERGE_MMPROJ))
    with pytest.raises(ModelError, match="spatial_merge_size = 9"):
        load_projector(rewrite(tmp_path / "d.gguf", keys={"clip.vision.spatial_merge_size": (9, U)}, src=MERGE_MMPROJ))
    with pytest.raises(ModelError, match="v.token_embd.img_break"):
        load_projector(rewrite(tmp_path / "c.gguf", drop=("v.token_embd.img_break",), src=MMPROJ))
    with pytest.raises(ImageError, match="Pixels"):
        projectors[MMPROJ.name].tower.encode(np.zeros((60, 48), np.float32))


# ---------------------------------------------------------------- the image in the text sequence

@pytest.fixture(scope="module")
def text_model():
    from pyengine.gguf import GGUFFile
    from pyengine.models import load_model

    f = GGUFFile(TEXT)
    yield load_model(f)
    f.close()


@pytest.mark.parametrize("case", sorted(CASES), ids=case_id)
def test_first_token_logits_after_the_image_match_llama_cpp(text_model, projectors, case):
    d = CASES[case]
    rows = projectors[case[0]].embed((VISION / case[1]).read_bytes())
    logits = prompt_logits(new_forward(text_model, 256), d["segments"], rows, both_ways=False)   # 139 positions
    assert top_logit_distance(logits, d["top_logits"]) < 0.05
    assert int(np.argmax(logits)) == d["top_logits"][0][0]   # (the odd image's 3rd and 4th are a near tie)


def test_an_image_attended_both_ways_lands_far_from_llama_cpp(text_model):
    case = (MMPROJ.name, "pixtral-tiny.png")
    d = CASES[case]
    logits = prompt_logits(new_forward(text_model), d["segments"], recorded_rows(case).astype(np.float32))
    assert top_logit_distance(logits, d["top_logits"]) > 0.1


def test_the_prompt_places_img_end_after_the_rows(projectors):
    from pyengine.gguf import GGUFFile
    from pyengine.tokenizer import Tokenizer
    from pyengine.vision.prompt import MARKER, encode_with_images

    d = CASES[(MMPROJ.name, "pixtral-tiny.png")]
    f = GGUFFile(TEXT)
    tok = Tokenizer.from_gguf(f)
    text = d_prompt = RECORDED["prompt"].format(marker=MARKER)
    ids, spans = encode_with_images(tok, lambda s: tok.encode(s, add_special=True, parse_special=True), text,
                                    [(VISION / "pixtral-tiny.png").read_bytes()], projectors[MMPROJ.name])
    f.close()
    before, after = d["segments"][0]["tokens"], d["segments"][2]["tokens"]
    assert d_prompt and ids[:len(before)] == before and ids[len(before) + d["n_tokens"]:] == after
    assert [(start, len(rows)) for start, rows in spans] == [(len(before), d["n_tokens"])]


# ---------------------------------------------------------------- through LLM and the engine

@pytest.fixture(scope="module")
def llm():
    from pyengine.api import LLM

    with LLM(TEXT, n_ctx=256, n_threads=2, mmproj=MMPROJ) as model:
        yield model


def test_engine_feeds_the_image_causally_and_matches_llama_cpp(llm):
    from pyengine.sample import SamplingOptions

    case = (MMPROJ.name, "pixtral-tiny-odd.png")
    d = CASES[case]
    rows = llm.projector.embed((VISION / case[1]).read_bytes())
    ids, images = [], []
    for seg in d["segments"]:
        if "tokens" in seg:
            ids += seg["tokens"]
        else:
            images.append((len(ids), rows))
            ids += [0] * seg["image"]
    assert llm.engine.images_both_ways is False
    handle = llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=1, logprobs=True, top_logprobs=10,
                               images=images)
    top = dict(handle.result().logprobs[0].top)
    best, best_logit = d["top_logits"][0]
    assert next(iter(top)) == best
    shared = [(token, logit) for token, logit in d["top_logits"] if token in top]
    assert len(shared) >= 9   # the 10th and 11th are 0.01 apart
    for token, logit in shared:   # log-probabilities are the logits less one constant
        assert abs((top[token] - top[best]) - (logit - best_logit)) < 0.05


def test_chat_with_images_of_other_sizes(llm):
    """A chat's image takes as many positions as its grid has tokens and breaks: 40x24 is
    6 rows of 10 (65 with the breaks), 20x56 14 rows of 5 (83)."""
    import base64

    def chat(png: bytes) -> dict:
        return llm.chat([{"role": "user", "content": "What is this?", "images": [base64.b64encode(png).decode()]}],
                        max_tokens=2, temperature=0)

    wide, tall = chat(encoded(noise(24, 40, seed=7), "PNG")), chat(encoded(noise(56, 20, seed=8), "PNG"))
    assert tall["prompt_eval_count"] - wide["prompt_eval_count"] == 83 - 65
    assert wide["eval_count"] == tall["eval_count"] == 2
