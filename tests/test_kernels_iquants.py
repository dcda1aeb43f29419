"""Kernels of the lattice types IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M
on every instruction set this CPU offers: dequantization against gguf-py (random
blocks: every index, sign and scale bit pattern), dot products against the scalar
reference (the same bits) and against float64 of the dequantized weights, and the
grids the core got from the gguf package."""

import gguf
import numpy as np
import pytest
from conftest import available_isas

from pyengine import _core, iq_grids
from pyengine.errors import NativeError

T = gguf.GGMLQuantizationType
ISAS = available_isas()
IQ_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]
LENGTHS = [256, 512, 1536, 2048]
# |dot - float64 dot of the dequantized weights| / sum |w * x|: the q8_K activations' rounding
DOT_BUDGET = 0.01


@pytest.fixture(params=ISAS)
def isa(request):
    before = _core.isa()
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa(before)


def moderate_f16(rng, count):
    return rng.uniform(-0.05, 0.05, count).astype(np.float16).view(np.uint16)


def random_blocks(qtype, n, rng):
    """n elements of random blocks (every bit pattern) with moderate f16 scales."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (n // 256, size), dtype=np.uint8)
    d = moderate_f16(rng, len(raw))
    if qtype == T.IQ1_M:   # the f16 lives in the top nibbles of the four scale words
        words = raw[:, 48:56].copy().view(np.uint16)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        raw[:, 48:56] = words.view(np.uint8)
    else:
        raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    return raw.ravel()


def dot_reference64(qtype, w, x):
    wd = _core.dequantize(int(qtype), w, x.size, reference=True).astype(np.float64)
    return float(np.dot(wd, x)), float(np.sum(np.abs(wd * x)))


def test_the_core_has_every_grid():
    for qtype in IQ_TYPES:
        assert _core.type_supported(int(qtype)), qtype.name
    for grid_id, name, dtype in iq_grids.GRIDS:
        assert iq_grids.levels(name, dtype) is not None, name
    with pytest.raises(NativeError, match="takes 2048 bytes"):
        _core.set_iq_grid(0, bytes(10))
    with pytest.raises(NativeError, match="unknown IQ grid"):
        _core.set_iq_grid(99, bytes(8))


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_dequantize_random_blocks_match_gguf(isa, qtype):
    rng = np.random.default_rng(int(qtype))
    for n in LENGTHS:
        data = random_blocks(qtype, n, rng)
        want = gguf.quants.dequantize(data, qtype).ravel()
        assert np.array_equal(_core.dequantize(int(qtype), data, n), want), (qtype.name, n)


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_vec_dot_matches_reference_and_float64(isa, qtype):
    rng = np.random.default_rng(100 + int(qtype))
    for n in LENGTHS:
        for _ in range(3):
            w = random_blocks(qtype, n, rng)
            x = rng.standard_normal(n).astype(np.float32)
            got = _core.vec_dot(int(qtype), w, x)
            ref = _core.vec_dot(int(qtype), w, x, reference=True)
            exact, scale = dot_reference64(qtype, w, x)
            assert got == ref, (qtype.name, n, got, ref)
            assert abs(got - exact) <= DOT_BUDGET * scale, (qtype.name, n, got, exact)


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_vec_dot_special_values(isa, qtype):
    rng = np.random.default_rng(200 + int(qtype))
    n = 512
    w = random_blocks(qtype, n, rng)
    assert _core.vec_dot(int(qtype), w, np.zeros(n, np.float32)) == 0.0
    # one spike in the activations: everything else quantizes to zero
    spike = np.zeros(n, np.float32)
    spike[n - 1] = 3.0
    wd = _core.dequantize(int(qtype), w, n, reference=True)
    assert abs(_core.vec_dot(int(qtype), w, spike) - 3.0 * wd[n - 1]) <= 1e-3 * abs(3.0 * wd[n - 1]) + 1e-30
    # large activations of both signs stay finite and exact in their integer sums
    x = np.full(n, 1e3, np.float32)
    x[::3] = -1e3
    exact, scale = dot_reference64(qtype, w, x)
    got = _core.vec_dot(int(qtype), w, x)
    assert got == _core.vec_dot(int(qtype), w, x, reference=True)
    assert abs(got - exact) <= DOT_BUDGET * scale


def test_bad_lengths_raise():
    with pytest.raises(ValueError):
        _core.vec_dot(int(T.IQ2_XXS), np.zeros(66, np.uint8), np.zeros(300, np.float32))
    with pytest.raises(ValueError):
        _core.dequantize(int(T.IQ3_S), np.zeros(100, np.uint8), 256)


def test_vec_dot_real_tensors(isa):
    """ggml-quantized rows (the synthetic models of scripts/make_iq_synth.py)."""
    from pathlib import Path

    rng = np.random.default_rng(5)
    for qtype in IQ_TYPES:
        path = Path(__file__).parent / "data" / "synth" / f"llama-wide-{qtype.name.lower()}.gguf"
        tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.0.ffn_up.weight")
        assert tensor.tensor_type == qtype
        rows = np.asarray(tensor.data)
        x = rng.standard_normal(256).astype(np.float32)
        for r in range(0, rows.shape[0], 37):
            w = np.ascontiguousarray(rows[r])
            got = _core.vec_dot(int(qtype), w, x)
            exact, scale = dot_reference64(qtype, w, x)
            assert got == _core.vec_dot(int(qtype), w, x, reference=True)
            assert abs(got - exact) <= DOT_BUDGET * scale, (qtype.name, r)


@pytest.mark.parametrize("qtype", IQ_TYPES, ids=lambda t: t.name)
def test_products_of_every_batch_equal_vec_dot(isa, qtype):
    """mul_mat of prompt batches (tiles of 16 rows expanded once, pack16 / gemm16, and
    the rows left over) and of decoding batches, each element bit for bit vec_dot."""
    from pyengine.ml.context import Backend, Context

    class Weight:
        def __init__(self, data, k, n):
            self.name, self.type, self.shape, self.data = "w", int(qtype), (k, n), data

    rng = np.random.default_rng(500 + int(qtype))
    k, n = 512, 37                         # two packed tiles of 16 rows and 5 rows alone
    rows = [random_blocks(qtype, k, rng) for _ in range(n)]
    x = (rng.standard_normal((70, k)) * rng.uniform(0.1, 4.0, (70, 1))).astype(np.float32)
    for m in (1, 3, 8, 17, 70):
        ctx = Context(Backend(2))
        out = ctx.mul_mat(ctx.weight(Weight(np.concatenate(rows), k, n)), ctx.input(np.ascontiguousarray(x[:m]), "x"))
        ctx.set_output(out)
        ctx.compute()
        got = ctx.read(out)
        want = np.array([[_core.vec_dot(int(qtype), rows[i], x[j]) for i in range(n)] for j in range(m)], np.float32)
        mismatch = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
        assert mismatch.size == 0, (qtype.name, m, mismatch[:5].tolist())
