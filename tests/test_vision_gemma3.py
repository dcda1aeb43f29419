"""Vision projectors: mmproj loading and validation, and Gemma 3's vision tower
against llama.cpp's libmtmd and a float64 reference.

The synthetic model (tests/data/vision/gemma3-tiny*) and llama.cpp's embeddings of
its test image come from scripts/make_synth_vision.py."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import vision_reference
from conftest import DATA, available_isas, forced_isa
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from PIL import Image

from pyengine.errors import GGUFError, InvalidOptionError, ModelError, UnsupportedError
from pyengine.ml.context import Backend
from pyengine.vision import image
from pyengine.vision.projector import load_projector

VISION = DATA / "vision"
MMPROJ = VISION / "gemma3-tiny.mmproj.gguf"
TEXT = VISION / "gemma3-tiny.gguf"
PNG = VISION / "gemma3-tiny.png"
RECORDED = VISION / "gemma3-tiny.embd.json"
TOLERANCE = 1e-3   # relative: the largest difference over the largest value


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def encoded(rgb: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt, **kw)
    return buf.getvalue()


def noise(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


# ---------------------------------------------------------------- loading the projector

def rewrite(dst, *, keys: dict | None = None, drop_keys: tuple[str, ...] = (), drop: tuple[str, ...] = (),
            replace: dict | None = None, src=MMPROJ) -> str:
    """A copy of the mmproj `src` with keys set ({key: (value, GGUFValueType)}, new ones
    added), keys and tensors left out and tensors replaced ({name: array in numpy order})."""
    reader = GGUFReader(src)
    keys, replace = dict(keys or {}), dict(replace or {})
    arch = keys.pop("general.architecture")[0] if "general.architecture" in keys else "clip"
    writer = GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        value, vtype = keys.pop(key, (field.contents(), field.types[0]))
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for key, (value, vtype) in keys.items():
        writer.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name not in drop:
            data = replace.get(t.name)
            if data is None:
                data = np.asarray(t.data).reshape(tuple(reversed([int(d) for d in t.shape])))
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(dst)


def test_projector_reads_the_files_hyper_parameters():
    proj = load_projector(MMPROJ)
    c = proj.tower.cfg
    assert (proj.kind, c.image_size, c.patch_size, c.n_embd, c.n_layer, c.n_head, c.pool) == ("gemma3", 32, 4, 32, 2, 2, 2)
    assert (proj.n_embd, proj.n_image_tokens) == (64, 16)
    assert c.image_mean == pytest.approx((0.48, 0.46, 0.41)) and c.image_std == pytest.approx((0.27, 0.26, 0.28))
    proj.close()


def test_projector_that_does_not_fit_the_text_model_names_both_widths():
    with pytest.raises(ModelError, match=r"width 64.*image rows of width 128"):
        load_projector(MMPROJ, n_embd_text=128)
    load_projector(MMPROJ, n_embd_text=64).close()


@pytest.mark.parametrize("case, error, message", [
    ("text_model", ModelError, "general.architecture is 'gemma3'"),
    ("missing", GGUFError, "does not exist"),
    ("projector_mlp", UnsupportedError, "projector type 'mlp'"),
    ("no_vision", UnsupportedError, "no vision encoder"),
    ("silu", UnsupportedError, "GELU"),
    ("odd_patch", ModelError, "not a multiple of the patch size"),
    ("pool", ModelError, "pool side 3"),
    ("mean", ModelError, "3 values"),
    ("missing_tensor", ModelError, "v.blk.1.attn_k.weight"),
    ("width", ModelError, "v.blk.0.ffn_up.weight"),
])
def test_bad_projectors_fail_typed(tmp_path, case, error, message):
    S, A, B, U = GGUFValueType.STRING, GGUFValueType.ARRAY, GGUFValueType.BOOL, GGUFValueType.UINT32
    path = {
        "text_model": lambda: str(TEXT),
        "missing": lambda: str(tmp_path / "absent.gguf"),
        "projector_mlp": lambda: rewrite(tmp_path / "p.gguf", keys={"clip.projector_type": ("mlp", S),
                                                                       "clip.vision.projector_type": ("mlp", S)}),
        "no_vision": lambda: rewrite(tmp_path / "p.gguf", keys={"clip.has_vision_encoder": (False, B)}),
        "silu": lambda: rewrite(tmp_path / "p.gguf", keys={"clip.use_gelu": (False, B)}),
        "odd_patch": lambda: rewrite(tmp_path / "p.gguf", keys={"clip.vision.image_size": (30, U)}),
        "pool": lambda: rewrite(tmp_path / "p.gguf", keys={"clip.vision.projector.scale_factor": (3, U)}),
        "mean": lambda: rewrite(tmp_path / "p.gguf", keys={"clip.vision.image_mean": ([0.5, 0.5], A)}),
        "missing_tensor": lambda: rewrite(tmp_path / "p.gguf", drop=("v.blk.1.attn_k.weight",)),
        "width": lambda: rewrite(tmp_path / "p.gguf", keys={"clip.vision.feed_forward_length": (96, U)}),
    }[case]()
    with pytest.raises(error, match=message):
        load_projector(path)


# ---------------------------------------------------------------- Gemma 3's tower

@pytest.fixture(scope="module")
def projector():
    proj = load_projector(MMPROJ, n_embd_text=64)
    yield proj
    proj.close()


@pytest.fixture(scope="module")
def recorded() -> np.ndarray:
    d = json.loads(RECORDED.read_text())
    return np.array(d["embeddings"], np.float64).reshape(d["n_tokens"], d["n_embd"])


def test_embeddings_match_llama_cpp(projector, recorded):
    ours = projector.embed(PNG.read_bytes())
    assert ours.shape == (16, 64) and ours.dtype == np.float32
    assert relative(ours, recorded) < TOLERANCE


def test_embeddings_match_the_float64_reference(projector, recorded):
    rgb = image.decode(PNG.read_bytes())
    reference = vision_reference.gemma3_embeddings(MMPROJ, rgb)
    assert relative(projector.embed_pixels(rgb), reference) < TOLERANCE
    assert relative(recorded, reference) < TOLERANCE          # the reference is llama.cpp's tower too


@pytest.mark.parametrize("variant", vision_reference.VARIANTS)
def test_a_wrong_tower_lands_far_from_llama_cpp(recorded, variant):
    wrong = vision_reference.gemma3_embeddings(MMPROJ, image.decode(PNG.read_bytes()), variant)
    assert relative(wrong, recorded) > 50 * TOLERANCE


def test_other_images_give_other_embeddings(projector):
    a = projector.embed(PNG.read_bytes())
    b = projector.embed(encoded(noise(32, 32, seed=5), "PNG"))
    big = projector.embed(encoded(noise(64, 48, seed=6), "PNG"))   # resized to the tower's 32x32
    assert relative(a, b) > 0.05 and big.shape == a.shape
    assert np.array_equal(projector.embed(PNG.read_bytes()), a)       # the reused graph: same bits again


def test_same_bits_on_every_isa_and_thread_count(projector):
    rgb = image.decode(PNG.read_bytes())
    patches = projector.tower.preprocess(rgb)
    results = []
    for isa in available_isas():
        with forced_isa(isa):
            for threads in (1, 3):
                results.append((isa, threads, projector.tower.encode(patches, Backend(threads))))
    first = results[0][2]
    for isa, threads, out in results[1:]:
        assert np.array_equal(out, first), (isa, threads)


# ---------------------------------------------------------------- the image in the text sequence

def prompt_logits(fw, segments, image_rows: np.ndarray, both_ways: bool = True) -> np.ndarray:
    """The logits after the recorded prompt: its text segments as tokens, its image as
    `image_rows`, one batch each, as mtmd_helper_eval_chunks feeds llama.cpp."""
    pos = 0
    for seg in segments:
        n = len(seg["tokens"]) if "tokens" in seg else seg["image"]
        positions, seqs, last = np.arange(pos, pos + n), np.zeros(n, np.int64), [n - 1]
        if "tokens" in seg:
            logits = fw(np.array(seg["tokens"]), positions, seqs, last)
        else:
            logits = fw.embedded(image_rows, positions, seqs, last, both_ways=both_ways)
        pos += n
    return logits[0]


@pytest.fixture(scope="module")
def text_model():
    from pyengine.gguf import GGUFFile
    from pyengine.models import load_model

    f = GGUFFile(TEXT)
    yield load_model(f)
    f.close()


def new_forward(model, n_cells: int = 128):
    from pyengine.kvcache import KVCache
    from pyengine.runner.forward import Forward

    return Forward(model, Backend(2), KVCache(model.cache_layout(), n_cells))


def top_logit_distance(logits: np.ndarray, top: list) -> float:
    return max(abs(float(logits[t]) - v) for t, v in top)


def test_first_token_logits_after_the_image_match_llama_cpp(text_model, projector):
    d = json.loads(RECORDED.read_text())
    rows = projector.embed(PNG.read_bytes())
    logits = prompt_logits(new_forward(text_model), d["segments"], rows)
    assert top_logit_distance(logits, d["top_logits"]) < 0.05
    assert [int(t) for t in np.argsort(-logits, kind="stable")[:3]] == [t for t, _ in d["top_logits"][:3]]


@pytest.mark.parametrize("wrong", ["causal_image", "scaled_like_tokens"])
def test_an_image_placed_wrongly_lands_far_from_llama_cpp(text_model, recorded, wrong):
    d = json.loads(RECORDED.read_text())
    rows = recorded.astype(np.float32)
    if wrong == "scaled_like_tokens":   # Gemma's sqrt(n_embd) belongs to token embeddings only
        rows = rows * np.float32(np.sqrt(text_model.cfg.n_embd))
    logits = prompt_logits(new_forward(text_model), d["segments"], rows, both_ways=wrong != "causal_image")
    assert top_logit_distance(logits, d["top_logits"]) > 0.1


def test_embedded_rows_equal_to_token_embeddings_give_the_tokens_logits(text_model):
    """The same rows brought as embeddings (the token embeddings times Gemma's sqrt(n_embd),
    a power of two here: exact) give the same bits as the tokens."""
    ids = np.array([5, 77, 300, 12, 9])
    from gguf import quants

    raw = next(t for t in GGUFReader(TEXT).tensors if t.name == "token_embd.weight")
    table = quants.dequantize(raw.data, raw.tensor_type).astype(np.float32)     # [n_vocab, n_embd]
    rows = table[ids] * np.float32(np.sqrt(text_model.cfg.n_embd))
    positions, seqs, out = np.arange(5), np.zeros(5, np.int64), np.arange(5)
    by_tokens = new_forward(text_model)(ids, positions, seqs, out)
    by_rows = new_forward(text_model).embedded(rows, positions, seqs, out)
    assert np.array_equal(by_tokens, by_rows)
    with pytest.raises(InvalidOptionError, match=r"\[tokens, 64\]"):
        new_forward(text_model).embedded(rows[:, :10], positions, seqs, out)
