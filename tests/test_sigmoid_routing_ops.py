"""The ops sigmoid-routed experts add (GLM-4.5), against float64 numpy: the
sigmoid, the selection on biased scores and the chosen experts' unbiased
weights, renormalised or not; the same bits on every ISA and thread count."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from conftest import available_isas, forced_isa

from pyengine.errors import NativeError
from pyengine.ml.context import Backend, Context

ISAS = available_isas()
rng = np.random.default_rng(4545)


def routed(logits: np.ndarray, bias: np.ndarray, k: int, normalize: bool, *, isa=None, n_threads=2):
    """(ids, weights, probs) of the sigmoid routing of logits [T, E] with selection bias [E]."""
    with forced_isa(isa) if isa else contextlib.nullcontext():
        ctx = Context(Backend(n_threads))
        probs = ctx.sigmoid(ctx.input(logits, "logits"))
        ids = ctx.topk(ctx.add(probs, ctx.input(bias, "bias")), k)
        w = ctx.moe_gather_weights(probs, ids, normalize)
        for t in (probs, ids, w):
            ctx.set_output(t)
        ctx.compute()
        return ctx.read(ids), ctx.read(w), ctx.read(probs)


def test_sigmoid_matches_float64():
    x = np.linspace(-30, 30, 301, dtype=np.float32).reshape(7, 43)
    _, _, got = routed(x, np.zeros(43, np.float32), 1, False)
    np.testing.assert_allclose(got, 1.0 / (1.0 + np.exp(-x.astype(np.float64))), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("normalize", [False, True])
def test_gathered_weights_are_the_unbiased_scores_of_the_biased_choice(normalize):
    logits = (rng.standard_normal((9, 16)) * 2).astype(np.float32)
    bias = (rng.standard_normal(16) * 0.5).astype(np.float32)
    ids, got, _ = routed(logits, bias, 4, normalize)
    p = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    want_ids = np.argsort(-(p + bias), axis=1, kind="stable")[:, :4]
    np.testing.assert_array_equal(ids, want_ids)
    want = np.take_along_axis(p, want_ids, 1)
    if normalize:
        want = want / want.sum(1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # the bias changes the choice on these rows (else the test would not see it)
    assert (np.argsort(-p, axis=1, kind="stable")[:, :4] != want_ids).any()


def test_renormalising_floors_the_sum():
    """All-but-zero scores are divided by llama.cpp's floor 2^-14, not by their own sum."""
    logits = np.full((1, 4), -40.0, np.float32)
    _, got, probs = routed(logits, np.zeros(4, np.float32), 2, True)
    np.testing.assert_allclose(got, probs[:, :2] / 6.103515625e-5, rtol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
def test_same_bits_on_every_isa_and_thread_count(isa):
    logits = (rng.standard_normal((33, 8)) * 3).astype(np.float32)
    bias = (rng.standard_normal(8) * 0.3).astype(np.float32)
    base = routed(logits, bias, 2, True, isa="scalar", n_threads=1)
    for n_threads in (1, 3):
        for a, b in zip(routed(logits, bias, 2, True, isa=isa, n_threads=n_threads), base):
            assert a.tobytes() == b.tobytes()


def test_an_expert_id_out_of_range_fails():
    ctx = Context(Backend(1))
    probs = ctx.input(np.zeros((2, 4), np.float32), "p")
    w = ctx.moe_gather_weights(probs, ctx.input(np.array([[0, 4], [1, 2]], np.int32), "ids"), True)
    ctx.set_output(w)
    with pytest.raises(NativeError, match="out of range"):
        ctx.compute()
