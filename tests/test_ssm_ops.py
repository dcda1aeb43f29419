"""The recurrent layers' ops (csrc/cpu/ops_ssm.c): ssm_conv, ssm_scan, delta_net (token by token
and chunked) and l2_norm, against float64 references on random inputs, with several sequences in
one batch reading and writing their states in a caller-owned buffer; the same bits on every
instruction set and thread count, and whatever other sequences share the batch.

Shapes follow GGML's order (ne[0] innermost); numpy arrays are the reverse."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import available_isas, forced_isa

from pyengine.ml.context import Backend, Context

ISAS = [isa for isa in available_isas() if not isa.startswith("neon")]
# float32 against float64: the largest error over the largest reference value (measured on
# these cases: conv <= 1e-7, scan <= 5e-7, delta_net <= 8e-7 in either form)
TOL_CONV = 5e-7
TOL_SCAN = 2e-6
TOL_DELTA = 3e-6


def rel_err(got, want) -> float:
    want = np.asarray(want, np.float64)
    return float(np.max(np.abs(np.asarray(got, np.float64) - want)) / max(np.max(np.abs(want)), 1e-30))


def seq_table(spans) -> np.ndarray:
    """spans: (first, count, row_in, row_out, pos) per sequence -> I32 [5, S] as numpy (S, 5)."""
    return np.array(spans, np.int32).reshape(-1, 5)


def run(build, arrays: dict, state: np.ndarray, seqs: np.ndarray, threads: int = 1):
    """Build one op over inputs `arrays` (numpy, GGML order reversed) and a copy of `state`;
    returns (output, the state buffer after)."""
    ctx = Context(Backend(threads))
    keep = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in arrays.items()}
    st = np.array(state, np.float32, copy=True)
    tq = np.ascontiguousarray(seqs, np.int32)
    t = {name: ctx.input(a, name) for name, a in keep.items()}
    out = build(ctx, t, ctx.input(st, "state"), ctx.input(tq, "seqs"))
    ctx.set_output(out)
    ctx.compute()
    return ctx.read(out).copy(), st


# ---- references (float64) ------------------------------------------------------------------

def conv_ref(x, w, window, shift=0):
    """x (T, d), w (d, K), window (K-1, d) -> y (T, d), new window.  shift: a wrong variant."""
    K = w.shape[1]
    xx = np.concatenate([window, x]).astype(np.float64)
    y = np.stack([sum(w[:, j] * xx[t + j + shift] for j in range(K) if 0 <= t + j + shift < len(xx))
                  for t in range(len(x))])
    return y, xx[len(xx) - (K - 1):]


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def scan_ref(x, dt, A, B, C, D, bias, S):
    """x (T, H, P), dt (T, H), A (H), B/C (T, G, N), D (H), bias (H), S (H, N, P) -> y (T, H, P), S."""
    T, H, P = x.shape
    G = B.shape[1]
    S = S.astype(np.float64).copy()
    y = np.zeros((T, H, P))
    for t in range(T):
        for h in range(H):
            g = h // (H // G)
            step = softplus(dt[t, h] + bias[h])
            S[h] = S[h] * np.exp(step * A[h]) + np.outer(B[t, g], x[t, h] * step)
            y[t, h] = S[h].T @ C[t, g] + D[h] * x[t, h]
    return y, S


def delta_ref(q, k, v, g, beta, S, scale, decay=True):
    """q, k (T, Hk, Dk), v (T, H, Dv), g, beta (T, H), S (H, Dk, Dv) -> o (T, H, Dv), S."""
    T, H, _ = v.shape
    Hk = q.shape[1]
    S = S.astype(np.float64).copy()
    o = np.zeros(v.shape)
    for t in range(T):
        for h in range(H):
            kk, qq = k[t, h % Hk].astype(np.float64), q[t, h % Hk] * scale
            if decay:
                S[h] *= np.exp(g[t, h])
            d = (v[t, h] - S[h].T @ kk) * beta[t, h]
            S[h] += np.outer(kk, d)
            o[t, h] = S[h].T @ qq
    return o, S


def l2n(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


# ---- inputs --------------------------------------------------------------------------------

def conv_case(rng, d, K, counts, n_rows=None):
    T = sum(counts)
    n_rows = n_rows or 2 * len(counts)
    x = rng.standard_normal((T, d)).astype(np.float32)
    w = rng.standard_normal((d, K)).astype(np.float32)
    state = rng.standard_normal((n_rows, (K - 1) * d)).astype(np.float32)
    return x, w, state


def spans_for(counts, pos=None):
    """Sequence s: its tokens after the previous ones, reading row 2s and writing row 2s + 1."""
    firsts = np.cumsum([0, *counts[:-1]])
    pos = pos or [0] * len(counts)
    return seq_table([(f, n, 2 * s, 2 * s + 1, p) for s, (f, n, p) in enumerate(zip(firsts, counts, pos))])


def conv_op(ctx, t, state, seqs):
    return ctx.ssm_conv(t["x"], t["w"], state, seqs)


def scan_case(rng, P, H, G, N, counts):
    T = sum(counts)
    arrays = {"x": rng.standard_normal((T, H, P)), "dt": rng.standard_normal((T, H)) - 1.0,
              "A": -np.exp(rng.standard_normal(H) * 0.5), "B": rng.standard_normal((T, G, N)),
              "C": rng.standard_normal((T, G, N)), "D": rng.standard_normal(H), "bias": rng.standard_normal(H) * 0.5}
    state = rng.standard_normal((2 * len(counts), H * N * P)).astype(np.float32)
    return {k: a.astype(np.float32) for k, a in arrays.items()}, state


def scan_op(ctx, t, state, seqs):
    return ctx.ssm_scan(t["x"], t["dt"], t["A"], t["B"], t["C"], state, seqs, D=t["D"], dt_bias=t["bias"])


def delta_case(rng, Dk, Dv, Hk, H, counts):
    T = sum(counts)
    arrays = {"q": l2n(rng.standard_normal((T, Hk, Dk))), "k": l2n(rng.standard_normal((T, Hk, Dk))),
              "v": rng.standard_normal((T, H, Dv)), "g": -np.exp(rng.standard_normal((T, H)) - 2.0),
              "beta": 1 / (1 + np.exp(-rng.standard_normal((T, H))))}
    state = (rng.standard_normal((2 * len(counts), H * Dk * Dv)) * 0.1).astype(np.float32)
    return {k: a.astype(np.float32) for k, a in arrays.items()}, state


def delta_op(chunk, scale):
    def build(ctx, t, state, seqs):
        return ctx.delta_net(t["q"], t["k"], t["v"], t["g"], t["beta"], state, seqs, scale=scale, chunk=chunk)
    return build


# ---- ssm_conv ------------------------------------------------------------------------------

@pytest.mark.parametrize("d,K,counts", [(16, 4, [1]), (70, 4, [5]), (33, 3, [1, 7, 2]), (130, 4, [2, 1, 40]),
                                        (8, 2, [3]), (24, 5, [1, 2])])
def test_conv_against_the_float64_reference(d, K, counts):
    rng = np.random.default_rng(d * 100 + K)
    x, w, state = conv_case(rng, d, K, counts)
    y, after = run(conv_op, {"x": x, "w": w}, state, spans_for(counts))
    first = 0
    for s, n in enumerate(counts):
        win = state[2 * s].reshape(K - 1, d)
        want, new = conv_ref(x[first:first + n], w, win)
        assert rel_err(y[first:first + n], want) <= TOL_CONV
        assert rel_err(after[2 * s + 1].reshape(K - 1, d), new) <= TOL_CONV
        assert np.array_equal(after[2 * s], state[2 * s]), "the row read is left as it was"
        first += n


def test_conv_in_place_and_a_wrong_window_far_off():
    """Reading and writing one row (fewer tokens than the window: the old columns move down);
    the window shifted by one is measured far outside the tolerance."""
    rng = np.random.default_rng(5)
    d, K = 20, 4
    x, w, state = conv_case(rng, d, K, [2], n_rows=1)
    y, after = run(conv_op, {"x": x, "w": w}, state, seq_table([(0, 2, 0, 0, 9)]))
    want, new = conv_ref(x, w, state[0].reshape(K - 1, d))
    assert rel_err(y, want) <= TOL_CONV and rel_err(after[0].reshape(K - 1, d), new) <= TOL_CONV
    for shift in (-1, 1):
        wrong, _ = conv_ref(x, w, state[0].reshape(K - 1, d), shift)
        assert rel_err(y, wrong) > 1000 * TOL_CONV


def test_conv_of_strided_columns_as_lfm2_splits_them():
    """LFM2 cuts its in_proj output [3d, T] into B, C, x views; the conv takes the strided x."""
    rng = np.random.default_rng(8)
    d, K, T = 12, 3, 6
    bcx = rng.standard_normal((T, 3 * d)).astype(np.float32)
    w = rng.standard_normal((d, K)).astype(np.float32)
    state = rng.standard_normal((2, (K - 1) * d)).astype(np.float32)

    def build(ctx, t, st, seqs):
        part = [ctx.view(t["bcx"], (d, T), (4, 3 * d * 4), i * d * 4) for i in range(3)]
        conv = ctx.ssm_conv(ctx.mul(part[0], part[2]), t["w"], st, seqs)
        return ctx.mul(part[1], conv)

    y, _ = run(build, {"bcx": bcx, "w": w}, state, spans_for([T]))
    conv, _ = conv_ref(bcx[:, :d] * bcx[:, 2 * d:], w, state[0].reshape(K - 1, d))
    assert rel_err(y, bcx[:, d:2 * d] * conv) <= TOL_CONV


# ---- ssm_scan ------------------------------------------------------------------------------

@pytest.mark.parametrize("P,H,G,N,counts", [(8, 2, 1, 4, [1]), (16, 4, 2, 16, [9]), (12, 6, 3, 5, [1, 13, 4]),
                                            (64, 2, 1, 8, [3, 1])])
def test_scan_against_the_float64_reference(P, H, G, N, counts):
    rng = np.random.default_rng(P * H + N)
    a, state = scan_case(rng, P, H, G, N, counts)
    y, after = run(scan_op, a, state, spans_for(counts))
    first = 0
    for s, n in enumerate(counts):
        sl = slice(first, first + n)
        want, S = scan_ref(a["x"][sl], a["dt"][sl], a["A"], a["B"][sl], a["C"][sl], a["D"], a["bias"],
                           state[2 * s].reshape(H, N, P))
        assert rel_err(y[sl], want) <= TOL_SCAN
        assert rel_err(after[2 * s + 1].reshape(H, N, P), S) <= TOL_SCAN
        first += n


def test_scan_without_skip_and_bias():
    """D and dt_bias are optional (a model that adds them in its own graph)."""
    rng = np.random.default_rng(4)
    a, state = scan_case(rng, 16, 4, 2, 8, [1, 6])

    def build(ctx, t, st, seqs):
        return ctx.ssm_scan(t["x"], t["dt"], t["A"], t["B"], t["C"], st, seqs)

    y, after = run(build, a, state, spans_for([1, 6]))
    zero = np.zeros(4, np.float32)
    first = 0
    for s, n in enumerate([1, 6]):
        sl = slice(first, first + n)
        want, S = scan_ref(a["x"][sl], a["dt"][sl], a["A"], a["B"][sl], a["C"][sl], zero, zero,
                           state[2 * s].reshape(4, 8, 16))
        assert rel_err(y[sl], want) <= TOL_SCAN and rel_err(after[2 * s + 1].reshape(4, 8, 16), S) <= TOL_SCAN
        first += n


def test_scan_without_the_decay_is_far_off():
    rng = np.random.default_rng(3)
    a, state = scan_case(rng, 8, 2, 1, 4, [12])
    y, _ = run(scan_op, a, state, spans_for([12]))
    undecayed, _ = scan_ref(a["x"], a["dt"], np.zeros_like(a["A"]), a["B"], a["C"], a["D"], a["bias"],
                            state[0].reshape(2, 4, 8))
    assert rel_err(y, undecayed) > 1000 * TOL_SCAN


# ---- delta_net -----------------------------------------------------------------------------

DELTA_SHAPES = [(8, 8, 1, 1, [1]), (16, 12, 2, 4, [5]), (32, 32, 2, 2, [1, 70, 3]), (20, 24, 1, 3, [64]),
                (16, 16, 4, 4, [130])]


@pytest.mark.parametrize("chunk", [0, 16, 64])
@pytest.mark.parametrize("Dk,Dv,Hk,H,counts", DELTA_SHAPES)
def test_delta_against_the_float64_reference(Dk, Dv, Hk, H, counts, chunk):
    rng = np.random.default_rng(Dk * Dv + H + sum(counts))
    a, state = delta_case(rng, Dk, Dv, Hk, H, counts)
    scale = Dk ** -0.5
    pos = [7 * s for s in range(len(counts))]   # pieces cut off the chunk grid
    o, after = run(delta_op(chunk, scale), a, state, spans_for(counts, pos))
    first = 0
    for s, n in enumerate(counts):
        sl = slice(first, first + n)
        want, S = delta_ref(a["q"][sl], a["k"][sl], a["v"][sl], a["g"][sl], a["beta"][sl],
                            state[2 * s].reshape(H, Dk, Dv), scale)
        assert rel_err(o[sl], want) <= TOL_DELTA, (s, rel_err(o[sl], want))
        assert rel_err(after[2 * s + 1].reshape(H, Dk, Dv), S) <= TOL_DELTA
        first += n


def test_delta_chunked_against_token_by_token_and_without_decay():
    """The two forms agree within the tolerance (not in bits); the rule without its decay is
    measured far outside it."""
    rng = np.random.default_rng(11)
    Dk, Dv, H, T = 32, 32, 2, 150
    a, state = delta_case(rng, Dk, Dv, 2, H, [T])
    outs = {c: run(delta_op(c, 0.2), a, state, spans_for([T])) for c in (0, 64)}
    assert rel_err(outs[64][0], outs[0][0]) <= TOL_DELTA
    assert rel_err(outs[64][1], outs[0][1]) <= TOL_DELTA
    assert not np.array_equal(outs[64][0], outs[0][0])
    undecayed, _ = delta_ref(a["q"], a["k"], a["v"], a["g"], a["beta"], state[0].reshape(H, Dk, Dv), 0.2, decay=False)
    for c in (0, 64):
        assert rel_err(outs[c][0], undecayed) > 1000 * TOL_DELTA


def test_delta_chunks_follow_positions_not_batches():
    """A sequence fed in batches that end on chunk boundaries (position 40: 24 tokens, then 64,
    then 22) ends with the same bits as fed whole."""
    rng = np.random.default_rng(12)
    Dk, Dv, H, T, chunk = 16, 16, 2, 110, 64
    a, state = delta_case(rng, Dk, Dv, 1, H, [T])
    whole, whole_state = run(delta_op(chunk, 0.25), a, state, seq_table([(0, T, 0, 1, 40)]))
    st = state.copy()
    parts = []
    for first, n in ((0, 24), (24, 64), (88, 22)):
        piece = {k: v[first:first + n] for k, v in a.items()}
        out, st = run(delta_op(chunk, 0.25), piece, st, seq_table([(0, n, 0, 0, 40 + first)]))
        parts.append(out)
    assert np.array_equal(np.concatenate(parts), whole)
    assert np.array_equal(st[0], whole_state[1])


def test_delta_gqa_takes_key_heads_tiled():
    """Value head h takes key head h % Hk (GGUF's tiled order): head 1 of 2 key heads for value
    head 3 of 4, not head 1 = 3 // 2."""
    rng = np.random.default_rng(13)
    a, state = delta_case(rng, 8, 8, 2, 4, [6])
    o, _ = run(delta_op(0, 0.3), a, state, spans_for([6]))
    want, _ = delta_ref(a["q"], a["k"], a["v"], a["g"], a["beta"], state[0].reshape(4, 8, 8), 0.3)
    assert rel_err(o, want) <= TOL_DELTA


# ---- sequences in one batch ------------------------------------------------------------------

def each_alone(build, arrays, state, counts, pos):
    """Each sequence run alone (its tokens only, its state rows): outputs and rows written."""
    outs, rows, first = [], [], 0
    for s, n in enumerate(counts):
        part = {k: (v[first:first + n] if v.ndim > 1 and v.shape[0] == sum(counts) else v) for k, v in arrays.items()}
        out, st = run(build, part, state, seq_table([(0, n, 2 * s, 2 * s + 1, pos[s])]))
        outs.append(out)
        rows.append(st[2 * s + 1])
        first += n
    return np.concatenate(outs), rows


def cases():
    rng = np.random.default_rng(21)
    counts = [3, 1, 70, 5]
    x, w, cstate = conv_case(rng, 40, 4, counts)
    sa, sstate = scan_case(rng, 16, 4, 2, 8, counts)
    da, dstate = delta_case(rng, 32, 32, 1, 2, counts)
    return counts, [("conv", conv_op, {"x": x, "w": w}, cstate), ("scan", scan_op, sa, sstate),
                    ("delta", delta_op(0, 0.2), da, dstate), ("delta64", delta_op(64, 0.2), da, dstate)]


@pytest.mark.parametrize("which", ["conv", "scan", "delta", "delta64"])
def test_each_sequence_as_alone(which):
    """Four sequences in one batch give the bits each gives alone."""
    counts, all_cases = cases()
    _, build, arrays, state = next(c for c in all_cases if c[0] == which)
    pos = [0, 5, 30, 63]
    together, st = run(build, arrays, state, spans_for(counts, pos), threads=2)
    alone, rows = each_alone(build, arrays, state, counts, pos)
    assert np.array_equal(together, alone)
    for s in range(len(counts)):
        assert np.array_equal(st[2 * s + 1], rows[s])


@pytest.mark.parametrize("which", ["conv", "scan", "delta", "delta64"])
def test_same_bits_on_every_isa_and_thread_count(which):
    counts, all_cases = cases()
    _, build, arrays, state = next(c for c in all_cases if c[0] == which)
    seqs = spans_for(counts, [0, 5, 30, 63])
    results = {}
    for isa in ISAS:
        with forced_isa(isa):
            for threads in (1, 2, 3):
                results[isa, threads] = run(build, arrays, state, seqs, threads)
    assert len(ISAS) >= 2
    (key0, (out0, st0)), *rest = results.items()
    for key, (out, st) in rest:
        assert np.array_equal(out.view(np.uint32), out0.view(np.uint32)), (key, key0)
        assert np.array_equal(st.view(np.uint32), st0.view(np.uint32)), (key, key0)


def test_tokens_no_sequence_names_are_zero_and_bad_tables_fail():
    rng = np.random.default_rng(30)
    x, w, state = conv_case(rng, 16, 4, [4])
    y, _ = run(conv_op, {"x": x, "w": w}, state, seq_table([(1, 2, 0, 1, 0)]))
    assert not y[0].any() and not y[3].any() and y[1:3].any()
    for bad in [(0, 5, 0, 1, 0), (0, 2, 0, 9, 0), (0, 2, -1, 1, 0)]:
        with pytest.raises(Exception, match="ssm_conv"):
            run(conv_op, {"x": x, "w": w}, state, seq_table([bad]))
    with pytest.raises(Exception, match="another"):
        run(conv_op, {"x": x, "w": w}, state, seq_table([(0, 2, 0, 1, 0), (2, 2, 1, 0, 0)]))


def test_l2_norm():
    rng = np.random.default_rng(31)
    x = rng.standard_normal((5, 3, 24)).astype(np.float32)
    x[0, 0] = 0.0

    def build(ctx, t, state, seqs):
        return ctx.l2_norm(t["x"], 1e-6)

    y, _ = run(build, {"x": x}, np.zeros((1, 1), np.float32), seq_table([(0, 0, 0, 0, 0)]))
    assert rel_err(y, l2n(x.astype(np.float64))) <= 1e-6
    assert not y[0, 0].any()


def test_the_gates_sigmoid_and_softplus():
    """Qwen3.5's beta = sigmoid(b) and decay softplus(a + dt_bias) * A, on every table alike."""
    x = np.concatenate([np.linspace(-30, 30, 601), [-100.0, 100.0, 20.0, 20.5]]).astype(np.float32).reshape(5, 121)

    def build(which):
        def b(ctx, t, state, seqs):
            return ctx.sigmoid(t["x"]) if which == "sigmoid" else ctx.softplus(t["x"])
        return b

    no_state, no_seqs = np.zeros((1, 1), np.float32), seq_table([(0, 0, 0, 0, 0)])
    x64 = x.astype(np.float64)
    want = {"sigmoid": 1 / (1 + np.exp(-x64)), "softplus": np.where(x64 > 20, x64, np.log1p(np.exp(np.minimum(x64, 20))))}
    for which, ref in want.items():
        got = {}
        for isa in ISAS:
            with forced_isa(isa):
                got[isa], _ = run(build(which), {"x": x}, no_state, no_seqs)
        assert rel_err(got[ISAS[0]], ref) <= 1e-6, which
        if which == "softplus":   # element by element too, where float32 holds normal values
            normal = ref > 1e-37
            assert np.max(np.abs(got[ISAS[0]] - ref)[normal] / ref[normal]) <= 1e-6
        for isa in ISAS[1:]:
            assert np.array_equal(got[isa], got[ISAS[0]]), (which, isa)
