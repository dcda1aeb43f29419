"""Q4_1, Q4_0, Q4_K, IQ4_NL, Q8_0, Q5_0, MXFP4 and Q6_K weights interleaved by 8 rows
(csrc/quant/ref_rows8.c, pe_type_rows8 in pe.h).

On x86 the engine stores such weights that are only multiplied with their rows
interleaved by 8, for the decoding kernel (x86_gemm_rows8.h: Q4_1, Q4_K, Q8_0, Q5_0, MXFP4 and Q6_K;
Q4_0 and IQ4_NL have none and stay as the file has them); larger batches
unpack the rows again.  Either way every product must equal the weight as the
file has it, bit for bit, under every instruction set (a table without the
decoding kernel unpacks for every product)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import CHILD_CWD, X86_SIMD_ISAS, available_isas, child_env, forced_isa
from test_gemm import Weight, bits, mul_mat, random_weights

from pyengine import _core
from pyengine.errors import NativeError
from pyengine.ml.context import Backend, Context

Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, IQ4_NL, MXFP4 = 2, 3, 6, 8, 12, 14, 20, 39
INTERLEAVED = {Q4_1: 64, Q4_0: 65, Q4_K: 66, IQ4_NL: 67, Q8_0: 68, Q5_0: 69, MXFP4: 70, Q6_K: 71}   # PE_TYPE_*_X8 in pe.h
TYPES = pytest.mark.parametrize("qtype", list(INTERLEAVED),
                                ids=["Q4_1", "Q4_0", "Q4_K", "IQ4_NL", "Q8_0", "Q5_0", "MXFP4", "Q6_K"])
BLOCK = {Q4_0: 32, Q4_1: 32, IQ4_NL: 32, Q4_K: 256, Q8_0: 32, Q5_0: 32, MXFP4: 32, Q6_K: 256}
X86_ISAS = [isa for isa in available_isas() if isa in ("scalar", *X86_SIMD_ISAS)]


def interleaved(qtype: int, n: int, k: int, seed: int) -> tuple[Weight, Weight, np.ndarray]:
    """(the weight as a file has it, the same interleaved, activation rows)."""
    rng = np.random.default_rng(seed)
    data = random_weights(qtype, n, k, rng)
    packed = np.empty_like(data)
    _core.repack_rows8(INTERLEAVED[qtype], data, packed, k, n)
    plain, rows8 = Weight(qtype, k, n, data), Weight(qtype, k, n, packed)
    rows8.type = INTERLEAVED[qtype]
    x = (rng.standard_normal((530, k)) * rng.uniform(0.1, 4.0, (530, 1))).astype(np.float32)
    return plain, rows8, x


@TYPES
@pytest.mark.parametrize("isa", X86_ISAS)
@pytest.mark.parametrize("n, blocks", [(24, 5), (48, 65)])
def test_products_equal_the_plain_weights(qtype: int, isa: str, n: int, blocks: int) -> None:
    """Batches of 1 to 48 rows (the decoding kernel up to its type's limit, 4 columns a
    pass, in pairs and a single one), of 49 to 300 (past the type's limit unpacked: tiles, packed prompt
    tiles, in blocks of 256 columns; 259 leaves a block of 3, which is no decoding batch;
    AVX-512's pair kernels take up to 512 rows of some types) and of 530 (unpacked on every
    ISA), a last group of 8 rows in a tile of 16, rows of 65 blocks: the same bits as the
    plain weight."""
    k = BLOCK[qtype] * (blocks if BLOCK[qtype] == 32 else blocks // 4)
    plain, rows8, x = interleaved(qtype, n, k, seed=n + k)
    with forced_isa(isa):
        for m in (1, 2, 3, 4, 5, 8, 17, 48, 49, 70, 259, 300, 530):
            want, got = mul_mat(plain, x[:m]), mul_mat(rows8, x[:m])
            bad = np.argwhere(bits(got) != bits(want))
            assert bad.size == 0, (qtype, isa, n, k, m, bad[:4].tolist())


@TYPES
def test_decoding_kernel_equals_vec_dot(qtype: int) -> None:
    """Against the row kernel itself, not another product of the same file."""
    plain, rows8, x = interleaved(qtype, 16, BLOCK[qtype] * 3, seed=5)
    plain_rows = plain.data.reshape(16, -1)
    for isa in X86_ISAS:
        with forced_isa(isa):
            want = np.array([[_core.vec_dot(qtype, row, a) for row in plain_rows] for a in x[:3]],
                            np.float32)
            assert np.array_equal(bits(mul_mat(rows8, x[:3])), bits(want)), isa


_PAIRS_CHILD = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from test_rows8 import INTERLEAVED, BLOCK, interleaved, mul_mat
out = []
for qtype in INTERLEAVED:
    _, rows8, x = interleaved(qtype, 40, BLOCK[qtype] * 8, seed=qtype)
    out += [mul_mat(rows8, x[:m]).view(np.uint32).ravel() for m in (1, 3, 4, 17, 100)]
np.save(sys.argv[1], np.concatenate(out))
"""


def test_pair_kernels_equal_the_8_row_ones(tmp_path) -> None:
    """AVX-512's decoding kernels over 16 rows (x86_gemm_rows16.h) give the bits of its
    8-row ones (PYENGINE_GEMM=8 leaves them out), every interleaved type, batches up
    to the pair kernels' prompt sizes, 40 rows (two pairs and a lone group).  (Without
    AVX-512 both runs take the same kernels.)"""
    results = {}
    for switch in ("8", "1"):
        path = tmp_path / f"gemm{switch}.npy"
        code = _PAIRS_CHILD.format(tests=os.path.dirname(__file__))
        subprocess.run([sys.executable, "-c", code, str(path)], env=child_env(PYENGINE_GEMM=switch),
                       cwd=CHILD_CWD, check=True, timeout=120)
        results[switch] = np.load(path)
    assert np.array_equal(results["8"], results["1"])


def test_interleaving_is_offered_where_a_decoding_kernel_is() -> None:
    """The x86 SIMD tables interleave Q4_1, Q4_K, Q8_0, Q5_0, MXFP4 and Q6_K (and nothing else: Q4_0's
    and IQ4_NL's rows stay as the file has them); the scalar one does not."""
    decoded = (Q4_1, Q4_K, Q8_0, Q5_0, MXFP4, Q6_K)
    for isa in X86_ISAS:
        with forced_isa(isa):
            for qtype, rows8 in INTERLEAVED.items():
                assert _core.rows8_type(qtype) == (rows8 if isa != "scalar" and qtype in decoded else -1)
                assert _core.rows8_type(rows8) == -1
            assert _core.rows8_type(7) == -1 and _core.rows8_type(13) == -1   # Q5_1, Q5_K


def test_bad_shapes_and_uses_are_errors() -> None:
    data = random_weights(Q4_1, 8, 64, np.random.default_rng(0))
    q4_1x8 = INTERLEAVED[Q4_1]
    with pytest.raises(ValueError):
        _core.repack_rows8(q4_1x8, data[:-1], np.empty_like(data), 64, 8)
    with pytest.raises(NativeError, match="8 rows"):
        _core.repack_rows8(q4_1x8, data, np.empty_like(data), 128, 4)
    with pytest.raises(NativeError, match="no interleaved type"):
        _core.repack_rows8(Q4_1, data, np.empty_like(data), 64, 8)
    ctx = Context(Backend(1))
    odd = Weight(Q4_1, 64, 6, data[: 6 * 40])
    odd.type = q4_1x8
    with pytest.raises(NativeError, match="rows in 8s"):
        ctx.mul_mat(ctx.weight(odd), ctx.input(np.zeros((1, 64), np.float32), "x"))
    with pytest.raises(NativeError, match="rows in 8s"):
        ctx.get_rows(ctx.weight(odd), ctx.input(np.zeros(1, np.int32), "ids"))


@TYPES
@pytest.mark.parametrize("n_threads", [1, 3])
def test_lookups_read_interleaved_tables(qtype: int, n_threads: int) -> None:
    """A table interleaved by 8 rows (a tied embedding the output projection multiplies)
    serves lookups too: any rows, repeated, in any order, equal the plain table's (row ids
    out of range are an error either way)."""
    plain, rows8, _ = interleaved(qtype, 40, BLOCK[qtype] * 2, seed=11)
    ids = np.array([0, 39, 7, 8, 8, 15, 16, 23, 31, 32, 1, 38, 0], np.int32)
    got = {}
    for name, table in (("plain", plain), ("rows8", rows8)):
        ctx = Context(Backend(n_threads))
        out = ctx.get_rows(ctx.weight(table), ctx.input(ids, "ids"))
        ctx.set_output(out)
        ctx.compute()
        got[name] = ctx.read(out).copy()
        bad = Context(Backend(n_threads))
        out = bad.get_rows(bad.weight(table), bad.input(np.array([3, 40], np.int32), "ids"))
        bad.set_output(out)
        with pytest.raises(NativeError, match="out of range"):
            bad.compute()
    assert np.array_equal(bits(got["rows8"]), bits(got["plain"]))


def test_mxfp4_exponents_at_the_ends() -> None:
    """MXFP4's decoding kernel converts 8 rows' E8M0 exponents at once: the subnormal
    scales (e 0 and 1), the largest (254) and E8M0's NaN code (255, read as 2^127) give
    vec_dot's bits too, the rows whose products overflow (to NaN) among them."""
    rng = np.random.default_rng(7)
    n, k = 16, 32 * 9
    data = random_weights(MXFP4, n, k, rng).reshape(n, -1, 17)
    ends = ([0, 1], [0, 1, 2, 3], [126, 127, 128], [253, 254, 255], [1, 254])   # by row, in turn
    for r in range(n):
        data[r, :, 0] = rng.choice(ends[r % len(ends)], data.shape[1])
    data = data.reshape(-1)
    packed = np.empty_like(data)
    _core.repack_rows8(INTERLEAVED[MXFP4], data, packed, k, n)
    rows8 = Weight(MXFP4, k, n, packed)
    rows8.type = INTERLEAVED[MXFP4]
    x = (rng.standard_normal((4, k)) * 1e3).astype(np.float32)
    plain_rows = data.reshape(n, -1)
    want = np.array([[_core.vec_dot(MXFP4, row, a) for row in plain_rows] for a in x], np.float32)
    assert np.isnan(want).any() and (np.abs(want[np.isfinite(want)]) < 1e-30).any()
    for isa in X86_ISAS:
        with forced_isa(isa):
            assert np.array_equal(bits(mul_mat(rows8, x)), bits(want)), isa
