"""Qwen2-VL: its vision tower (LayerNorm blocks with quick GELU, every block over every
patch, the 2D rope and the patch merger) against llama.cpp's libmtmd and a float64
reference, and its rows in the qwen2vl text model (the one Qwen2.5-VL's tests use)
against llama.cpp's logits.

The mmproj (tests/data/vision/qwen2vl-tiny*) and llama.cpp's recordings come from
scripts/make_synth_qwen2vl.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import vision_reference
from conftest import DATA, available_isas, forced_isa
from qwenvl_support import chat_first_token, engine_matches_recording, prompt_logits
from gguf import GGUFValueType
from test_vision_gemma3 import new_forward, relative, rewrite, top_logit_distance

from pyengine.errors import UnsupportedError
from pyengine.ml.context import Backend
from pyengine.vision import image
from pyengine.vision.projector import load_projector

VISION = DATA / "vision"
MMPROJ = VISION / "qwen2vl-tiny.mmproj.gguf"
TEXT = VISION / "qwen25vl-tiny.gguf"
RECORDED = json.loads((VISION / "qwen2vl-tiny.embd.json").read_text())["images"]
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


def test_projector_reads_a_quick_gelu_tower_without_windows(projector):
    c = projector.tower.cfg
    assert (projector.kind, c.n_layer, c.quick_gelu, projector.tower.pre_ln) == ("qwen2vl_merger", 2, True, None)


@pytest.mark.parametrize("name, grid", [("square", (4, 4)), ("wide", (3, 11)), ("odd", (6, 9))])
def test_embeddings_match_llama_cpp(projector, name, grid):
    """Measured: 5.6e-4 / 5.7e-4 / 4.9e-4 (llama.cpp's quick GELU reads a half-precision
    table; ours computes it)."""
    ours = projector.embed((VISION / RECORDED[name]["image"]).read_bytes())
    assert ours.shape == (*grid, 64) and ours.dtype == np.float32
    assert list(grid) == RECORDED[name]["segments"][1]["grid"]
    assert relative(ours.reshape(-1, 64), llama_rows(name)) < TOLERANCE


@pytest.mark.parametrize("name", ["square", "wide"])
def test_embeddings_match_the_float64_reference(projector, name):
    rgb = pixels(name)
    reference = vision_reference.qwen2vl_embeddings(MMPROJ, rgb)
    assert relative(projector.embed_pixels(rgb).reshape(-1, 64), reference) < TOLERANCE
    assert relative(llama_rows(name), reference) < TOLERANCE   # the reference is llama.cpp's tower too


@pytest.mark.parametrize("variant", vision_reference.QWEN2VL_VARIANTS)
def test_a_wrong_tower_lands_far_from_llama_cpp(variant):
    """Measured: 0.20-1.8; GELU for quick GELU 7.7e-3 (the two differ by at most 0.02 at
    any input), fourteen times as far as ours."""
    wrong = vision_reference.qwen2vl_embeddings(MMPROJ, pixels("wide"), variant)
    far = 5 if variant == "gelu_not_quick" else 50
    assert relative(wrong, llama_rows("wide")) > far * TOLERANCE


def test_same_bits_on_every_isa_and_thread_count(projector):
    patches = projector.tower.preprocess(pixels("odd"))
    results = []
    for isa in available_isas():
        with forced_isa(isa):
            for threads in (1, 3):
                results.append((isa, threads, projector.tower.encode(patches, Backend(threads))))
    for isa, threads, out in results[1:]:
        assert np.array_equal(out, results[0][2]), (isa, threads)


def test_a_file_that_says_gelu_gets_gelu(tmp_path):
    gelu = load_projector(rewrite(tmp_path / "p.gguf", src=MMPROJ, keys={"clip.use_gelu": (True, GGUFValueType.BOOL)}))
    assert gelu.tower.cfg.quick_gelu is False
    got = gelu.embed_pixels(pixels("wide")).reshape(-1, 64)
    want = vision_reference.qwen2vl_embeddings(MMPROJ, pixels("wide"), "gelu_not_quick")
    assert relative(got, want) < TOLERANCE
    gelu.close()


@pytest.mark.parametrize("case, message", [
    ("silu", "clip.use_silu"),
    ("windows", "n_wa_pattern"),
])
def test_unsupported_towers_fail_typed(tmp_path, case, message):
    keys = {"silu": {"clip.use_silu": (True, GGUFValueType.BOOL)},
            "windows": {"clip.vision.n_wa_pattern": (2, GGUFValueType.UINT32)}}[case]
    with pytest.raises(UnsupportedError, match=message):
        load_projector(rewrite(tmp_path / "p.gguf", src=MMPROJ, keys=keys))


# ---------------------------------------------------------------- the image in the text sequence

@pytest.fixture(scope="module")
def text_model():
    from pyengine.gguf import GGUFFile
    from pyengine.models import load_model

    f = GGUFFile(TEXT)
    yield load_model(f)
    f.close()


@pytest.mark.parametrize("name", ["square", "wide", "odd"])
def test_first_token_logits_after_the_image_match_llama_cpp(text_model, projector, name):
    d = RECORDED[name]
    rows = projector.embed((VISION / d["image"]).read_bytes()).reshape(-1, 64)
    logits = prompt_logits(new_forward(text_model), d["segments"], rows)
    assert top_logit_distance(logits, d["top_logits"]) < 0.05
    assert int(np.argmax(logits)) == d["top_logits"][0][0]


def test_the_engine_and_the_chat_api_take_the_image():
    """Through the engine on the recorded prompt, as llama.cpp; through the chat API's
    image_url (the chat template's prompt was not recorded), two images answer apart."""
    from pyengine.api import LLM

    with LLM(TEXT, n_ctx=512, n_threads=2, mmproj=MMPROJ) as llm:
        square, wide = [(VISION / RECORDED[n]["image"]).read_bytes() for n in ("square", "wide")]
        engine_matches_recording(llm, RECORDED["wide"], llm.projector.embed(wide))
        assert chat_first_token(llm, square) != chat_first_token(llm, wide)
