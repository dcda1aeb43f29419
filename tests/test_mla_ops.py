"""The ops DeepSeek-2 adds, against float64 numpy: attention whose V is a
narrower prefix view of the K rows (MLA's latent cache), concat along the
rows, the grouped expert choice with a selection bias (moe_route) and the
sigmoid weights of the chosen experts; and MLA's attention the same bits on
every ISA, thread count and batch company."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import available_isas, forced_isa
from gguf import GGMLQuantizationType, quants
from op_support import computed, f32_drawer

from pyengine import _core
from pyengine.errors import NativeError
from pyengine.ml.context import F16, Q8_0, Backend, Context

ISAS = available_isas()
rng = np.random.default_rng(2029)
f32 = f32_drawer(rng)


def latent_prompt(t=37, h=8, rank=64, rope=32):
    """A causal prompt in cells 0..t-1: q [t, h, rank + rope] and F16 rows of rank + rope
    values (the latent, then the key's roped part)."""
    q = f32(t, h, rank + rope, scale=0.3)
    rows = f32(t, rank + rope).astype(np.float16).view(np.uint16)
    mask = np.where(np.tril(np.ones((t, t))) > 0, 0.0, -np.inf).astype(np.float32)
    return q, rows, mask


def latent_attention(isa, q, rows, mask, rank, *, type_id=F16, tok=None, n_threads=2):
    """Attention over one KV head whose V is the first `rank` values of each K row (a view)."""
    t, _, kd = q.shape
    if tok is not None:
        q, mask = np.ascontiguousarray(q[tok]), np.ascontiguousarray(mask[tok])
    with forced_isa(isa):
        ctx = Context(Backend(n_threads))
        k = ctx.cache(rows, type_id, (kd, t), "k")
        v = ctx.view(k, (rank, t), (_core.block_bytes(type_id), _core.row_bytes(type_id, kd)))
        out = ctx.attn(ctx.input(q, "q"), k, v, ctx.input(mask, "mask"), ctx.input(np.array([t], np.int32), "kv_len"),
                       n_head_kv=1, scale=kd ** -0.5)
        return computed(ctx, out)


def latent_reference(q, kf, mask, rank):
    s = np.einsum("thd,cd->htc", q, kf) * q.shape[2] ** -0.5 + mask[None]
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("htc,cd->thd", p, kf[:, :rank]).reshape(q.shape[0], -1)


@pytest.mark.parametrize("isa", ISAS)
def test_latent_attention_reads_v_as_the_k_rows_prefix(isa):
    q, rows, mask = latent_prompt()
    rank = 64
    got = latent_attention(isa, q, rows, mask, rank)
    kf = rows.view(np.float16).astype(np.float64)
    want = latent_reference(q.astype(np.float64), kf, mask.astype(np.float64), rank)
    assert got.shape == (q.shape[0], q.shape[1] * rank)
    np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3)   # query and probabilities in F16


@pytest.mark.parametrize("isa", ISAS)
def test_latent_attention_same_bits_alone_batched_and_on_any_thread_count(isa):
    q, rows, mask = latent_prompt()
    batched = latent_attention(isa, q, rows, mask, 64)
    for n_threads in (1, 3):
        assert np.array_equal(latent_attention(isa, q, rows, mask, 64, n_threads=n_threads), batched)
    for tok in (0, 9, q.shape[0] - 1):   # a generated token, alone
        assert np.array_equal(latent_attention(isa, q, rows, mask, 64, tok=[tok])[0], batched[tok]), tok


def test_latent_attention_same_bits_on_every_isa():
    q, rows, mask = latent_prompt()
    results = [latent_attention(isa, q, rows, mask, 64) for isa in ISAS]
    for isa, r in zip(ISAS, results):
        assert np.array_equal(r, results[0]), isa


@pytest.mark.parametrize("isa", ISAS)
def test_latent_attention_over_a_q8_0_cache(isa):
    q, _, mask = latent_prompt()
    t, _, kd = q.shape
    rows = np.ascontiguousarray(quants.quantize(f32(t, kd), GGMLQuantizationType.Q8_0))
    got = latent_attention(isa, q, rows, mask, 64, type_id=Q8_0)
    kf = quants.dequantize(rows, GGMLQuantizationType.Q8_0).astype(np.float64)
    want = latent_reference(q.astype(np.float64), kf, mask.astype(np.float64), 64)
    np.testing.assert_allclose(got, want, rtol=3e-2, atol=3e-2)   # the query is quantized to Q8_0 for the scores


def test_attention_refuses_v_rows_of_no_whole_heads():
    q, rows, mask = latent_prompt(h=4)
    t = q.shape[0]
    ctx = Context(Backend(1))
    k = ctx.cache(rows, F16, (96, t), "k")
    v = ctx.cache(np.zeros((t, 63), np.uint16), F16, (63, t), "v")
    with pytest.raises(NativeError):
        ctx.attn(ctx.input(q, "q"), k, v, ctx.input(mask, "mask"), ctx.input(np.array([t], np.int32), "kv_len"),
                 n_head_kv=2, scale=0.1)


def test_concat_joins_rows_of_strided_views():
    a, b, wide = f32(5, 3, 8), f32(5, 3, 4), f32(5, 3, 12)
    ctx = Context(Backend(2))
    tb = ctx.view(ctx.input(wide, "wide"), (4, 3, 5), (4, 48, 144), 8 * 4)   # every row's last 4 values
    out = computed(ctx, ctx.concat(ctx.input(a, "a"), tb))
    np.testing.assert_array_equal(out, np.concatenate([a, wide[..., 8:]], axis=-1))
    ctx2 = Context(Backend(1))
    out2 = computed(ctx2, ctx2.concat(ctx2.input(a, "a"), ctx2.input(b, "b")))
    np.testing.assert_array_equal(out2, np.concatenate([a, b], axis=-1))


def test_concat_refuses_other_shapes():
    ctx = Context(Backend(1))
    with pytest.raises(NativeError, match="differ beyond"):
        ctx.concat(ctx.input(f32(3, 8), "a"), ctx.input(f32(4, 8), "b"))


def route_reference(logits, bias, k, sigmoid, n_group, n_group_used):
    probs = 1.0 / (1.0 + np.exp(-logits)) if sigmoid else np.exp(logits - logits.max(1, keepdims=True))
    if not sigmoid:
        probs /= probs.sum(1, keepdims=True)
    s = probs + (bias if bias is not None else 0.0)
    out = []
    per = s.shape[1] // n_group
    for row in s:
        row = row.copy()
        if n_group > 1:
            best2 = np.sort(row.reshape(n_group, per), axis=1)[:, -2:].sum(1)
            kept = np.argsort(-best2, kind="stable")[:n_group_used]
            row[~np.isin(np.arange(row.size) // per, kept)] = -np.inf
        out.append(np.argsort(-row, kind="stable")[:k])
    return np.array(out)


@pytest.mark.parametrize("sigmoid", [True, False])
@pytest.mark.parametrize("groups", [(1, 1), (4, 2), (8, 3)])
def test_moe_route_matches_grouped_selection(sigmoid, groups):
    n_group, n_used = groups
    logits, bias = f32(50, 32, scale=2.0), f32(32, scale=0.3)
    ctx = Context(Backend(2))
    ids = computed(ctx, ctx.moe_route(ctx.input(logits, "l"), 4, sigmoid=sigmoid, bias=ctx.input(bias, "b"),
                                      n_group=n_group, n_group_used=n_used))
    want = route_reference(logits.astype(np.float64), bias, 4, sigmoid, n_group, n_used)
    np.testing.assert_array_equal(ids, want)
    if n_group > 1:   # the groups change the choice somewhere
        assert not np.array_equal(want, route_reference(logits.astype(np.float64), bias, 4, sigmoid, 1, 1))


def test_moe_route_bias_only_chooses():
    """The bias moves the choice; the weights come from the unbiased sigmoid."""
    logits = f32(20, 8)
    bias = np.zeros(8, np.float32)
    bias[7] = 10.0   # expert 7 always chosen
    ctx = Context(Backend(1))
    tl = ctx.input(logits, "l")
    ids = ctx.moe_route(tl, 2, sigmoid=True, bias=ctx.input(bias, "b"))
    w = ctx.moe_sigmoid_weights(tl, ids, False)
    ctx.set_output(w)
    ctx.compute()
    got_ids, got_w = ctx.read(ids), ctx.read(w)
    assert (got_ids[:, 0] == 7).all()
    sig = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    np.testing.assert_allclose(got_w, np.take_along_axis(sig, got_ids, 1), rtol=1e-6)


def test_moe_sigmoid_weights_normalised():
    logits = f32(10, 8)
    ids = np.argsort(-logits, axis=1)[:, :3].astype(np.int32)
    ctx = Context(Backend(1))
    w = computed(ctx, ctx.moe_sigmoid_weights(ctx.input(logits, "l"), ctx.input(ids, "ids"), True))
    sig = np.take_along_axis(1.0 / (1.0 + np.exp(-logits.astype(np.float64))), ids, 1)
    np.testing.assert_allclose(w, sig / sig.sum(1, keepdims=True), rtol=1e-6)


def test_moe_route_refuses_groups_that_cannot_give_k():
    ctx = Context(Backend(1))
    with pytest.raises(NativeError, match="cannot give"):
        ctx.moe_route(ctx.input(f32(3, 8), "l"), 4, sigmoid=True, n_group=4, n_group_used=1)
