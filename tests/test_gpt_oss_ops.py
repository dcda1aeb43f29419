"""The ops gpt-oss adds, against float64 numpy: attention sinks, the clamped
SwiGLU, a bias per chosen expert (add_id) and the softmax over the chosen
experts' logits; and the sinks' arithmetic the same bits on every ISA,
thread count and batch company."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import available_isas, forced_isa
from gguf import GGMLQuantizationType, quants
from op_support import computed, f32_drawer

from pyengine.errors import NativeError
from pyengine.ml.context import Backend, Context

ISAS = available_isas()
rng = np.random.default_rng(2028)
f32 = f32_drawer(rng)


def sink_attention_reference(q, k, v, mask, n_head_kv, scale, sinks):
    """q [T, H, hd]; k, v [C, Hkv, hd]; mask [T, C]; sinks [H]: each head's sink
    logit joins its softmax denominator with no value."""
    t, h, hd = q.shape
    group = h // n_head_kv
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("thd,chd->htc", q, kk) * scale + mask[None]
    sink = np.broadcast_to(sinks[:, None, None], (h, t, 1))
    mx = np.maximum(s.max(-1, keepdims=True), sink)
    e = np.exp(s - mx)
    p = e / (e.sum(-1, keepdims=True) + np.exp(sink - mx))
    return np.einsum("htc,chd->thd", p, vv).reshape(t, h * hd)


def prompt(t=37, h=8, hkv=2, hd=64):
    """A causal prompt in cells 0..t-1: q, F16 k and v rows, the mask, and sinks
    spread from well below to well above the scores (a sink that wins the max too)."""
    q = f32(t, h, hd)
    k16 = f32(t, hkv * hd).astype(np.float16).view(np.uint16)
    v16 = f32(t, hkv * hd).astype(np.float16).view(np.uint16)
    mask = np.where(np.tril(np.ones((t, t))) > 0, 0.0, -np.inf).astype(np.float32)
    sinks = np.linspace(-4.0, 6.0, h).astype(np.float32)
    return q, k16, v16, mask, sinks


def sink_attention(isa, q, k16, v16, mask, sinks, hkv, *, rows=None, n_threads=2, with_sinks=True):
    t, _, hd = q.shape
    if rows is not None:
        q, mask = np.ascontiguousarray(q[rows]), np.ascontiguousarray(mask[rows])
    with forced_isa(isa):
        ctx = Context(Backend(n_threads))
        out = ctx.attn(ctx.input(q, "q"), ctx.cache(k16, 1, (hd * hkv, t), "k"), ctx.cache(v16, 1, (hd * hkv, t), "v"),
                       ctx.input(mask, "mask"), ctx.input(np.array([t], np.int32), "kv_len"), n_head_kv=hkv,
                       scale=hd ** -0.5, sinks=ctx.input(sinks, "sinks") if with_sinks else None)
        return computed(ctx, out)


@pytest.mark.parametrize("isa", ISAS)
def test_attention_sinks_match_float64(isa):
    q, k16, v16, mask, sinks = prompt()
    t, _, hd = q.shape
    hkv = k16.shape[1] // hd
    got = sink_attention(isa, q, k16, v16, mask, sinks, hkv)
    kf = k16.view(np.float16).astype(np.float64).reshape(t, hkv, hd)
    vf = v16.view(np.float16).astype(np.float64).reshape(t, hkv, hd)
    want = sink_attention_reference(q.astype(np.float64), kf, vf, mask.astype(np.float64), hkv, hd ** -0.5,
                                    sinks.astype(np.float64))
    # the query and the probabilities are rounded to F16 (llama.cpp's numerics)
    np.testing.assert_allclose(got, want, rtol=3e-3, atol=3e-3)
    # and the sinks matter: the same attention without them is far off
    plain = sink_attention(isa, q, k16, v16, mask, sinks, hkv, with_sinks=False)
    assert np.abs(plain - want).max() > 0.1


@pytest.mark.parametrize("isa", ISAS)
def test_attention_sinks_same_bits_alone_batched_and_on_any_thread_count(isa):
    q, k16, v16, mask, sinks = prompt()
    hkv = k16.shape[1] // q.shape[2]
    batched = sink_attention(isa, q, k16, v16, mask, sinks, hkv)
    for n_threads in (1, 3):
        assert np.array_equal(sink_attention(isa, q, k16, v16, mask, sinks, hkv, n_threads=n_threads), batched)
    for tok in (0, 9, q.shape[0] - 1):   # a generated token, alone
        alone = sink_attention(isa, q, k16, v16, mask, sinks, hkv, rows=[tok])
        assert np.array_equal(alone[0], batched[tok]), tok


def test_attention_sinks_same_bits_on_every_isa():
    q, k16, v16, mask, sinks = prompt()
    hkv = k16.shape[1] // q.shape[2]
    results = [sink_attention(isa, q, k16, v16, mask, sinks, hkv) for isa in ISAS]
    for isa, r in zip(ISAS, results):
        assert np.array_equal(r, results[0]), isa


@pytest.mark.parametrize("isa", ISAS)
def test_attention_sinks_over_a_q8_0_cache(isa):
    """A quantized cache takes another product with V; the sinks join the same softmax."""
    q, _, _, mask, sinks = prompt()
    t, h, hd = q.shape
    hkv = 2
    k, v = f32(t, hkv * hd), f32(t, hkv * hd)
    k8, v8 = (np.ascontiguousarray(quants.quantize(x, GGMLQuantizationType.Q8_0)) for x in (k, v))
    with forced_isa(isa):
        ctx = Context(Backend(2))
        out = ctx.attn(ctx.input(q, "q"), ctx.cache(k8, 8, (hd * hkv, t), "k"), ctx.cache(v8, 8, (hd * hkv, t), "v"),
                       ctx.input(mask, "mask"), ctx.input(np.array([t], np.int32), "kv_len"), n_head_kv=hkv,
                       scale=hd ** -0.5, sinks=ctx.input(sinks, "sinks"))
        got = computed(ctx, out)
    kf, vf = (quants.dequantize(x, GGMLQuantizationType.Q8_0).astype(np.float64).reshape(t, hkv, hd) for x in (k8, v8))
    want = sink_attention_reference(q.astype(np.float64), kf, vf, mask.astype(np.float64), hkv, hd ** -0.5,
                                    sinks.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)   # the query is quantized to Q8_0 for the scores


def test_attention_sinks_need_one_per_head():
    q, k16, v16, mask, sinks = prompt()
    with pytest.raises(NativeError, match="one sink per query head"):
        sink_attention(ISAS[0], q, k16, v16, mask, sinks[:-1], k16.shape[1] // q.shape[2])


def swiglu_oai_reference(gate, up, alpha, limit):
    g = np.minimum(gate, limit)
    u = np.clip(up, -limit, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)


@pytest.mark.parametrize("isa", ISAS)
def test_swiglu_oai_clamps_gate_above_and_up_both_sides(isa):
    gate, up = f32(6, 40, scale=6.0), f32(6, 40, scale=6.0)   # many beyond +-7
    with forced_isa(isa):
        ctx = Context(Backend(2))
        got = computed(ctx, ctx.swiglu_oai(ctx.input(gate, "g"), ctx.input(up, "u"), alpha=1.702, limit=7.0))
    want = swiglu_oai_reference(gate.astype(np.float64), up.astype(np.float64), 1.702, 7.0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert (gate > 7).any() and (up < -7).any() and (up > 7).any()


def test_swiglu_oai_same_bits_on_every_isa():
    gate, up = f32(3, 2880, scale=6.0), f32(3, 2880, scale=6.0)
    results = []
    for isa in ISAS:
        with forced_isa(isa):
            ctx = Context(Backend(3))
            results.append(computed(ctx, ctx.swiglu_oai(ctx.input(gate, "g"), ctx.input(up, "u"), alpha=1.702,
                                                        limit=7.0)))
    for isa, r in zip(ISAS, results):
        assert np.array_equal(r.view(np.uint32), results[0].view(np.uint32)), isa


def test_add_id_adds_each_chosen_experts_row():
    a, b = f32(5, 2, 12), f32(4, 12)            # [T, U, N] + [E, N]
    ids = rng.integers(0, 4, size=(5, 2)).astype(np.int32)
    ctx = Context(Backend(2))
    got = computed(ctx, ctx.add_id(ctx.input(a, "a"), ctx.input(b, "b"), ctx.input(ids, "ids")))
    assert np.array_equal(got, a + b[ids])


def test_add_id_rejects_an_expert_out_of_range():
    ctx = Context(Backend(1))
    out = ctx.add_id(ctx.input(f32(1, 2, 4), "a"), ctx.input(f32(3, 4), "b"),
                     ctx.input(np.array([[0, 3]], np.int32), "ids"))
    with pytest.raises(NativeError, match="expert id out of range"):
        computed(ctx, out)


def test_moe_softmax_over_the_chosen_logits():
    logits = f32(7, 16, scale=3.0)
    ctx = Context(Backend(2))
    tl = ctx.input(logits, "l")
    ids = ctx.topk(tl, 4)
    w = ctx.moe_softmax_chosen(tl, ids)
    ctx.set_output(ids)
    got = computed(ctx, w)
    chosen = np.take_along_axis(logits.astype(np.float64), ctx.read(ids).astype(np.int64), 1)
    e = np.exp(chosen - chosen.max(1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), rtol=1e-6)
