"""Qwen2.5-VL: its vision tower (dynamic resolution, 2D rope, windowed attention, the
patch merger) against llama.cpp's libmtmd and a float64 reference, and the qwen2vl
text model's M-RoPE over an image's rows against llama.cpp's logits.

The synthetic model (tests/data/vision/qwen25vl-tiny*) and llama.cpp's recordings
come from scripts/make_synth_qwen25vl.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import vision_reference
from conftest import DATA, available_isas, forced_isa
from qwenvl_support import (chat_first_token, engine_matches_recording, prompt_logits, recorded_prompt,
                            text_rope)
from test_vision_gemma3 import new_forward, relative, rewrite, top_logit_distance
from gguf import GGUFValueType

from pyengine.errors import InvalidOptionError, ModelError, UnsupportedError
from pyengine.ml.context import Backend
from pyengine.vision import dynamic, image, qwen2vl
from pyengine.vision.projector import load_projector

VISION = DATA / "vision"
MMPROJ = VISION / "qwen25vl-tiny.mmproj.gguf"
TEXT = VISION / "qwen25vl-tiny.gguf"
RECORDED = json.loads((VISION / "qwen25vl-tiny.embd.json").read_text())["images"]
TOLERANCE = 1e-3   # relative: the largest difference over the largest value


def pixels(name: str) -> np.ndarray:
    return image.decode((VISION / RECORDED[name]["image"]).read_bytes())


def llama_rows(name: str) -> np.ndarray:
    return np.array(RECORDED[name]["embeddings"], np.float64)


@pytest.fixture(scope="module")
def projector():
    proj = load_projector(MMPROJ, n_embd_text=64)
    yield proj
    proj.close()


# ---------------------------------------------------------------- preprocessing

@pytest.mark.parametrize("size, want", [
    ((128, 128), (128, 128)), ((64, 176), (64, 176)),   # already multiples of 16: kept
    ((100, 150), (96, 144)),                            # rounded to the nearest multiples
    ((10, 10), (48, 48)),                               # below 8 tokens: scaled up
    ((4000, 4000), (1024, 1024)), ((4100, 4000), (1024, 1008)),   # above 4096 tokens: scaled down
])
def test_target_size_is_clip_cpps(size, want):
    assert dynamic.target_size(*size, align=16) == want


def test_patches_are_in_merge_order_and_remember_their_grid(projector):
    patches = projector.tower.preprocess(pixels("wide"))
    assert patches.grid == (8, 22) and patches.shape == (8 * 22, 3 * 8 * 8)
    assert projector.tower.token_grid(patches) == (4, 11)
    pos = dynamic.patch_positions(4, 6)
    assert pos[:6, :2].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3]]


def test_resize_takes_the_width_first_as_llama_cpp_does():
    from PIL import Image

    rgb = pixels("tall")
    two_pass = np.asarray(dynamic.resize_two_pass(Image.fromarray(rgb), 80, 244)).astype(int)
    one_call = np.asarray(Image.fromarray(rgb).resize((80, 244), Image.BICUBIC)).astype(int)
    assert np.abs(two_pass - one_call).max() > 0   # the order of the passes shows on this image
    padded = dynamic.resize_padded(rgb, 256, 80)
    assert np.array_equal(padded[6:250], two_pass) and not padded[:6].any() and not padded[250:].any()


def test_window_mask_cuts_112_pixel_windows():
    mask = qwen2vl.window_mask(2 * 2, 2 * 9, patch=8)      # 2 x 9 tokens: windows of 7 columns
    seen = mask[0] == 0                                     # the first token's first patch
    assert seen.sum() == 4 * 2 * 7 and mask[0, 4 * 7] < -1e29 and (mask == mask.T).all()


# ---------------------------------------------------------------- the tower

@pytest.mark.parametrize("name, grid", [("square", (8, 8)), ("wide", (4, 11)), ("odd", (6, 9)), ("tall", (16, 5))])
def test_embeddings_match_llama_cpp(projector, name, grid):
    """Square, non-square (dynamic resolution: 4 x 11 tokens) and images mtmd resizes
    and pads (100 x 150 -> 96 x 144; 253 x 83 -> 244 x 80 in 256 x 80, where Pillow's
    one-call resize would be a few levels off llama.cpp's width-first passes); the rows
    come as their token grid."""
    ours = projector.embed((VISION / RECORDED[name]["image"]).read_bytes())
    assert ours.shape == (*grid, 64) and ours.dtype == np.float32
    assert list(grid) == RECORDED[name]["segments"][1]["grid"]
    assert relative(ours.reshape(-1, 64), llama_rows(name)) < TOLERANCE


@pytest.mark.parametrize("name", ["square", "wide"])
def test_embeddings_match_the_float64_reference(projector, name):
    rgb = pixels(name)
    reference = vision_reference.qwen25vl_embeddings(MMPROJ, rgb)
    assert relative(projector.embed_pixels(rgb).reshape(-1, 64), reference) < TOLERANCE
    assert relative(llama_rows(name), reference) < TOLERANCE   # the reference is llama.cpp's tower too


@pytest.mark.parametrize("variant", vision_reference.QWEN25VL_VARIANTS)
def test_a_wrong_tower_lands_far_from_llama_cpp(variant):
    wrong = vision_reference.qwen25vl_embeddings(MMPROJ, pixels("square"), variant)
    assert relative(wrong, llama_rows("square")) > 50 * TOLERANCE


def test_same_bits_on_every_isa_and_thread_count(projector):
    patches = projector.tower.preprocess(pixels("wide"))
    results = []
    for isa in available_isas():
        with forced_isa(isa):
            for threads in (1, 3):
                results.append((isa, threads, projector.tower.encode(patches, Backend(threads))))
    for isa, threads, out in results[1:]:
        assert np.array_equal(out, results[0][2]), (isa, threads)


@pytest.mark.parametrize("case, error, message", [
    ("no_silu", UnsupportedError, "clip.use_silu"),
    ("no_wa_pattern", ModelError, "n_wa_pattern"),
    ("merge", UnsupportedError, "spatial merge 3"),
    ("missing_frame", ModelError, r"v\.patch_embd\.weight\.1"),
])
def test_bad_projectors_fail_typed(tmp_path, case, error, message):
    B, U = GGUFValueType.BOOL, GGUFValueType.UINT32
    kw = {"no_silu": dict(keys={"clip.use_silu": (False, B)}),
          "no_wa_pattern": dict(drop_keys=("clip.vision.n_wa_pattern",)),
          "merge": dict(keys={"clip.vision.spatial_merge_size": (3, U)}),
          "missing_frame": dict(drop=("v.patch_embd.weight.1",))}[case]
    with pytest.raises(error, match=message):
        load_projector(rewrite(tmp_path / "p.gguf", src=MMPROJ, **kw))


# ---------------------------------------------------------------- the image in the text sequence

@pytest.fixture(scope="module")
def text_model():
    from pyengine.gguf import GGUFFile
    from pyengine.models import load_model

    f = GGUFFile(TEXT)
    yield load_model(f)
    f.close()


@pytest.mark.parametrize("name", ["square", "wide"])
def test_first_token_logits_after_the_image_match_llama_cpp(text_model, projector, name):
    d = RECORDED[name]
    assert d["segments"][1]["n_pos"] == max(d["segments"][1]["grid"])
    rows = projector.embed((VISION / d["image"]).read_bytes()).reshape(-1, 64)
    logits = prompt_logits(new_forward(text_model), d["segments"], rows)
    assert top_logit_distance(logits, d["top_logits"]) < 0.05
    assert [int(t) for t in np.argsort(-logits, kind="stable")[:3]] == [t for t, _ in d["top_logits"][:3]]


@pytest.mark.parametrize("wrong", ["sections_ignored", "positions_not_skipped"])
def test_an_image_placed_wrongly_lands_far_from_llama_cpp(text_model, wrong):
    d = RECORDED["wide"]
    logits = prompt_logits(new_forward(text_model), d["segments"], llama_rows("wide").astype(np.float32), wrong)
    assert top_logit_distance(logits, d["top_logits"]) > 0.5


def test_text_positions_are_the_plain_rope_bit_for_bit(text_model):
    """Without images every stream holds the token's position (the default)."""
    ids = np.array([5, 77, 300, 12, 9])
    positions, seqs, out = np.arange(5), np.zeros(5, np.int64), np.arange(5)
    default = new_forward(text_model)(ids, positions, seqs, out)
    given = new_forward(text_model)(ids, positions, seqs, out, rope_positions=text_rope(0, 5))
    assert np.array_equal(default, given)
    with pytest.raises(InvalidOptionError, match=r"rope_positions must be \[5, 4\]"):
        new_forward(text_model)(ids, positions, seqs, out, rope_positions=text_rope(0, 5)[:, :3])


# ---------------------------------------------------------------- through the engine and the chat API

@pytest.fixture(scope="module")
def llm():
    from pyengine.api import LLM

    with LLM(TEXT, n_ctx=512, n_threads=2, mmproj=MMPROJ) as model:
        yield model


@pytest.mark.parametrize("name", ["wide", "odd"])
def test_engine_places_the_image_by_m_rope_and_matches_llama_cpp(llm, name):
    """The engine feeds the grid rows causally at (t, t + row, t + column) and the text
    after them from t + max(rows, columns); the first token's log-probabilities differ
    from llama.cpp's logits by one constant."""
    assert not llm.projector.attends_both_ways and llm.engine.images_both_ways is False
    engine_matches_recording(llm, RECORDED[name], llm.projector.embed((VISION / RECORDED[name]["image"]).read_bytes()))


def test_decoding_after_an_image_goes_on_from_the_shifted_positions(llm, text_model):
    """Three greedy tokens through the engine (a decode step's rope positions shifted by
    the image) equal a Forward fed the same way by hand."""
    from pyengine.sample import SamplingOptions

    name = "wide"
    rows = llm.projector.embed((VISION / RECORDED[name]["image"]).read_bytes())
    ids, images = recorded_prompt(RECORDED[name]["segments"], rows)
    got = llm.engine.submit(ids, SamplingOptions(temperature=0), max_tokens=3, images=images).result().tokens
    segments = [dict(seg) for seg in RECORDED[name]["segments"]]
    want = []
    for _ in range(3):
        want.append(int(np.argmax(prompt_logits(new_forward(text_model), segments, rows.reshape(-1, 64)))))
        segments[-1] = {"tokens": segments[-1]["tokens"] + [want[-1]]}
    assert list(got) == want


def test_chat_with_an_image_answers_and_different_images_differ(llm):
    square, wide = [(VISION / RECORDED[n]["image"]).read_bytes() for n in ("square", "wide")]
    assert chat_first_token(llm, square) != chat_first_token(llm, wide)
    assert chat_first_token(llm, square) == chat_first_token(llm, square)
