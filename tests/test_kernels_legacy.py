"""Kernels of the float types (F32 F16 BF16) and the legacy block types
(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1).

The scalar reference is checked against gguf's numpy implementation (bit-exact
bytes and floats; Q8_0 and Q8_1, the activation formats, against the canonical
rule every ISA shares instead: x * (127 / amax) rounded half to even, which
differs from gguf's at most by one code at ties); every SIMD table on this CPU
is checked against the reference: activation quantizers and dequantizers
bit-exact, dot products up to float summation order, and against a float64
dot within an error budget."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import available_isas
from gguf import GGMLQuantizationType as T
from gguf import quants

from pyengine import _core

LENGTHS = (32, 64, 96, 160, 576, 1536, 4096)
SEEDS = (0, 1, 2)
ISAS = available_isas()
SIMD_ISAS = [name for name in ISAS if name != "scalar"] or ["scalar"]

FLOAT_TYPES = (T.F32, T.F16, T.BF16)
BLOCK_WEIGHTS = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
WEIGHT_TYPES = FLOAT_TYPES + BLOCK_WEIGHTS
# types gguf quantizes with GGML's reference algorithm (Q8_0 follows the
# activations' canonical rule, see test_reference_q8_0_is_the_canonical_rule)
GGUF_QUANTIZED = (T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)
# what activations are quantized to: must be bit-exact on every ISA
ACTIVATION_TYPES = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q8_1)
# types with a zero point m (dot = d*da*sumi + m*s)
WITH_MIN = (T.Q4_1, T.Q5_1)

# float64-dot error budget, relative to sum |w x|: the activations' own
# quantization is the only error left once the weights are dequantized
BUDGET = {T.F32: 1e-6, T.F16: 1e-3, T.BF16: 8e-3, T.Q4_0: 0.02, T.Q4_1: 0.02,
          T.Q5_0: 0.02, T.Q5_1: 0.02, T.Q8_0: 0.02}


@contextlib.contextmanager
def using_isa(name: str) -> Iterator[None]:
    previous = _core.isa()
    _core.set_isa(name)
    try:
        yield
    finally:
        _core.set_isa(previous)


# ---- data ---------------------------------------------------------------------

def random_row(n: int, seed: int) -> np.ndarray:
    """Normal values with a few outliers and blocks of different scales."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    x *= np.repeat(rng.uniform(0.05, 3.0, n // 32), 32)
    x[rng.integers(0, n, max(1, n // 50))] *= 6.0
    return x.astype(np.float32)


def special_row(kind: str, n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    if kind == "zeros":
        return np.zeros(n, dtype=np.float32)
    if kind == "equal_block":
        x = rng.standard_normal(n).astype(np.float32)
        x[:32] = 0.75
        x[-32:] = -3.5
        return x
    if kind == "large":  # Q8_1's s = d * sum(q) must stay below f16's max
        return (rng.uniform(-1.0, 1.0, n) * 1.5e3).astype(np.float32)
    if kind == "huge":  # scales near f16's max; weights only
        return (rng.uniform(-1.0, 1.0, n) * 6.0e4).astype(np.float32)
    if kind == "tiny":  # scales become f16 subnormals
        return (rng.standard_normal(n) * 1.0e-5).astype(np.float32)
    if kind == "halves":  # x * (1/d) lands exactly on k + 0.5: rounding ties
        q = rng.integers(-126, 126, n).astype(np.float32) + 0.5
        q[::32] = 127.0  # amax 127 -> d = 1
        return q
    if kind == "positive":  # min > 0 for the types with a zero point
        return (rng.uniform(2.0, 3.0, n)).astype(np.float32)
    raise ValueError(kind)


SPECIAL = ("zeros", "equal_block", "large", "tiny", "halves", "positive")
WEIGHT_SPECIAL = SPECIAL + ("huge",)


def gguf_quantize(qtype: T, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(quants.quantize(x.reshape(1, -1), qtype)).reshape(-1).view(np.uint8)


def gguf_dequantize(qtype: T, data: np.ndarray) -> np.ndarray:
    return np.asarray(quants.dequantize(data.reshape(1, -1), qtype), dtype=np.float32).reshape(-1)


def q8_1_model(x: np.ndarray) -> np.ndarray:
    """Q8_1 blocks per GGML's reference: Q8_0's d and codes, plus
    s = f16(d * sum(codes)) with the float (not f16) d."""
    q8_0 = gguf_quantize(T.Q8_0, x).reshape(-1, 34)
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    codes = q8_0[:, 2:].view(np.int8)
    s = (codes.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float16)
    out = np.concatenate([q8_0[:, :2], s.reshape(-1, 1).view(np.uint8), q8_0[:, 2:]], axis=1)
    return out.reshape(-1)


def q8_x86_model(qtype: T, x: np.ndarray) -> np.ndarray:
    """Q8_0/Q8_1 blocks as llama.cpp's x86 build quantizes activations (and so
    does every table here, the reference included: the canonical rule): codes = rint(x * (127 / amax)) with ties to
    even, d = amax / 127, Q8_1's s = f16(d * sum(codes))."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=1)
    with np.errstate(divide="ignore"):
        mul = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    codes = np.rint((blocks * mul[:, None]).astype(np.float32)).astype(np.int8)
    d = (amax / np.float32(127)).astype(np.float32)
    parts = [d.astype(np.float16).reshape(-1, 1).view(np.uint8)]
    if qtype == T.Q8_1:
        s = (codes.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float16)
        parts.append(s.reshape(-1, 1).view(np.uint8))
    parts.append(codes.view(np.uint8))
    return np.concatenate(parts, axis=1).reshape(-1)


def expected_activation_blocks(isa: str, qtype: T, x: np.ndarray) -> np.ndarray:
    """What the ISA's activation quantizer must produce, bit for bit."""
    if qtype in (T.Q8_0, T.Q8_1):
        return q8_x86_model(qtype, x)
    return _core.quantize(int(qtype), x, reference=True)


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def dot_scale(qtype: T, w: np.ndarray, wd: np.ndarray, x: np.ndarray) -> float:
    """Sum of |terms| the dot adds up, from the weight row's raw bytes w and its
    dequantized values wd (|wd_j| + 2|m| bounds |d q_j| + |m| for the types
    with a zero point)."""
    terms = np.abs(wd.astype(np.float64))
    if qtype in WITH_MIN:
        raw = w.reshape(-1, _core.block_bytes(int(qtype)))
        m = raw[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1)
        terms += 2 * np.repeat(np.abs(m), 32)
    return float(np.sum(terms * np.abs(x.astype(np.float64))))


# ---- reference against gguf -------------------------------------------------------

@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("qtype", GGUF_QUANTIZED, ids=lambda t: t.name)
def test_reference_quantize_matches_gguf_random(qtype: T, n: int) -> None:
    for seed in SEEDS:
        x = random_row(n, seed)
        ours = _core.quantize(int(qtype), x, reference=True)
        assert np.array_equal(ours, gguf_quantize(qtype, x)), (qtype.name, n, seed)


@pytest.mark.parametrize("kind", WEIGHT_SPECIAL)
@pytest.mark.parametrize("qtype", GGUF_QUANTIZED, ids=lambda t: t.name)
def test_reference_quantize_matches_gguf_special(qtype: T, kind: str) -> None:
    x = special_row(kind, 256)
    ours = _core.quantize(int(qtype), x, reference=True)
    assert np.array_equal(ours, gguf_quantize(qtype, x))


# "huge" is for weights only: Q8_1's s = d * sum(q) would pass f16's max
@pytest.mark.parametrize("qtype, kind", [(T.Q8_0, k) for k in ("random",) + WEIGHT_SPECIAL]
                         + [(T.Q8_1, k) for k in ("random",) + SPECIAL],
                         ids=lambda v: v.name if isinstance(v, T) else v)
def test_reference_q8_is_the_canonical_rule(qtype: T, kind: str) -> None:
    """The reference quantizes Q8_0 / Q8_1 by the rule the SIMD tables use (it
    is also the scalar table's activation quantizer); that is GGML's reference
    but for ties and the scale's reciprocal: one code apart at most."""
    x = random_row(1536, 7) if kind == "random" else special_row(kind, 1536)
    ours = _core.quantize(int(qtype), x, reference=True)
    assert np.array_equal(ours, q8_x86_model(qtype, x))
    ggml = gguf_quantize(T.Q8_0, x) if qtype == T.Q8_0 else q8_1_model(x)
    head = 2 if qtype == T.Q8_0 else 4
    ours_b, ggml_b = ours.reshape(-1, head + 32), ggml.reshape(-1, head + 32)
    assert np.array_equal(ours_b[:, :2], ggml_b[:, :2])  # d
    diff = ours_b[:, head:].view(np.int8).astype(int) - ggml_b[:, head:].view(np.int8).astype(int)
    assert np.abs(diff).max() <= 1


def test_reference_q8_rounds_halves_to_even() -> None:
    x = np.array([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5] + [0.0] * 25, dtype=np.float32)
    codes = _core.quantize(int(T.Q8_0), x)[2:].view(np.int8)
    assert codes[:7].tolist() == [127, 0, 0, 2, -2, 2, -2]


def test_reference_f32_is_a_copy() -> None:
    x = random_row(96, 3)
    assert same_floats(_core.quantize(int(T.F32), x).view(np.float32), x)
    assert same_floats(_core.dequantize(int(T.F32), x.view(np.uint8), 96, reference=True), x)


def test_reference_half_conversions_round_to_nearest_even() -> None:
    # 1 + 2^-11 lies halfway between two halves; 1 + 3*2^-11 also: ties to even
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 1e-8, -0.0, np.inf], dtype=np.float32)
    halves = _core.quantize(int(T.F16), x).view(np.float16)
    assert halves.tolist()[:3] == [1.0, 1 + 2**-9, np.inf]
    assert halves[3] == 0.0 and np.signbit(halves[4]) and np.isinf(halves[5])
    bf = np.array([1 + 2**-8, 1 + 3 * 2**-8], dtype=np.float32)
    back = _core.dequantize(int(T.BF16), _core.quantize(int(T.BF16), bf), 2)
    assert back.tolist() == [1.0, 1 + 2**-6]


def random_blocks(qtype: T, n_blocks: int, seed: int) -> np.ndarray:
    """Random code bits with sane f16 scales: covers every code value."""
    rng = np.random.default_rng(seed)
    block_bytes = _core.block_bytes(int(qtype))
    raw = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint8)
    n_halves = 2 if qtype in WITH_MIN else 1
    scales = rng.uniform(-2.0, 2.0, (n_blocks, n_halves)).astype(np.float16)
    scales[0, 0] = np.float16(3e-7)  # a subnormal half
    raw[:, : 2 * n_halves] = scales.view(np.uint8)
    return raw.reshape(-1)


@pytest.mark.parametrize("qtype", BLOCK_WEIGHTS, ids=lambda t: t.name)
def test_reference_dequantize_matches_gguf(qtype: T) -> None:
    for seed in SEEDS:
        data = random_blocks(qtype, 48, seed)
        ours = _core.dequantize(int(qtype), data, 48 * 32, reference=True)
        assert same_floats(ours, gguf_dequantize(qtype, data))


@pytest.mark.parametrize("qtype", (T.F16, T.BF16), ids=lambda t: t.name)
def test_reference_half_dequantize_matches_gguf(qtype: T) -> None:
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 1 << 16, 4096, dtype=np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00] if qtype == T.F16 else bits[(bits & 0x7F80) != 0x7F80]
    ours = _core.dequantize(int(qtype), bits.view(np.uint8), bits.size, reference=True)
    if qtype == T.F16:
        theirs = bits.view(np.float16).astype(np.float32)
    else:
        theirs = gguf_dequantize(qtype, bits.view(np.uint8))
    assert same_floats(ours, theirs)


@pytest.mark.parametrize("qtype", BLOCK_WEIGHTS, ids=lambda t: t.name)
def test_reference_vec_dot_is_integer_sum_times_scales(qtype: T) -> None:
    """The reference dot equals sum_b d_w d_a sumi_b (+ m_b s_b) in float64
    up to float32 accumulation."""
    n = 1536
    w = _core.quantize(int(qtype), random_row(n, 11))
    x = random_row(n, 12)
    partner = _core.vec_dot_type(int(qtype))
    a = _core.quantize(partner, x)
    wd = _core.dequantize(int(qtype), w, n).astype(np.float64)
    ad = _core.dequantize(partner, a, n).astype(np.float64)
    expected = float(np.dot(wd, ad))
    if qtype in WITH_MIN:  # GGML uses s = f16(d * sum q), not sum of dequantized a
        raw_w = w.reshape(-1, _core.block_bytes(int(qtype)))
        raw_a = a.reshape(-1, 36)
        m = raw_w[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1)
        s = raw_a[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(-1)
        expected += float(np.sum(m * s) - np.sum(m * ad.reshape(-1, 32).sum(axis=1)))
    got = _core.vec_dot(int(qtype), w, x, reference=True)
    assert abs(got - expected) <= 2e-6 * dot_scale(qtype, w, wd, x) + 1e-9


# ---- SIMD against the reference --------------------------------------------------

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", ACTIVATION_TYPES, ids=lambda t: t.name)
def test_activation_quantize_bit_exact(isa: str, qtype: T) -> None:
    rows = [random_row(n, seed) for n in LENGTHS for seed in SEEDS]
    rows += [special_row(kind, 576) for kind in SPECIAL]
    with using_isa(isa):
        for x in rows:
            fast = _core.quantize(int(qtype), x, reference=False)
            assert np.array_equal(fast, expected_activation_blocks(isa, qtype, x)), (isa, x.size)


def rounding_edges() -> np.ndarray:
    """Blocks whose scale is exactly 1 (amax 127), holding values next to the
    rounding boundaries: ties, and the floats just below and above them."""
    edges = [0.5, 1.5, 2.5, 126.5, 0.25]
    below = [np.nextafter(np.float32(e), np.float32(0)) for e in edges]
    above = [np.nextafter(np.float32(e), np.float32(200)) for e in edges]
    values = np.array(edges + below + above + [0.0, 1e-30], dtype=np.float32)
    block = np.zeros(32, dtype=np.float32)
    block[0] = 127.0
    block[1 : 1 + values.size] = values
    return np.concatenate([block, -block, block * np.float32(2 ** -20)])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", (T.Q8_0, T.Q8_1), ids=lambda t: t.name)
def test_activation_rounding_edges(isa: str, qtype: T) -> None:
    x = rounding_edges()
    expected = q8_x86_model(qtype, x)
    with using_isa(isa):
        assert np.array_equal(_core.quantize(int(qtype), x, reference=False), expected)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", BLOCK_WEIGHTS + (T.Q8_1,), ids=lambda t: t.name)
def test_dequantize_bit_exact(isa: str, qtype: T) -> None:
    with using_isa(isa):
        for n_blocks in (1, 2, 3, 5, 18, 128):
            data = random_blocks(qtype, n_blocks, n_blocks)
            n = n_blocks * 32
            fast = _core.dequantize(int(qtype), data, n, reference=False)
            assert same_floats(fast, _core.dequantize(int(qtype), data, n, reference=True)), n


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", (T.F16, T.BF16, T.F32), ids=lambda t: t.name)
def test_float_dequantize_bit_exact(isa: str, qtype: T) -> None:
    with using_isa(isa):
        for n in (1, 7, 8, 15, 16, 17, 33, 100, 4096):
            data = _core.quantize(int(qtype), random_row(4096, n)[:n].copy())
            fast = _core.dequantize(int(qtype), data, n, reference=False)
            assert same_floats(fast, _core.dequantize(int(qtype), data, n, reference=True)), n


def assert_dot_close(isa: str, qtype: T, w_f32: np.ndarray, x: np.ndarray) -> None:
    assert_dot_bytes_close(isa, qtype, _core.quantize(int(qtype), w_f32), x)


def assert_dot_bytes_close(isa: str, qtype: T, w: np.ndarray, x: np.ndarray) -> None:
    """The ISA's dot of weight row w (raw bytes) with x: within 1e-5 of the
    sum of |terms| of the reference's, and within the type's budget of the
    float64 dot of the dequantized weights with x."""
    partner = T(_core.vec_dot_type(int(qtype)))
    a = expected_activation_blocks(isa, partner, x)
    ref = _core.vec_dot_blocks(int(qtype), w, a, x.size, reference=True)
    with using_isa(isa):
        fast = _core.vec_dot(int(qtype), w, x, reference=False)
    wd = _core.dequantize(int(qtype), w, x.size, reference=True)
    scale = dot_scale(qtype, w, wd, x)
    assert abs(fast - ref) <= 1e-5 * scale + 1e-30, (isa, qtype.name, x.size, fast, ref)
    exact = float(np.dot(wd.astype(np.float64), x.astype(np.float64)))
    assert abs(fast - exact) <= BUDGET[qtype] * float(np.sum(np.abs(wd.astype(np.float64) * x))) + 1e-6


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_vec_dot_random(isa: str, qtype: T, n: int) -> None:
    for seed in SEEDS:
        assert_dot_close(isa, qtype, random_row(n, seed), random_row(n, seed + 100))


@pytest.mark.parametrize("kind", WEIGHT_SPECIAL)
@pytest.mark.parametrize("qtype", WEIGHT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_vec_dot_special(isa: str, qtype: T, kind: str) -> None:
    for n in (96, 576):
        special = special_row(kind, n)
        assert_dot_close(isa, qtype, special, random_row(n, 3))
        if kind not in ("huge", "tiny"):  # f16 subnormal activation scales lose digits
            assert_dot_close(isa, qtype, random_row(n, 4), special)


@pytest.mark.parametrize("qtype", BLOCK_WEIGHTS, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", ISAS)
def test_vec_dot_every_code_value(isa: str, qtype: T) -> None:
    """Random code bits (every nibble, 5th-bit pattern, and Q8_0's -128),
    which no quantizer produces all of."""
    for n_blocks in (1, 2, 3, 4, 7, 18, 48):
        w = random_blocks(qtype, n_blocks, 40 + n_blocks)
        assert_dot_bytes_close(isa, qtype, w, random_row(n_blocks * 32, n_blocks))


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_vec_dot_odd_float_lengths(isa: str) -> None:
    """Float rows need not be multiples of any vector width."""
    for qtype in FLOAT_TYPES:
        for n in (1, 3, 8, 15, 17, 31, 33, 63, 65, 127, 129):
            assert_dot_close(isa, qtype, random_row(160, n)[:n].copy(), random_row(160, n + 1)[:n].copy())


def test_q8_1_has_no_weight_dot() -> None:
    assert not _core.type_supported(int(T.Q8_1))
    for qtype in WEIGHT_TYPES:
        assert _core.type_supported(int(qtype))
