"""The matmul's GEMM micro-kernels (4 weight rows x up to 4 activation rows)
against vec_dot: every element of a product must be bit-identical to
vec_dot of its (weight row, activation row) pair under the same instruction
set, whatever the batch around it (batch invariance).

Weight rows n = 21, 22, 23 leave a last tile of 1, 2 and 3 rows, and 40
(a multiple of 8: the decoding kernels' 8-row groups) none; activation rows
m = 1, 3, 4, 5, 17, 64, 70 give tiles of 1, 2, 3 and 4 columns (a single
row is the decode path).  Where a type packs 16 weight rows for a prompt
tile, the first 16 rows of a batch of 8 or more take that path and the rest
the 4-row tiles."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import CHILD_CWD, X86_SIMD_ISAS, available_isas, child_env, forced_isa
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from pyengine import _core
from pyengine.ml.context import Backend, Context

SIMD_ISAS = [isa for isa in available_isas() if isa in X86_SIMD_ISAS]
LEGACY = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
KQUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
TYPES = LEGACY + KQUANTS + (T.MXFP4,)
BATCHES = (1, 3, 4, 5, 11, 17, 64, 70)   # 11 and 17: packed tiles ending in 3 and 1 columns
ROWS = (21, 22, 23, 40)

# block bytes and the offsets of the f16 scales in a block
LAYOUT = {
    T.Q4_0: (18, (0,)), T.Q4_1: (20, (0, 2)), T.Q5_0: (22, (0,)), T.Q5_1: (24, (0, 2)),
    T.Q8_0: (34, (0,)), T.Q4_K: (144, (0, 2)), T.Q5_K: (176, (0, 2)), T.Q6_K: (210, (208,)),
    T.IQ4_NL: (18, (0,)), T.MXFP4: (17, ()),
}
# the offsets of the E8M0 exponents in a block
E8M0_OFFSETS = {T.MXFP4: (0,)}


def row_length(qtype: T) -> int:
    return 512 if qtype in KQUANTS else 160


def random_weights(qtype: T, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of random block bytes (every code, fifth-bit and scale pattern)
    with finite f16 scales of either sign, as one flat uint8 array."""
    size, scale_offsets = LAYOUT[qtype]
    blocks = rng.integers(0, 256, (rows * k // (256 if qtype in KQUANTS else 32), size), dtype=np.uint8)
    for off in scale_offsets:
        scales = (rng.uniform(0.002, 0.05, len(blocks)) * rng.choice([-1, 1], len(blocks))).astype(np.float16)
        blocks[:, off:off + 2] = scales.view(np.uint8).reshape(-1, 2)
    for off in E8M0_OFFSETS.get(qtype, ()):
        blocks[:, off] = rng.integers(118, 124, len(blocks))   # scales 2^-10 .. 2^-5
    return blocks.reshape(-1)


class Weight:
    """What Context.weight() takes."""

    def __init__(self, qtype: T, k: int, n: int, data: np.ndarray) -> None:
        self.name, self.type, self.shape, self.data = "w", int(qtype), (k, n), data


def mul_mat(weight: Weight, x: np.ndarray) -> np.ndarray:
    ctx = Context(Backend(2))
    out = ctx.mul_mat(ctx.weight(weight), ctx.input(np.ascontiguousarray(x), "x"))
    ctx.set_output(out)
    ctx.compute()
    return ctx.read(out).copy()


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def case(qtype: T, n: int, seed: int):
    rng = np.random.default_rng(seed)
    k = row_length(qtype)
    data = random_weights(qtype, n, k, rng)
    x = (rng.standard_normal((max(BATCHES), k)) * rng.uniform(0.1, 4.0, (max(BATCHES), 1))).astype(np.float32)
    return Weight(qtype, k, n, data), data.reshape(n, -1), x


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_tile_shape_equals_vec_dot(isa: str, qtype: T) -> None:
    """Each element of every batch equals vec_dot of its pair (the row alone),
    bit for bit."""
    for n in ROWS:
        weight, rows, x = case(qtype, n, seed=int(qtype) * 100 + n)
        with forced_isa(isa):
            dots = np.array([[_core.vec_dot(int(qtype), rows[i], x[j]) for i in range(n)]
                             for j in range(max(BATCHES))], np.float32)
            for m in BATCHES:
                got = mul_mat(weight, x[:m])
                assert got.shape == (m, n)
                mismatch = np.argwhere(bits(got) != bits(dots[:m]))
                assert mismatch.size == 0, (isa, qtype.name, n, m, mismatch[:5].tolist())


@pytest.mark.parametrize("isa", [isa for isa in available_isas() if isa != "avx2"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_x86_table_gives_avx2s_bits(isa: str, qtype: T) -> None:
    """AVX-VNNI's and AVX-512's integer dot products (vpdpbusd) sum what
    AVX2's maddubs + madd sum, the portable table's plain integer sums the
    same, and the float steps are the same: every product, decoding or
    prompt tile, 16-row packed or not, the same bits (the portable table is
    there on every CPU, so an AVX2-only one checks too)."""
    weight, _, x = case(qtype, 40, seed=31 + int(qtype))
    x = np.concatenate([x, x[::-1]])
    for m in (1, 2, 4, 5, 17, 64, 70, 140):
        with forced_isa("avx2"):
            want = mul_mat(weight, x[:m])
        with forced_isa(isa):
            got = mul_mat(weight, x[:m])
        mismatch = np.argwhere(bits(got) != bits(want))
        assert mismatch.size == 0, (isa, qtype.name, m, mismatch[:5].tolist())


def float_weight(qtype: T, n: int, k: int, rng: np.random.Generator) -> Weight:
    """An F32, F16 or BF16 weight of n rows of k random elements."""
    values = rng.standard_normal((n, k)).astype(np.float32)
    if qtype == T.F16:
        data = values.astype(np.float16).view(np.uint8)
    elif qtype == T.BF16:
        data = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        data = values.view(np.uint8)
    return Weight(qtype, k, n, data.reshape(-1))


@pytest.mark.parametrize("isa", [isa for isa in available_isas() if isa != "avx2"])
@pytest.mark.parametrize("qtype", (T.F32, T.F16, T.BF16), ids=lambda t: t.name)
def test_float_products_are_the_same_on_every_table(isa: str, qtype: T) -> None:
    """The float types' products (four 8-lane accumulators over 32 elements, the rest in
    double) give AVX2's bits on every table, the scalar one too, alone or in a batch, for
    row lengths with and without a tail."""
    rng = np.random.default_rng(5 + int(qtype))
    for k in (64, 200, 256, 1000):
        weight = float_weight(qtype, 24, k, rng)
        x = rng.standard_normal((17, k)).astype(np.float32)
        for m in (1, 4, 17):
            with forced_isa("avx2"):
                want = mul_mat(weight, x[:m])
            with forced_isa(isa):
                got = mul_mat(weight, x[:m])
            mismatch = np.argwhere(bits(got) != bits(want))
            assert mismatch.size == 0, (isa, qtype.name, k, m, mismatch[:5].tolist())


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_row_alone_equals_row_in_batch(isa: str, qtype: T) -> None:
    """A row computed alone (the decode kernel) equals the same row inside a
    prompt batch (the 4 x 4 kernel, the packed tiles), in every position of a
    tile: one arithmetic whatever the batch around it."""
    for n in (23, 40):
        weight, _, x = case(qtype, n, seed=7 + int(qtype))
        with forced_isa(isa):
            batch = mul_mat(weight, x[:70])
            for j in (0, 1, 2, 3, 5, 63, 64, 69):
                alone = mul_mat(weight, x[j:j + 1])
                assert np.array_equal(bits(alone[0]), bits(batch[j])), (isa, qtype.name, n, j)


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemm_close_to_reference(isa: str, qtype: T) -> None:
    """The tiles compute the right numbers: within float rounding of the
    scalar reference dot product (same quantized activations)."""
    weight, rows, x = case(qtype, 22, seed=11 + int(qtype))
    partner = _core.vec_dot_type(int(qtype))
    with forced_isa(isa):
        got = mul_mat(weight, x[:17])
        blocks = [_core.quantize(partner, row, reference=False) for row in x[:17]]
    ref = np.array([[_core.vec_dot_blocks(int(qtype), rows[i], a, x.shape[1], reference=True) for i in range(22)]
                    for a in blocks])
    scale = np.abs(ref).max()
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got - ref)) <= 2e-5 * scale, (isa, qtype.name)


_SWITCH_CHILD = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from test_gemm import TYPES, case, mul_mat
out = [mul_mat(w, x[:9]) for w, _, x in (case(t, 22, seed=3) for t in TYPES)]
np.save(sys.argv[1], np.stack([o.view(np.uint32) for o in out]))
"""


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_vec_dot_path_equals_gemm_path(isa: str, tmp_path) -> None:
    """PYENGINE_GEMM=0 (tiles fall back to vec_dot pair by pair) gives the
    same bits as the GEMM kernels, for every type."""
    results = {}
    for switch in ("0", "1"):
        path = tmp_path / f"gemm{switch}.npy"
        env = child_env(PYENGINE_GEMM=switch, PYENGINE_ISA=isa)
        code = _SWITCH_CHILD.format(tests=os.path.dirname(__file__))
        subprocess.run([sys.executable, "-c", code, str(path)], env=env, cwd=CHILD_CWD, check=True, timeout=120)
        results[switch] = np.load(path)
    assert np.array_equal(results["0"], results["1"])


def mul_mat_threads(weight: Weight, x: np.ndarray, n_threads: int, repeat: int) -> list[np.ndarray]:
    """The product computed `repeat` times by one pool of n_threads."""
    ctx = Context(Backend(n_threads))
    out = ctx.mul_mat(ctx.weight(weight), ctx.input(np.ascontiguousarray(x), "x"))
    ctx.set_output(out)
    results = []
    for _ in range(repeat):
        ctx.compute()
        results.append(ctx.read(out).copy())
    return results


@pytest.mark.parametrize("qtype", (T.Q4_1, T.Q8_0, T.Q4_K), ids=lambda t: t.name)
def test_decode_rows_split_over_threads(qtype: T) -> None:
    """Decoding splits the weight rows into one contiguous range per thread,
    and a thread that is done takes tasks from the ends of the others'.  With
    more threads than cores, threads get preempted and the stealing varies
    from run to run: every row must still be computed once, with the same
    bits as one thread computes it."""
    weight, _, x = case(qtype, 16 * 41 + 5, seed=5)
    for m in (1, 3):
        alone = mul_mat_threads(weight, x[:m], 1, 1)[0]
        for n_threads in (2, 3, 7):
            for got in mul_mat_threads(weight, x[:m], n_threads, repeat=8):
                assert np.array_equal(bits(got), bits(alone)), (qtype.name, m, n_threads)


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", (T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0), ids=lambda t: t.name)
def test_decoding_long_rows_equals_vec_dot(isa: str, qtype: T) -> None:
    """The decode kernel takes a row's blocks in chunks (scales first, then the
    products): rows of 2 chunks and a part (65 blocks) equal vec_dot, bit for bit,
    for 1 to 4 activation rows."""
    k, n = 32 * 65, 24
    rng = np.random.default_rng(int(qtype))
    data = random_weights(qtype, n, k, rng)
    rows = data.reshape(n, -1)
    x = (rng.standard_normal((4, k)) * rng.uniform(0.1, 4.0, (4, 1))).astype(np.float32)
    with forced_isa(isa):
        for m in (1, 2, 3, 4):
            got = mul_mat(Weight(qtype, k, n, data), x[:m])
            dots = np.array([[_core.vec_dot(int(qtype), rows[i], x[j]) for i in range(n)] for j in range(m)],
                            np.float32)
            assert np.array_equal(bits(got), bits(dots)), (isa, qtype.name, m)


def test_decode_rows_more_tasks_than_a_range_holds() -> None:
    """A weight with more 16-row tasks than a range counts (65535) takes
    bigger tasks: every row is still computed, as vec_dot computes it."""
    n, k = 16 * 0xFFFF + 40, 32
    rng = np.random.default_rng(9)
    data = random_weights(T.Q8_0, n, k, rng)
    x = rng.standard_normal((1, k)).astype(np.float32)
    got = mul_mat_threads(Weight(T.Q8_0, k, n, data), x, 2, 1)[0][0]
    rows = data.reshape(n, -1)
    for i in (0, 1, n // 2, n - 41, n - 1):
        assert bits(got[i]) == bits(np.float32(_core.vec_dot(int(T.Q8_0), rows[i], x[0]))), i
    ref = dequantize(data, T.Q8_0).reshape(n, k) @ x[0]   # every row: within q8 rounding of the float product
    assert np.max(np.abs(got - ref)) <= 0.02 * np.abs(ref).max()


@pytest.mark.parametrize("isa", SIMD_ISAS)
def test_f16_weights_in_every_tile_equal_the_row_product(isa: str) -> None:
    """F16 weights in a batch go through tiles (the row product's four
    accumulators per pair, each weight row converted once for several
    activation rows) and alone through the row product; each element equals
    vec_dot, bit for bit, rows of whole vector steps (256) or not (200, pair by
    pair) alike."""
    rng = np.random.default_rng(16)
    for k in (256, 200):
        for n in (21, 24):
            rows = rng.standard_normal((n, k)).astype(np.float16)
            weight = Weight(T.F16, k, n, rows.view(np.uint8).reshape(-1))
            x = rng.standard_normal((max(BATCHES), k)).astype(np.float32)
            with forced_isa(isa):
                dots = np.array([[_core.vec_dot(int(T.F16), rows[i].view(np.uint8), x[j]) for i in range(n)]
                                 for j in range(max(BATCHES))], np.float32)
                for m in BATCHES:
                    got = mul_mat(weight, x[:m])
                    mismatch = np.argwhere(bits(got) != bits(dots[:m]))
                    assert mismatch.size == 0, (isa, k, n, m, mismatch[:5].tolist())


def test_products_of_one_activation_equal_each_alone() -> None:
    """Products of one activation in a row (attention's Q, K and V) run without a
    barrier between them, the later ones on the rows the first quantized: weights
    wanting another activation layout (Q8_0's q8_0 rows among Q4_1's q8_1, plain
    Q4_1's rows without the float scales interleaved Q4_1 takes) or another split of the
    scratch between the threads (Q4_K interleaved and Q6_K: their own packed and unpacked
    rows) start a new run.
    Every result equals the product computed alone, bit for bit, however many
    threads share the work and however the stealing falls."""
    rng = np.random.default_rng(77)
    k = 256
    rows8 = {T.Q4_1: 64, T.Q4_K: 66}   # PE_TYPE_*_X8 (pe.h)
    weights = []
    for qtype, n, interleave in ((T.Q4_1, 48, True), (T.Q4_1, 40, True), (T.Q4_1, 24, False),
                                 (T.Q4_1, 16, True), (T.Q8_0, 32, False), (T.Q8_0, 21, False),
                                 (T.Q5_1, 24, False), (T.Q4_K, 16, False), (T.Q4_K, 32, True),
                                 (T.Q6_K, 48, False), (T.Q4_K, 64, True)):
        data = random_weights(qtype, n, k, rng)
        w = Weight(qtype, k, n, data)
        if interleave:
            packed = np.empty_like(data)
            _core.repack_rows8(rows8[qtype], data, packed, k, n)
            w = Weight(qtype, k, n, packed)
            w.type = rows8[qtype]
        weights.append(w)
    x = (rng.standard_normal((17, k)) * rng.uniform(0.1, 4.0, (17, 1))).astype(np.float32)
    for m in (1, 3, 4, 17):
        alone = [mul_mat_threads(w, x[:m], 1, 1)[0] for w in weights]
        for n_threads in (1, 2, 3, 7):
            ctx = Context(Backend(n_threads))
            xt = ctx.input(np.ascontiguousarray(x[:m]), "x")
            outs = []
            for w in weights:
                out = ctx.mul_mat(ctx.weight(w), xt)
                ctx.set_output(out)
                outs.append(out)
                ctx.reshape(out, (out.shape[0] * out.shape[1],))   # a view between two products
            for _ in range(6):
                ctx.compute()
                for w, out, want in zip(weights, outs, alone):
                    assert np.array_equal(bits(ctx.read(out)), bits(want)), (w.type, m, n_threads)
