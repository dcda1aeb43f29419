"""Kernels of MXFP4 (32 E2M1 codes and one E8M0 exponent per block, dot
partner Q8_0) on every instruction set this CPU offers: dequantization and
quantization against gguf-py, dot products bit for bit against the scalar
reference (the canonical arithmetic, issue #25) and within rounding of
float64, and every product of a matmul, prompt tiles included, bit for bit
equal to vec_dot of its pair."""

import gguf
import numpy as np
import pytest
from conftest import available_isas, forced_isa

from pyengine import _core
from pyengine.ml.context import Backend, Context

T = gguf.GGMLQuantizationType
MXFP4 = int(T.MXFP4)
BLOCK_BYTES = 17
ISAS = available_isas()
# |dot - float64 dot of the dequantized weights| / sum |w * x| (Q8_0 activations)
DOT_BUDGET = 0.01


@pytest.fixture(params=ISAS)
def isa(request):
    with forced_isa(request.param):
        yield request.param


def random_blocks(rng, nblocks: int, exponents=(118, 131)) -> np.ndarray:
    """Random codes; exponents drawn from [lo, hi) (scales 2^-10 .. 2^2 by default)."""
    raw = rng.integers(0, 256, (nblocks, BLOCK_BYTES), dtype=np.uint8)
    raw[:, 0] = rng.integers(*exponents, nblocks)
    return raw.ravel()


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def test_type_is_known():
    assert _core.type_name(MXFP4) == "MXFP4"
    assert (_core.block_size(MXFP4), _core.block_bytes(MXFP4)) == tuple(gguf.GGML_QUANT_SIZES[T.MXFP4])
    assert _core.vec_dot_type(MXFP4) == int(T.Q8_0)
    assert _core.type_supported(MXFP4)


def test_dequantize_every_exponent_and_code_matches_gguf(isa):
    """All 256 exponents (the subnormal scales of e 0 and 1, and 255) with every code."""
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (256, BLOCK_BYTES), dtype=np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:16, 1:] = np.arange(16, dtype=np.uint8)[:, None] * 17   # every code in both nibbles
    w = blocks.ravel()
    with np.errstate(over="ignore"):
        want = gguf.quants.dequantize(w, T.MXFP4).ravel()
    for reference in (True, False):
        assert np.array_equal(_core.dequantize(MXFP4, w, 256 * 32, reference=reference), want)


def test_quantize_matches_gguf():
    rng = np.random.default_rng(2)
    rows = [rng.standard_normal(4096), rng.standard_normal(1024) * 1e-3, rng.standard_normal(512) * 1e4,
            np.zeros(64), np.resize([0.25, -0.75, 1.0, 6.0, -3.0, 0.0], 96)]
    for x in rows:
        x = x.astype(np.float32)
        want = gguf.quants.quantize(x.reshape(1, -1), T.MXFP4).ravel()
        assert np.array_equal(_core.quantize(MXFP4, x), want)


def test_quantize_round_trip_error():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(8192).astype(np.float32)
    y = _core.dequantize(MXFP4, _core.quantize(MXFP4, x), x.size)
    assert np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x ** 2)) < 0.2


def test_vec_dot_gives_the_references_bits(isa):
    """1 to 40 blocks (odd counts leave the last block to the first set), moderate
    and extreme exponents, activations at full magnitude too."""
    rng = np.random.default_rng(4)
    for nblocks in range(1, 41):
        n = 32 * nblocks
        for exponents in ((118, 131), (0, 256)):
            w = random_blocks(rng, nblocks, exponents)
            for x in (rng.standard_normal(n), np.where(rng.random(n) < 0.5, -1.0, 1.0) * 1e3):
                x = x.astype(np.float32)
                got = _core.vec_dot(MXFP4, w, x)
                ref = _core.vec_dot(MXFP4, w, x, reference=True)
                assert bits(got) == bits(ref) or (np.isnan(got) and np.isnan(ref)), (isa, nblocks, got, ref)


def test_vec_dot_close_to_float64(isa):
    rng = np.random.default_rng(5)
    for n in (32, 64, 96, 160, 2048):
        x = rng.standard_normal(n).astype(np.float32)
        for w in (random_blocks(rng, n // 32), _core.quantize(MXFP4, rng.standard_normal(n).astype(np.float32))):
            wd = gguf.quants.dequantize(w, T.MXFP4).ravel().astype(np.float64)
            got = _core.vec_dot(MXFP4, w, x)
            assert abs(got - wd @ x) <= DOT_BUDGET * np.sum(np.abs(wd * x)), (isa, n)


class Weight:
    """What Context.weight() takes."""

    def __init__(self, k: int, n: int, data: np.ndarray) -> None:
        self.name, self.type, self.shape, self.data = "w", MXFP4, (k, n), data


def mul_mat(weight: Weight, x: np.ndarray) -> np.ndarray:
    ctx = Context(Backend(2))
    out = ctx.mul_mat(ctx.weight(weight), ctx.input(np.ascontiguousarray(x), "x"))
    ctx.set_output(out)
    ctx.compute()
    return ctx.read(out).copy()


@pytest.mark.parametrize("k", [160, 192, 32 * 67, 32 * 130])
def test_every_product_equals_vec_dot(isa, k):
    """Batches of 1 to 70 rows (16-row prompt tiles with 1 to 8 columns, the rest
    pair by pair) over 40 and 21 weight rows, odd and even block counts, rows
    past the tiles' chunks of 64 blocks: each element is vec_dot of its pair,
    and the same bits as the scalar table's."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((70, k)) * rng.uniform(0.1, 4.0, (70, 1))).astype(np.float32)
    for n in (40, 21):
        data = random_blocks(rng, n * k // 32)
        rows = data.reshape(n, -1)
        dots = np.array([[_core.vec_dot(MXFP4, rows[i], x[j]) for i in range(n)] for j in range(70)], np.float32)
        with forced_isa("scalar"):
            want = mul_mat(Weight(k, n, data), x)
        assert np.array_equal(bits(want), bits(dots)), (isa, n)
        for m in (1, 3, 8, 9, 12, 17, 64, 70):
            got = mul_mat(Weight(k, n, data), x[:m])
            mismatch = np.argwhere(bits(got) != bits(dots[:m]))
            assert mismatch.size == 0, (isa, n, m, mismatch[:5].tolist())
