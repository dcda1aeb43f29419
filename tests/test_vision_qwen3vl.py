"""Qwen3-VL: its vision tower (dynamic resolution, learned positions resized to the
patch grid, deepstack mergers) against llama.cpp's libmtmd and a float64 reference,
and the qwen3vl text model (interleaved M-RoPE, deepstack pieces added to the first
layers' outputs) over an image's rows against llama.cpp's logits.

The synthetic model (tests/data/vision/qwen3vl-tiny*) and llama.cpp's recordings
come from scripts/make_synth_qwen3vl.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import vision_reference
from conftest import DATA, available_isas, forced_isa
from qwenvl_support import chat_first_token, engine_matches_recording, prompt_logits, recorded_prompt
from gguf import GGUFValueType
from test_vision_gemma3 import new_forward, relative, rewrite, top_logit_distance

from pyengine.errors import InvalidOptionError, ModelError, UnsupportedError
from pyengine.ml.context import Backend
from pyengine.sample import SamplingOptions
from pyengine.vision import dynamic, image, qwen3vl
from pyengine.vision.projector import load_projector

VISION = DATA / "vision"
MMPROJ = VISION / "qwen3vl-tiny.mmproj.gguf"
TEXT = VISION / "qwen3vl-tiny.gguf"
RECORDED = json.loads((VISION / "qwen3vl-tiny.embd.json").read_text())["images"]
N_EMBD, N_ROW = 64, 3 * 64   # the text model's width; an image row: the merger's output and 2 deepstack pieces
TOLERANCE = 1e-3   # relative: the largest difference over the largest value


def pixels(name: str) -> np.ndarray:
    return image.decode((VISION / RECORDED[name]["image"]).read_bytes())


def llama_rows(name: str) -> np.ndarray:
    """libmtmd's rows as their token grid [n_rows, n_columns, 192]."""
    return np.array(RECORDED[name]["embeddings"], np.float64).reshape(*RECORDED[name]["segments"][1]["grid"], N_ROW)


@pytest.fixture(scope="module")
def projector():
    proj = load_projector(MMPROJ, n_embd_text=N_ROW)
    yield proj
    proj.close()


# ---------------------------------------------------------------- the tower

def test_projector_reads_the_deepstack_blocks(projector):
    c = projector.tower.cfg
    assert (projector.kind, c.n_layer, c.n_deepstack, projector.n_embd) == ("qwen3vl_merger", 3, 2, N_ROW)
    assert [m.present for m in projector.tower.deepstack] == [True, False, True]


def test_positions_are_the_learned_grid_resized_with_corners_aligned(projector):
    table = np.asarray(projector.tower.position_embd.weight.data).view(np.float32).reshape(8, 8, 32)
    assert np.array_equal(projector.tower.positions(8, 8), dynamic.merge_order(table.reshape(64, 32), 8, 8))
    wide = projector.tower.positions(6, 22)                       # the wide image's patch grid
    ty, tx = np.divmod(np.arange(6 * 22), 22)
    where = dynamic.merge_order(np.stack([ty, tx], axis=1), 6, 22).tolist()   # each row's patch
    for (y, x), (ty, tx) in [((0, 0), (0, 0)), ((5, 21), (7, 7)), ((0, 21), (0, 7)), ((5, 0), (7, 0))]:
        assert np.allclose(wide[where.index([y, x])], table[ty, tx], atol=1e-6)   # the corners land on the table's
    weights = qwen3vl.corner_weights(8, 22)
    assert np.allclose(weights.sum(axis=1), 1) and weights[0, 0] == 1 and weights[-1, -1] == 1


@pytest.mark.parametrize("name, grid", [("square", (4, 4)), ("wide", (3, 11)), ("odd", (6, 9))])
def test_embeddings_match_llama_cpp(projector, name, grid):
    """The position grid as it is (square), resized (3 x 11 tokens) and an image mtmd
    resizes and pads (100 x 150 -> 96 x 144); each row the merger's output and the
    deepstack pieces after blocks 0 and 2."""
    ours = projector.embed((VISION / RECORDED[name]["image"]).read_bytes())
    assert ours.shape == (*grid, N_ROW) and ours.dtype == np.float32
    assert list(grid) == RECORDED[name]["segments"][1]["grid"]
    assert relative(ours, llama_rows(name)) < TOLERANCE
    for piece in range(3):   # each piece on its own: none is small beside the others
        part = slice(piece * N_EMBD, (piece + 1) * N_EMBD)
        assert relative(ours[..., part], llama_rows(name)[..., part]) < TOLERANCE


@pytest.mark.parametrize("name", ["square", "wide"])
def test_embeddings_match_the_float64_reference(projector, name):
    rgb = pixels(name)
    reference = vision_reference.qwen3vl_embeddings(MMPROJ, rgb)
    assert relative(projector.embed_pixels(rgb).reshape(-1, N_ROW), reference) < TOLERANCE
    assert relative(llama_rows(name).reshape(-1, N_ROW), reference) < TOLERANCE   # the reference is llama.cpp's too


@pytest.mark.parametrize("variant", vision_reference.QWEN3VL_VARIANTS)
def test_a_wrong_tower_lands_far_from_llama_cpp(variant):
    wrong = vision_reference.qwen3vl_embeddings(MMPROJ, pixels("wide"), variant)
    assert relative(wrong, llama_rows("wide").reshape(-1, N_ROW)) > 50 * TOLERANCE


def test_same_bits_on_every_isa_and_thread_count(projector):
    patches = projector.tower.preprocess(pixels("odd"))
    results = []
    for isa in available_isas():
        with forced_isa(isa):
            for threads in (1, 3):
                results.append((isa, threads, projector.tower.encode(patches, Backend(threads))))
    for isa, threads, out in results[1:]:
        assert np.array_equal(out, results[0][2]), (isa, threads)


@pytest.mark.parametrize("case, error, message", [
    ("no_gelu", UnsupportedError, "clip.use_gelu"),
    ("deepstack_part", ModelError, r"v\.deepstack\.0 needs its norm, fc1 and fc2"),
    ("positions_not_square", ModelError, r"v\.position_embd\.weight must be \[n_embd, a square number\]"),
    ("missing_frame", ModelError, r"v\.patch_embd\.weight\.1"),
    ("merge", UnsupportedError, "spatial merge 3"),
])
def test_bad_projectors_fail_typed(tmp_path, case, error, message):
    kw = {"no_gelu": dict(keys={"clip.use_gelu": (False, GGUFValueType.BOOL)}),
          "deepstack_part": dict(drop=("v.deepstack.0.fc2.weight",)),
          "positions_not_square": dict(replace={"v.position_embd.weight": np.zeros((60, 32), np.float32)}),
          "missing_frame": dict(drop=("v.patch_embd.weight.1",)),
          "merge": dict(keys={"clip.vision.spatial_merge_size": (3, GGUFValueType.UINT32)})}[case]
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


def test_text_model_reads_sections_and_deepstack(text_model):
    c = text_model.cfg
    assert (c.rope_sections, c.n_deepstack, c.n_embd_input) == ((8, 4, 4, 0), 2, N_ROW)


@pytest.mark.parametrize("name", ["square", "wide", "odd"])
def test_first_token_logits_after_the_image_match_llama_cpp(text_model, projector, name):
    d = RECORDED[name]
    rows = projector.embed((VISION / d["image"]).read_bytes()).reshape(-1, N_ROW)
    logits = prompt_logits(new_forward(text_model), d["segments"], rows)
    assert top_logit_distance(logits, d["top_logits"]) < 0.05
    assert int(np.argmax(logits)) == d["top_logits"][0][0]


@pytest.mark.parametrize("wrong", ["sections_ignored", "positions_not_skipped", "deepstack_dropped",
                                   "deepstack_shifted", "runs_of_pairs"])
def test_an_image_placed_or_stacked_wrongly_lands_far_from_llama_cpp(text_model, wrong, monkeypatch):
    """Measured: 0.16-0.17 (a 3-row image's rows at text positions; Qwen2-VL's runs of pairs),
    0.62-1.14 for the rest."""
    from pyengine.ml.context import ROPE_MROPE
    from pyengine.models.qwen3vl import Qwen3VLConfig

    d = RECORDED["wide"]
    rows = llama_rows("wide").reshape(-1, N_ROW).astype(np.float32)
    assert top_logit_distance(prompt_logits(new_forward(text_model), d["segments"], rows), d["top_logits"]) < 0.01
    if wrong == "deepstack_dropped":      # the pieces not added: only the input row counts
        rows = np.concatenate([rows[:, :N_EMBD], np.zeros_like(rows[:, N_EMBD:])], axis=1)
    elif wrong == "deepstack_shifted":    # each piece added one layer late
        rows = np.concatenate([rows[:, :N_EMBD], np.zeros_like(rows[:, :N_EMBD]), rows[:, N_EMBD:2 * N_EMBD]], axis=1)
    if wrong == "runs_of_pairs":          # Qwen2-VL's M-RoPE: each stream a run of pairs
        monkeypatch.setattr(Qwen3VLConfig, "MROPE_MODE", ROPE_MROPE)
    placement = wrong if wrong in ("sections_ignored", "positions_not_skipped") else None
    logits = prompt_logits(new_forward(text_model), d["segments"], rows, placement)
    assert top_logit_distance(logits, d["top_logits"]) > 0.1


# ---------------------------------------------------------------- through the engine and the chat API

@pytest.fixture(scope="module")
def llm():
    from pyengine.api import LLM

    with LLM(TEXT, n_ctx=512, n_threads=2, mmproj=MMPROJ) as model:
        yield model


@pytest.mark.parametrize("name", ["square", "odd"])
def test_engine_places_and_stacks_the_image_and_matches_llama_cpp(llm, name):
    """The engine feeds the grid rows at interleaved M-RoPE positions with their
    deepstack pieces; the first token's log-probabilities differ from llama.cpp's
    logits by one constant."""
    engine_matches_recording(llm, RECORDED[name], llm.projector.embed((VISION / RECORDED[name]["image"]).read_bytes()))


def test_engine_wants_the_rows_as_their_grid_at_the_model_s_width(llm):
    rows = llm.projector.embed((VISION / RECORDED["wide"]["image"]).read_bytes())
    ids, _ = recorded_prompt(RECORDED["wide"]["segments"], rows)
    start = len(RECORDED["wide"]["segments"][0]["tokens"])
    with pytest.raises(InvalidOptionError, match=r"\[n_rows, n_columns, n_embd\]"):
        llm.engine.submit(ids, SamplingOptions(), max_tokens=1, images=[(start, rows.reshape(-1, N_ROW))])
    with pytest.raises(InvalidOptionError, match=r"rows must be \[1\.\.\d+, 192\]"):
        llm.engine.submit(ids, SamplingOptions(), max_tokens=1, images=[(start, rows[..., :N_EMBD])])


def test_a_projector_without_deepstack_does_not_fit():
    from pyengine.api import LLM

    with pytest.raises(ModelError, match=r"192"):
        LLM(TEXT, n_ctx=512, n_threads=1, mmproj=VISION / "qwen25vl-tiny.mmproj.gguf")


def test_chat_with_an_image_answers_and_different_images_differ(llm):
    square, wide = [(VISION / RECORDED[n]["image"]).read_bytes() for n in ("square", "wide")]
    assert chat_first_token(llm, square) != chat_first_token(llm, wide)
    assert chat_first_token(llm, square) == chat_first_token(llm, square)
