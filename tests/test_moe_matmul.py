"""Products with experts (mul_mat_id) against vec_dot: a batch groups its
(token, slot) pairs by expert and multiplies each group as one GEMM through
the dense path's tiles, a decoded token takes each pair alone through the
decoding kernels; either way every element must be bit-identical to vec_dot
of its (expert row, activation row) pair, whatever the batch, the experts'
spread over it and the layout the weights are stored in (as the file has
them, or interleaved by 8 rows)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import X86_SIMD_ISAS, available_isas, forced_isa
from gguf import GGMLQuantizationType as T
from test_gemm import bits, random_weights, row_length
from test_rows8 import INTERLEAVED

from pyengine import _core
from pyengine.ml.context import Backend, Context

SIMD_ISAS = [isa for isa in available_isas() if isa in X86_SIMD_ISAS]
TYPES = (T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.MXFP4)
BATCHES = (1, 2, 3, 5, 8, 17, 33, 64, 70)
# (experts, chosen per token, rows per expert): few experts give groups of many
# tokens (packed prompt tiles), many experts groups of one or two
LAYOUTS = ((4, 2, 40), (16, 4, 24), (64, 8, 16))


class Experts:
    """What Context.weight() takes: a [k, n, E] stack of expert rows."""

    def __init__(self, qtype: int, k: int, n: int, n_exp: int, data: np.ndarray) -> None:
        self.name, self.type, self.shape, self.data = "experts", int(qtype), (k, n, n_exp), data


def mul_mat_id(w: Experts, x: np.ndarray, ids: np.ndarray, n_threads: int = 2) -> np.ndarray:
    ctx = Context(Backend(n_threads))
    out = ctx.mul_mat_id(ctx.weight(w), ctx.input(np.ascontiguousarray(x), "x"),
                         ctx.input(np.ascontiguousarray(ids), "ids"))
    ctx.set_output(out)
    ctx.compute()
    return ctx.read(out).copy()


def routing(rng: np.random.Generator, n_tok: int, n_exp: int, n_used: int) -> np.ndarray:
    """Distinct experts per token, skewed so that some experts take many tokens."""
    p = rng.dirichlet(np.full(n_exp, 0.3))
    return np.stack([rng.choice(n_exp, n_used, replace=False, p=p) for _ in range(n_tok)]).astype(np.int32)


def expected(rows: np.ndarray, n: int, x: np.ndarray, ids: np.ndarray, qtype: int) -> np.ndarray:
    """vec_dot of every pair; x [T, U|1, k], rows the plain expert rows [E * n, bytes]."""
    n_tok, n_used = ids.shape
    want = np.empty((n_tok, n_used, n), np.float32)
    for t in range(n_tok):
        for u in range(n_used):
            a = x[t, u if x.shape[1] > 1 else 0]
            e = int(ids[t, u])
            want[t, u] = [_core.vec_dot(qtype, rows[e * n + i], a) for i in range(n)]
    return want


def case(qtype: int, n_exp: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    k = row_length(qtype)
    data = random_weights(qtype, n_exp * n, k, rng)
    return rng, k, data


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_pair_equals_vec_dot(isa: str, qtype: T) -> None:
    for n_exp, n_used, n in LAYOUTS:
        rng, k, data = case(qtype, n_exp, n, seed=int(qtype) * 10 + n_exp)
        w = Experts(qtype, k, n, n_exp, data)
        rows = data.reshape(n_exp * n, -1)
        for n_tok in BATCHES:
            ids = routing(rng, n_tok, n_exp, n_used)
            shared = n_tok % 2 == 0   # one input row for all slots (gate, up) or one per slot (down)
            x = (rng.standard_normal((n_tok, 1 if shared else n_used, k)) * 2).astype(np.float32)
            with forced_isa(isa):
                want = expected(rows, n, x, ids, int(qtype))
                got = mul_mat_id(w, x, ids)
            mismatch = np.argwhere(bits(got) != bits(want))
            assert mismatch.size == 0, (isa, qtype.name, n_exp, n_used, n_tok, mismatch[:5].tolist())


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("qtype", list(INTERLEAVED), ids=lambda t: T(t).name)
def test_interleaved_experts_equal_the_plain_ones(isa: str, qtype: int) -> None:
    """Expert stacks repacked by 8 rows (each expert's rows in 8s: groups never
    straddle two experts) give the plain stack's bits, decoding and batches."""
    n_exp, n_used, n = 8, 2, 24
    rng, k, data = case(qtype, n_exp, n, seed=qtype)
    packed = np.empty_like(data)
    _core.repack_rows8(INTERLEAVED[qtype], data, packed, k, n_exp * n)
    plain = Experts(qtype, k, n, n_exp, data)
    rows8 = Experts(INTERLEAVED[qtype], k, n, n_exp, packed)
    for n_tok in (1, 4, 40, 70, 300):
        ids = routing(rng, n_tok, n_exp, n_used)
        x = (rng.standard_normal((n_tok, 1, k)) * 2).astype(np.float32)
        with forced_isa(isa):
            want, got = mul_mat_id(plain, x, ids), mul_mat_id(rows8, x, ids)
        assert np.array_equal(bits(got), bits(want)), (isa, n_tok)


def test_threads_do_not_change_bits() -> None:
    rng, k, data = case(T.Q4_K, 16, 32, seed=5)
    w = Experts(T.Q4_K, k, 32, 16, data)
    ids = routing(rng, 50, 16, 4)
    x = rng.standard_normal((50, 4, k)).astype(np.float32)
    one = mul_mat_id(w, x, ids, n_threads=1)
    for nth in (2, 3, 5):
        assert np.array_equal(bits(mul_mat_id(w, x, ids, n_threads=nth)), bits(one)), nth
