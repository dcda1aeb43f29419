"""Kernels of the k-quants (Q2_K..Q6_K, Q8_K) and the IQ4 types, on every
instruction set this CPU offers: dequantization against gguf-py, the Q8_K
activation quantizer against a numpy transcription of ggml's formula, and
dot products against the scalar reference and against float64."""

from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import available_isas

from pyengine import _core

T = gguf.GGMLQuantizationType
ISAS = available_isas()
K_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS]
WEIGHT_TYPES = K_TYPES + [T.IQ4_NL]
K_LENGTHS = [256, 512, 1536, 2048, 4096]
NL_LENGTHS = [32, 64, 96, 160, 2048]
SYNTH = Path(__file__).parent / "data" / "synth"

# where each block keeps its f16 scales: (block bytes, byte offsets of f16 fields)
F16_FIELDS = {
    T.Q2_K: (84, [80, 82]),
    T.Q3_K: (110, [108]),
    T.Q4_K: (144, [0, 2]),
    T.Q5_K: (176, [0, 2]),
    T.Q6_K: (210, [208]),
    T.IQ4_NL: (18, [0]),
    T.IQ4_XS: (136, [0]),
}

# round-trip RMSE of the reference quantizers on unit gaussians, relative to the data
QUANTIZE_RMSE = {
    T.Q2_K: 0.33, T.Q3_K: 0.17, T.Q4_K: 0.085, T.Q5_K: 0.042, T.Q6_K: 0.021,
    T.IQ4_NL: 0.09, T.IQ4_XS: 0.09, T.Q8_K: 0.008,
}

# |dot - float64 dot of the dequantized weights| / sum |w * x|
DOT_BUDGET = 0.01
# SIMD against the scalar reference: only the order of float sums may differ
SIMD_RTOL = 1e-5


def lengths(qtype):
    return NL_LENGTHS if qtype == T.IQ4_NL else K_LENGTHS


@pytest.fixture(params=ISAS)
def isa(request):
    before = _core.isa()
    _core.set_isa(request.param)
    yield request.param
    _core.set_isa(before)


def finite_f16_bits(rng, count, moderate):
    """Random finite f16 bit patterns (subnormals included), or moderate
    values when the result feeds a dot product."""
    if moderate:
        return rng.uniform(-0.05, 0.05, count).astype(np.float16).view(np.uint16)
    bits = rng.integers(0, 1 << 16, count, dtype=np.uint32).astype(np.uint16)
    inf_or_nan = (bits & 0x7C00) == 0x7C00
    bits[inf_or_nan] &= 0xFBFF  # drop one exponent bit: largest finite range
    return bits


def random_blocks(qtype, n, rng, moderate=False):
    """n elements of random blocks: random indices and scales (every bit
    pattern), finite f16 super-block scales."""
    size, offsets = F16_FIELDS[qtype]
    nblocks = n // gguf.GGML_QUANT_SIZES[qtype][0]
    raw = rng.integers(0, 256, (nblocks, size), dtype=np.uint8)
    for off in offsets:
        raw[:, off:off + 2] = finite_f16_bits(rng, nblocks, moderate).view(np.uint8).reshape(nblocks, 2)
    return raw.ravel()


def gguf_dequantize(qtype, data):
    return gguf.quants.dequantize(np.asarray(data, dtype=np.uint8), qtype).ravel()


def quantize_q8_K_numpy(x):
    """ggml's quantize_row_q8_K_ref in numpy, returned as raw block bytes."""
    out = []
    for blk in x.reshape(-1, 256):
        amax = np.abs(blk).max()
        if amax == 0:
            out.append(np.zeros(292, dtype=np.uint8))
            continue
        vmax = blk[int(np.argmax(np.abs(blk) == amax))]  # first of the largest
        iscale = np.float32(-127.0) / vmax
        q = np.minimum(np.rint(iscale * blk), 127).astype(np.int8)  # rint: ties to even
        bsums = q.reshape(16, 16).astype(np.int16).sum(axis=1).astype(np.int16)
        d = np.float32(1.0) / iscale
        out.append(np.concatenate([np.array([d], np.float32).view(np.uint8), q.view(np.uint8),
                                   bsums.view(np.uint8)]))
    return np.concatenate(out)


def dot_reference64(qtype, w, x):
    wd = _core.dequantize(int(qtype), w, x.size, reference=True).astype(np.float64)
    return float(np.dot(wd, x)), float(np.sum(np.abs(wd * x)))


# ---- dequantize ------------------------------------------------------------


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dequantize_random_blocks_match_gguf(isa, qtype):
    rng = np.random.default_rng(int(qtype))
    for n in lengths(qtype):
        w = random_blocks(qtype, n, rng)
        want = gguf_dequantize(qtype, w)
        assert np.array_equal(_core.dequantize(int(qtype), w, n, reference=True), want)
        assert np.array_equal(_core.dequantize(int(qtype), w, n), want)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_dequantize_quantized_rows_match_gguf(isa, qtype):
    rng = np.random.default_rng(100 + int(qtype))
    x = rng.standard_normal(4096).astype(np.float32)
    w = _core.quantize(int(qtype), x)
    assert np.array_equal(_core.dequantize(int(qtype), w, x.size), gguf_dequantize(qtype, w))


def test_dequantize_q8_K(isa):
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (8, 292), dtype=np.uint8)
    d = rng.uniform(-2, 2, 8).astype(np.float32)
    blocks[:, :4] = d.view(np.uint8).reshape(8, 4)
    qs = blocks[:, 4:260].view(np.int8).astype(np.float32)
    want = (d[:, None] * qs).ravel()
    assert np.array_equal(_core.dequantize(int(T.Q8_K), blocks.ravel(), 2048), want)


def test_dequantize_real_tensors_match_gguf(isa):
    """Blocks written by llama.cpp's quantizer, one file per type."""
    for name in ["q2_k", "q3_k_s", "q4_k_s", "q5_k_s", "q6_k", "iq4_nl", "iq4_xs"]:
        reader = gguf.GGUFReader(SYNTH / f"llama-wide-{name}.gguf")
        tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
        qtype = tensor.tensor_type
        rows = np.asarray(tensor.data)
        want = gguf.quants.dequantize(rows, qtype)
        n = want.shape[-1]
        for r in range(0, rows.shape[0], 37):
            got = _core.dequantize(int(qtype), np.ascontiguousarray(rows[r]), n)
            assert np.array_equal(got, want[r]), (name, r)


# ---- quantize --------------------------------------------------------------


@pytest.mark.parametrize("qtype", WEIGHT_TYPES + [T.Q8_K], ids=lambda t: t.name)
def test_quantize_round_trip_error(qtype):
    rng = np.random.default_rng(200 + int(qtype))
    x = rng.standard_normal(8192).astype(np.float32)
    w = _core.quantize(int(qtype), x)
    assert w.size == _core.row_bytes(int(qtype), x.size)
    y = _core.dequantize(int(qtype), w, x.size, reference=True)
    rmse = np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x ** 2))
    assert rmse < QUANTIZE_RMSE[qtype]


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_quantize_special_rows(qtype):
    n = 512
    zeros = np.zeros(n, np.float32)
    assert not _core.dequantize(int(qtype), _core.quantize(int(qtype), zeros), n).any()
    spike = np.zeros(n, np.float32)
    spike[77] = -3.5
    y = _core.dequantize(int(qtype), _core.quantize(int(qtype), spike), n)
    assert abs(y[77] + 3.5) < 0.05 * 3.5
    assert np.all(np.isfinite(y))
    ramp = np.linspace(-1e-3, 1e-3, n, dtype=np.float32)
    y = _core.dequantize(int(qtype), _core.quantize(int(qtype), ramp), n)
    assert np.max(np.abs(y - ramp)) < 0.5e-3


def q8_K_cases(rng):
    yield rng.standard_normal(2048).astype(np.float32)
    yield (rng.standard_normal(1024) * 1e-20).astype(np.float32)
    yield (rng.standard_normal(1024) * 1e20).astype(np.float32)
    yield np.zeros(512, np.float32)
    ties = rng.integers(-3, 4, 512).astype(np.float32)  # many equal magnitudes, both signs
    yield ties
    yield -ties
    halves = (rng.integers(-254, 255, 256) / 2.0).astype(np.float32)
    halves[5] = -127.0  # scale -127 / -127 = 1: every .5 is a rounding tie
    yield halves
    spike = np.zeros(768, np.float32)
    spike[300] = 42.0
    yield spike
    yield fused_rounding_block()


def fused_rounding_block():
    """Values whose product with the scale rounds (as a float) to exactly
    k + 0.5 although the exact product is not: an FMA-fused x * s + magic
    rounds these the other way."""
    vmax = np.float32(-3.3)
    scale = np.float32(-127.0) / vmax
    x0 = (np.arange(-126, 127) + 0.5) / np.float64(scale)
    bits = x0.astype(np.float32).view(np.int32)
    near = (bits[:, None] + np.arange(-4, 5)[None, :]).ravel().view(np.float32)
    near = near[np.abs(near) < 3.3]
    p32 = near * scale
    p64 = near.astype(np.float64) * np.float64(scale)
    tricky = near[np.rint(p32) != np.rint(p64)]
    assert tricky.size > 50
    block = np.resize(tricky, 256).astype(np.float32)
    block[0] = vmax
    return block


def test_quantize_q8_K_matches_formula(isa):
    rng = np.random.default_rng(11)
    for x in q8_K_cases(rng):
        want = quantize_q8_K_numpy(x)
        assert np.array_equal(_core.quantize(int(T.Q8_K), x, reference=True), want)
        assert np.array_equal(_core.quantize(int(T.Q8_K), x, reference=False), want)


# ---- dot products ----------------------------------------------------------


def dot_cases(qtype, n, rng):
    """(weights, activations) pairs: quantized gaussians, random blocks."""
    x = rng.standard_normal(n).astype(np.float32)
    yield _core.quantize(int(qtype), rng.standard_normal(n).astype(np.float32)), x
    yield random_blocks(qtype, n, rng, moderate=True), x
    yield random_blocks(qtype, n, rng, moderate=True), (x * 1e-3 + 5.0).astype(np.float32)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_vec_dot_matches_reference_and_float64(isa, qtype):
    rng = np.random.default_rng(300 + int(qtype))
    for n in lengths(qtype):
        for w, x in dot_cases(qtype, n, rng):
            got = _core.vec_dot(int(qtype), w, x)
            ref = _core.vec_dot(int(qtype), w, x, reference=True)
            exact, scale = dot_reference64(qtype, w, x)
            assert abs(got - ref) <= SIMD_RTOL * scale + 1e-30, (n, got, ref)
            assert abs(got - exact) <= DOT_BUDGET * scale, (n, got, exact)


@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
def test_vec_dot_special_values(isa, qtype):
    rng = np.random.default_rng(400 + int(qtype))
    n = 512
    w = random_blocks(qtype, n, rng, moderate=True)
    assert _core.vec_dot(int(qtype), w, np.zeros(n, np.float32)) == 0.0
    zero_w = _core.quantize(int(qtype), np.zeros(n, np.float32))
    assert _core.vec_dot(int(qtype), zero_w, rng.standard_normal(n).astype(np.float32)) == 0.0
    # extreme but finite: largest f16 scales with the largest activations
    big = random_blocks(qtype, n, rng)
    size, offsets = F16_FIELDS[qtype]
    blocks = big.reshape(-1, size)
    for off in offsets:
        blocks[:, off:off + 2] = np.array([0x7BFF], np.uint16).view(np.uint8)
    x = np.full(n, 1e3, np.float32)
    x[::3] = -1e3
    got = _core.vec_dot(int(qtype), big, x)
    ref = _core.vec_dot(int(qtype), big, x, reference=True)
    exact, scale = dot_reference64(qtype, big, x)
    assert np.isfinite(got)
    assert abs(got - ref) <= SIMD_RTOL * scale
    assert abs(got - exact) <= DOT_BUDGET * scale
    # one spike in the activations: everything else quantizes to zero
    spike = np.zeros(n, np.float32)
    spike[n - 1] = 3.0
    wd = _core.dequantize(int(qtype), w, n, reference=True)
    assert abs(_core.vec_dot(int(qtype), w, spike) - 3.0 * wd[n - 1]) <= 1e-3 * abs(3.0 * wd[n - 1]) + 1e-30


def test_vec_dot_real_tensors(isa):
    rng = np.random.default_rng(5)
    for name in ["q2_k", "q3_k_s", "q4_k_s", "q5_k_s", "q6_k", "iq4_nl", "iq4_xs"]:
        reader = gguf.GGUFReader(SYNTH / f"llama-wide-{name}.gguf")
        tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_up.weight")
        qtype = tensor.tensor_type
        rows = np.asarray(tensor.data)
        n = gguf.quants.dequantize(rows[:1], qtype).shape[-1]
        x = rng.standard_normal(n).astype(np.float32)
        for r in range(0, rows.shape[0], 61):
            w = np.ascontiguousarray(rows[r])
            got = _core.vec_dot(int(qtype), w, x)
            exact, scale = dot_reference64(qtype, w, x)
            assert abs(got - exact) <= DOT_BUDGET * scale, (name, r)


def test_bad_lengths_raise():
    x = np.zeros(300, np.float32)
    with pytest.raises(ValueError):
        _core.vec_dot(int(T.Q4_K), np.zeros(1024, np.uint8), x)
    with pytest.raises(ValueError):
        _core.quantize(int(T.Q8_K), x)
    with pytest.raises(ValueError):
        _core.dequantize(int(T.Q6_K), np.zeros(100, np.uint8), 256)
