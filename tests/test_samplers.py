"""Sampler chain: each sampler against its formula, orders, edge cases, seeds, options."""

import itertools
import math
import time

import numpy as np
import pytest

from pyengine import _core
from pyengine.errors import InvalidOptionError, SamplingError
from pyengine.sample import SAMPLER_NAMES, SamplerChain, SamplingOptions
from pyengine.sample.candidates import Candidates, top_k_positions
from pyengine.sample.dry import Dry, build_breakers
from pyengine.sample.samplers import (
    Dist, LogitBias, MinP, Mirostat, MirostatV2, Penalties, Temperature, TopK, TopNSigma, TopP,
    Typical, Xtc)


def cand_of(logits, sorted_=False):
    logits = np.asarray(logits, dtype=np.float32)
    return Candidates(np.arange(logits.shape[0], dtype=np.int64), logits.copy(), identity=True, sorted=sorted_)


def ref_softmax(values):
    values = np.asarray(values, dtype=np.float64)
    weights = np.exp(values - values.max())
    return weights / weights.sum()


def log_probs(probs):
    return np.log(np.asarray(probs, dtype=np.float64))


# ---- options


def test_defaults_are_ollamas():
    opts = SamplingOptions()
    assert (opts.temperature, opts.top_k, opts.top_p, opts.min_p, opts.typical_p) == (0.8, 40, 0.9, 0.0, 1.0)
    assert (opts.repeat_penalty, opts.repeat_last_n, opts.presence_penalty, opts.frequency_penalty) == (1.0, 64, 0, 0)
    assert (opts.mirostat, opts.mirostat_tau, opts.mirostat_eta, opts.seed) == (0, 5.0, 0.1, None)
    assert opts.dry_sequence_breakers == ["\n", ":", "\"", "*"]
    assert opts.sampler_order() == ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p",
                                    "xtc", "temperature")


def test_from_dict_accepts_ollama_names_and_normalises():
    opts = SamplingOptions.from_dict({"temperature": 0, "top_k": 5.0, "seed": -1, "logit_bias": {"12": -2, 3: False},
                                      "samplers": "top-k;temp", "n_probs": 3})
    assert opts.temperature == 0.0 and opts.top_k == 5 and opts.seed is None
    assert opts.logit_bias == {12: -2.0, 3: -math.inf}
    assert opts.samplers == ["top_k", "temperature"]


@pytest.mark.parametrize("options, name", [
    ({"temprature": 0.5}, "temprature"),
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"mirostat": 3}, "mirostat"),
    ({"n_probs": 21}, "n_probs"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"min_p": float("nan")}, "min_p"),
    ({"samplers": ["top_k", "warp"]}, "samplers"),
    ({"dry_sequence_breakers": ["", "x"]}, "dry_sequence_breakers"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"),
    ({"logit_bias": {5: float("inf")}}, "logit_bias"),
    ({"repeat_last_n": -2}, "repeat_last_n"),
])
def test_from_dict_rejects_with_the_option_named(options, name):
    with pytest.raises(InvalidOptionError, match=name):
        SamplingOptions.from_dict(options)


def test_out_of_range_message_gives_the_range():
    with pytest.raises(InvalidOptionError, match=r"\[0, 1\]"):
        SamplingOptions.from_dict({"top_p": 2})


# ---- candidates and top-k selection


@pytest.mark.parametrize("n, k", [(10, 3), (10, 10), (10, 50), (50_000, 40), (50_000, 1), (300_000, 40),
                                  (300_000, 5000), (20_000, 19_000)])
def test_top_k_positions_matches_a_full_sort_with_ties_to_lower_ids(n, k):
    rng = np.random.default_rng(n + k)
    logits = rng.integers(-30, 30, size=n).astype(np.float32)   # many ties
    logits[rng.integers(0, n, size=n // 10)] = -np.inf
    expected = np.lexsort((np.arange(n), -logits))[:k]
    assert np.array_equal(top_k_positions(logits, k), expected)


@pytest.mark.parametrize("n, k", [(7, 3), (5_000, 1), (50_000, 40), (50_000, 256)])
def test_native_top_k_leaves_out_the_skipped_positions_and_nan(n, k):
    """_core.top_k (what top_k_positions uses):
    the k best of what is not skipped, ties to the lower position, NaN passed over."""
    rng = np.random.default_rng(n * k)
    logits = rng.integers(-20, 20, size=n).astype(np.float32)
    logits[rng.integers(0, n, size=n // 7)] = -np.inf
    logits[rng.integers(0, n, size=3)] = np.nan
    skip = np.unique(rng.integers(0, n, size=min(n // 2, 64)))
    kept = np.setdiff1d(np.flatnonzero(~np.isnan(logits)), skip)
    expected = kept[np.lexsort((kept, -logits[kept]))][:k]
    assert np.array_equal(_core.top_k(logits, k, skip), expected)
    with pytest.raises(ValueError, match="ascending"):
        _core.top_k(logits, k, np.array([2, 1], np.int64))


@pytest.mark.parametrize("n, with_nan", [(1, False), (7, True), (64, False), (65, True), (5_000, False),
                                         (50_000, True), (50_000, False)])
def test_native_best_outside_is_argmax_of_what_is_not_skipped(n, with_nan):
    """_core.best_outside (greedy sampling's one pass): the first largest logit outside the
    skipped positions, NaN passed over but reported, wherever the NaN and the best lie
    (every vector lane and tail), -1 when nothing is left."""
    rng = np.random.default_rng(n)
    for trial in range(20):
        logits = rng.integers(-5, 5, size=n).astype(np.float32)   # many ties
        logits[rng.integers(0, n, size=n // 5 + 1)] = -np.inf
        if with_nan:
            logits[rng.integers(0, n)] = np.nan
        skip = np.unique(rng.integers(0, n, size=rng.integers(0, min(n, 64) + 1)))
        kept = np.setdiff1d(np.flatnonzero(~np.isnan(logits)), skip)
        expected = int(kept[np.argmax(logits[kept])]) if kept.size else -1
        assert _core.best_outside(logits, skip) == (expected, with_nan), (n, trial)
    assert _core.best_outside(np.full(3, np.nan, np.float32)) == (-1, True)
    assert _core.best_outside(np.zeros(3, np.float32), np.arange(3, dtype=np.int64)) == (-1, False)
    with pytest.raises(ValueError, match="ascending"):
        _core.best_outside(np.zeros(3, np.float32), np.array([2, 1], np.int64))


def test_greedy_under_penalties_reports_bad_logits_wherever_they_lie():
    """The one-pass greedy pick checks the logits as the general path does: a NaN or +inf
    among the penalised ids or the others, or nothing above -inf, is a SamplingError."""
    chain = SamplerChain(SamplingOptions(temperature=0, repeat_penalty=1.5, repeat_last_n=8), 300)
    for token in (4, 7, 200):
        chain.accept(token)
    for at in (5, 7, 250):
        for bad, message in ((np.nan, "NaN"), (np.inf, r"\+inf")):
            logits = np.zeros(300, np.float32)
            logits[at] = bad
            with pytest.raises(SamplingError, match=message):
                chain.sample(logits)
    with pytest.raises(SamplingError, match="every logit is -inf"):
        chain.sample(np.full(300, -np.inf, np.float32))
    logits = np.full(300, -np.inf, np.float32)
    logits[7] = 1.0   # only a penalised id is finite: it is picked
    assert chain.sample(logits) == 7


def test_positions_of_finds_ids_in_a_shuffled_subset():
    cand = Candidates(np.array([9, 4, 7, 1], dtype=np.int64), np.zeros(4, np.float32))
    positions, which = cand.positions_of(np.array([1, 5, 9]))
    assert positions.tolist() == [3, 0] and which.tolist() == [0, 2]


# ---- each sampler against its formula


def test_top_k_keeps_k_best_sorted_and_k_beyond_vocab_keeps_all():
    cand = cand_of([1.0, 3.0, 2.0, 3.0, 0.5])
    TopK(2).apply(cand)
    assert cand.ids.tolist() == [1, 3] and cand.sorted
    cand = cand_of([1.0, 3.0, 2.0])
    TopK(10).apply(cand)
    assert cand.ids.tolist() == [1, 2, 0]
    cand = cand_of([1.0, 3.0, 2.0])
    TopK(0).apply(cand)
    assert cand.ids.tolist() == [0, 1, 2]


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    for p, expected in [(0.5, [1]), (0.8, [1, 3]), (0.81, [1, 3, 2]), (0.0, [1]), (0.999, [1, 3, 2, 0])]:
        cand = cand_of(log_probs(probs))
        TopP(p).apply(cand)
        assert cand.ids.tolist() == expected, p
    cand = cand_of(log_probs(probs))
    TopP(1.0).apply(cand)
    assert cand.ids.tolist() == [0, 1, 2, 3]
    cand = cand_of(log_probs(probs))
    TopP(0.5, min_keep=3).apply(cand)
    assert cand.ids.tolist() == [1, 3, 2]


def test_top_p_on_a_big_unsorted_vocabulary_matches_reference():
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(100_000) * 4).astype(np.float32)
    cand = cand_of(logits)
    TopP(0.7).apply(cand)
    order = np.lexsort((np.arange(logits.size), -logits))
    mass = np.cumsum(ref_softmax(logits)[order])
    count = int(np.argmax(mass >= 0.7)) + 1
    assert cand.ids.tolist() == order[:count].tolist()


def test_min_p_keeps_tokens_with_p_at_least_p_times_max():
    probs = np.array([0.4, 0.3, 0.2, 0.06, 0.04])
    cand = cand_of(log_probs(probs))
    MinP(0.5).apply(cand)
    assert sorted(cand.ids.tolist()) == [0, 1, 2]    # 0.2 >= 0.5 * 0.4
    cand = cand_of([2.0, 2.0, 1.0])
    MinP(1.0).apply(cand)
    assert sorted(cand.ids.tolist()) == [0, 1]       # ties of the maximum survive p = 1
    cand = cand_of(log_probs(probs))
    MinP(0.9, min_keep=3).apply(cand)
    assert cand.ids.tolist() == [0, 1, 2]


def test_typical_matches_the_locally_typical_formula():
    probs = np.array([0.55, 0.25, 0.12, 0.05, 0.03])
    cand = cand_of(log_probs(probs))
    Typical(0.5).apply(cand)
    entropy = -np.sum(probs * np.log(probs))
    order = np.argsort(np.abs(-np.log(probs) - entropy), kind="stable")
    count = int(np.argmax(np.cumsum(probs[order]) > 0.5)) + 1
    assert cand.ids.tolist() == order[:count].tolist()
    assert not cand.sorted


def test_top_n_sigma_keeps_logits_within_n_std_of_max():
    logits = np.array([5.0, 4.0, 1.0, 0.0, -np.inf, 3.5], dtype=np.float32)
    finite = logits[np.isfinite(logits)]
    threshold = finite.max() - 1.0 * finite.std()
    cand = cand_of(logits)
    TopNSigma(1.0).apply(cand)
    assert cand.ids.tolist() == [i for i, v in enumerate(logits) if v >= threshold]
    cand = cand_of(logits)
    TopNSigma(-1.0).apply(cand)
    assert len(cand) == 6


def test_xtc_removes_all_top_choices_but_the_least_likely_one():
    probs = np.array([0.35, 0.3, 0.2, 0.1, 0.05])
    cand = cand_of(log_probs(probs))
    Xtc(1.0, 0.15, np.random.default_rng(0)).apply(cand)
    assert cand.ids.tolist() == [2, 3, 4]          # 0.35 and 0.3 are above 0.15 alongside 0.2
    for probability, threshold in [(0.0, 0.15), (1.0, 0.6)]:
        cand = cand_of(log_probs(probs))
        Xtc(probability, threshold, np.random.default_rng(0)).apply(cand)
        assert len(cand) == 5


def test_temperature_divides_and_zero_keeps_the_argmax():
    cand = cand_of([2.0, -1.0, 4.0])
    Temperature(0.5).apply(cand)
    assert np.allclose(cand.logits, [4.0, -2.0, 8.0])
    cand = cand_of([2.0, 4.0, 4.0])
    Temperature(0.0).apply(cand)
    assert cand.ids.tolist() == [1]


@pytest.mark.parametrize("temperature", [1e-300, 1e-45, 1e-38])
def test_a_temperature_too_small_for_float32_keeps_the_argmax(temperature):
    """Dividing by it overflowed the best logit (or divided by a float32 zero) and the
    draw then found no finite candidate: its limit is greedy."""
    cand = cand_of([2.0, -1.0, 4.0, 3.5])
    with np.errstate(all="raise"):
        Temperature(temperature).apply(cand)
    assert cand.ids.tolist() == [2]
    for t in (temperature, 1e-30):   # 1e-30: huge but finite logits, a certain draw
        chain = SamplerChain(SamplingOptions(temperature=t, seed=3), 4)
        assert chain.sample(np.array([2.0, -1.0, 4.0, 3.5], np.float32)) == 2


def test_dynamic_temperature_follows_normalised_entropy():
    logits = np.array([3.0, 2.0, 1.0, 0.0], dtype=np.float32)
    cand = cand_of(logits)
    Temperature(1.0, dyn_range=0.5, exponent=2.0).apply(cand)
    probs = ref_softmax(logits)
    normalized = -np.sum(probs * np.log(probs)) / math.log(4)
    temperature = 0.5 + 1.0 * normalized ** 2.0
    assert np.allclose(cand.logits, logits / temperature, rtol=1e-5)


def test_penalties_formula_and_window():
    pen = Penalties(last_n=3, repeat=2.0, frequency=0.5, presence=0.25)
    for token in [1, 2, 1]:
        pen.accept(token)
    cand = cand_of([1.0, 4.0, -3.0, 2.0])
    pen.apply(cand)
    # token 1 seen twice (positive: divided), token 2 once (negative: multiplied)
    assert np.allclose(cand.logits, [1.0, 4.0 / 2 - 2 * 0.5 - 0.25, -3.0 * 2 - 0.5 - 0.25, 2.0])
    pen.accept(3)    # window of 3: the first "1" falls out
    assert dict(pen.counts) == {2: 1, 1: 1, 3: 1}
    pen.reset()
    assert not pen.active


def test_logit_bias_adds_and_bans():
    cand = cand_of([1.0, 2.0, 3.0])
    LogitBias({0: 5.0, 2: -math.inf}).apply(cand)
    assert cand.logits.tolist() == [6.0, 2.0, -math.inf]


def dry_with(history, breakers=None, **kwargs):
    params = dict(multiplier=0.8, base=1.75, allowed_length=2, last_n=None)
    params.update(kwargs)
    dry = Dry(breakers=breakers or {}, **params)
    for token in history:
        dry.accept(token)
    return dry


def test_dry_penalises_tokens_that_extend_repeats():
    a, b, c, y = 0, 1, 2, 3
    # llama.cpp's worked example: "a b c c b c y a b c" -> c repeats 3, y repeats 2, b only 1
    dry = dry_with([a, b, c, c, b, c, y, a, b, c])
    cand = cand_of(np.zeros(5))
    dry.apply(cand)
    expected = np.zeros(5)
    expected[c] = -0.8 * 1.75 ** (3 - 2)
    expected[y] = -0.8 * 1.75 ** (2 - 2)
    assert np.allclose(cand.logits, expected)


def test_dry_sequence_breakers_cut_repeats_and_are_never_penalised():
    a, b, c, brk = 0, 1, 2, 4
    breakers = {brk: [()]}
    dry = dry_with([a, b, c, a, b, brk, a, b], breakers=breakers)
    cand = cand_of(np.zeros(5))
    dry.apply(cand)
    # the repeat "a b" (length 2) after the breaker may reach back only 2 tokens: c and brk follow it
    assert cand.logits[c] < 0 and cand.logits[brk] == 0
    dry = dry_with([a, b, a, b, brk], breakers=breakers)  # breaker last: nothing can repeat
    cand = cand_of(np.zeros(5))
    dry.apply(cand)
    assert not cand.logits.any()


def test_dry_breakers_from_pieces_include_multi_token_tails():
    pieces = [b"a", b"b", b"\n", b"x:", b"##", b"#"]
    breakers = build_breakers(pieces, ["\n", ":", "###"])
    assert breakers[2] == [()] and breakers[3] == [()]
    assert (5,) in breakers[4]          # "##" + "#" spells the breaker "###"


def test_mirostat_v2_truncates_by_surprise_and_updates_mu_on_accept():
    rng = np.random.default_rng(0)
    miro = MirostatV2(n_vocab=4, tau=1.0, eta=0.5, rng=rng)
    probs = np.array([0.6, 0.3, 0.08, 0.02])
    miro.mu = 2.0                        # keeps tokens with surprise <= 2 bits: p >= 0.25
    token = miro.select(cand_of(log_probs(probs)))
    assert token in (0, 1)
    renormalized = probs[token] / 0.9
    miro.accept(token)
    assert miro.mu == pytest.approx(2.0 - 0.5 * (-math.log2(renormalized) - 1.0))
    miro.accept(token)                   # no pending selection: mu stays
    assert miro.mu == pytest.approx(2.0 - 0.5 * (-math.log2(renormalized) - 1.0))


def test_mirostat_v1_estimates_k_and_updates_mu():
    rng = np.random.default_rng(0)
    miro = Mirostat(n_vocab=1000, tau=3.0, eta=0.1, rng=rng, m=100)
    ranks = np.arange(1, 1001)
    probs = 1.0 / ranks ** 1.2
    probs /= probs.sum()
    k = miro._estimate_k(np.sort(probs)[::-1][:100])
    s_hat = 1.2   # a perfect Zipf distribution gives back its exponent
    eps = s_hat - 1
    expected_k = (eps * 2 ** miro.mu / (1 - 1000 ** -eps)) ** (1 / s_hat)
    assert k == max(int(expected_k), 1)
    token = miro.select(cand_of(np.log(probs)))
    assert token < k
    before = miro.mu
    miro.accept(token)
    assert miro.mu != before and miro.pending is None


def test_dist_draws_follow_the_softmax():
    logits = np.array([1.0, 0.0, -1.0, 2.0], dtype=np.float32)
    rng = np.random.default_rng(5)
    draws = [Dist(rng).select(cand_of(logits)) for _ in range(20_000)]
    counts = np.bincount(draws, minlength=4) / len(draws)
    assert np.allclose(counts, ref_softmax(logits), atol=0.015)


def test_dist_never_draws_a_banned_token():
    logits = np.array([-np.inf, 0.0, -np.inf], dtype=np.float32)
    rng = np.random.default_rng(0)
    assert {Dist(rng).select(cand_of(logits)) for _ in range(200)} == {1}


# ---- the chain


def names(chain):
    return [s.name for s in chain.samplers]


def test_chain_order_default_custom_and_mirostat():
    assert names(SamplerChain(SamplingOptions(), 10)) == list(SAMPLER_NAMES)
    assert names(SamplerChain(SamplingOptions(samplers=["temperature", "top_k"]), 10)) == ["temperature", "top_k"]
    assert names(SamplerChain(SamplingOptions(logit_bias={1: 2.0}), 10))[0] == "logit_bias"
    miro = SamplerChain(SamplingOptions(mirostat=2), 10)
    assert names(miro) == ["penalties", "temperature"] and miro._draw.name == "mirostat_v2"
    greedy = SamplerChain(SamplingOptions(temperature=0), 10)
    assert names(greedy) == ["penalties", "dry"]


def manual_chain(logits, order, opts, rng):
    cand = cand_of(logits)
    makers = {"top_k": lambda: TopK(opts.top_k), "top_p": lambda: TopP(opts.top_p),
              "min_p": lambda: MinP(opts.min_p), "typ_p": lambda: Typical(opts.typical_p),
              "temperature": lambda: Temperature(opts.temperature), "top_n_sigma": lambda: TopNSigma(opts.top_n_sigma)}
    for name in order:
        makers[name]().apply(cand)
    return Dist(rng).select(cand)


@pytest.mark.parametrize("order", list(itertools.permutations(["top_k", "top_p", "min_p", "temperature"]))[::3]
                         + [("typ_p", "top_n_sigma", "temperature", "top_k"), ("temperature", "typ_p")])
def test_chain_applies_samplers_in_the_given_order(order):
    opts = SamplingOptions(seed=7, samplers=list(order), top_k=6, top_p=0.8, min_p=0.1, typical_p=0.9,
                           top_n_sigma=1.5, temperature=0.7, repeat_penalty=1.0)
    chain = SamplerChain(opts, 64)
    rng = np.random.default_rng(7)
    logits = np.random.default_rng(3).standard_normal(64).astype(np.float32) * 2
    for _ in range(20):
        assert chain.sample(logits) == manual_chain(logits, order, opts, rng)


def test_order_changes_the_result():
    logits = np.log(np.array([0.5, 0.2, 0.2, 0.1])).astype(np.float32)
    kept = []
    for order in (["min_p", "temperature"], ["temperature", "min_p"]):
        chain = SamplerChain(SamplingOptions(samplers=order, min_p=0.3, temperature=3.0, seed=0), 4)
        kept.append({chain.sample(logits) for _ in range(300)})
    assert kept[0] == {0, 1, 2} and kept[1] == {0, 1, 2, 3}


def test_greedy_is_argmax_ignores_seed_and_draws_nothing():
    logits = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    for seed in (None, 1, 2):
        chain = SamplerChain(SamplingOptions(temperature=0, seed=seed), 1000)
        state = chain._rng.bit_generator.state
        assert chain.sample(logits) == int(np.argmax(logits))
        assert chain._rng.bit_generator.state == state
    tied = np.zeros(10, dtype=np.float32)
    assert SamplerChain(SamplingOptions(temperature=0), 10).sample(tied) == 0


def test_greedy_still_applies_repetition_penalty():
    logits = np.array([3.0, 2.9, 0.0], dtype=np.float32)
    chain = SamplerChain(SamplingOptions(temperature=0, repeat_penalty=1.5), 3)
    assert chain.sample(logits) == 0
    chain.accept(0)
    assert chain.sample(logits) == 1


def test_seed_reproduces_and_different_seeds_differ():
    rng = np.random.default_rng(0)
    all_logits = [rng.standard_normal(500).astype(np.float32) for _ in range(50)]

    def run(seed):
        chain = SamplerChain(SamplingOptions(seed=seed, top_k=0, top_p=1.0, temperature=1.5), 500)
        out = []
        for logits in all_logits:
            out.append(chain.sample(logits))
            chain.accept(out[-1])
        return out
    assert run(42) == run(42)
    assert run(42) != run(43)


def test_reset_and_clone_reproduce_the_sequence():
    rng = np.random.default_rng(1)
    all_logits = [rng.standard_normal(300).astype(np.float32) for _ in range(30)]
    chain = SamplerChain(SamplingOptions(seed=9, mirostat=2), 300)

    def run(ch, logits_list):
        out = []
        for logits in logits_list:
            out.append(ch.sample(logits))
            ch.accept(out[-1])
        return out
    first_half = run(chain, all_logits[:15])
    twin = chain.clone()
    assert run(chain, all_logits[15:]) == run(twin, all_logits[15:])
    chain.reset()
    assert run(chain, all_logits[:15]) == first_half


def test_sample_does_not_modify_the_callers_logits():
    logits = np.random.default_rng(2).standard_normal(100).astype(np.float32)
    before = logits.copy()
    chain = SamplerChain(SamplingOptions(seed=0, logit_bias={3: 4.0}, repeat_penalty=1.3), 100)
    chain.accept(5)
    chain.sample(logits)
    SamplerChain(SamplingOptions(temperature=0, logit_bias={3: 4.0}), 100).sample(logits)
    assert np.array_equal(logits, before)


@pytest.mark.parametrize("bad, message", [(np.nan, "NaN"), (np.inf, r"\+inf")])
def test_nan_and_positive_infinity_raise(bad, message):
    logits = np.zeros(20, dtype=np.float32)
    logits[7] = bad
    for opts in (SamplingOptions(seed=0), SamplingOptions(temperature=0)):
        with pytest.raises(SamplingError, match=message):
            SamplerChain(opts, 20).sample(logits)


def test_all_minus_infinity_and_wrong_shapes_raise():
    chain = SamplerChain(SamplingOptions(seed=0), 4)
    with pytest.raises(SamplingError, match="-inf"):
        chain.sample(np.full(4, -np.inf, dtype=np.float32))
    with pytest.raises(SamplingError, match="shape"):
        chain.sample(np.zeros(5, dtype=np.float32))
    with pytest.raises(SamplingError):
        chain.sample(np.zeros(4, dtype=np.int32))


def test_all_but_one_minus_infinity_always_picks_it():
    logits = np.full(1000, -np.inf, dtype=np.float32)
    logits[321] = -50.0
    for opts in (SamplingOptions(seed=1), SamplingOptions(seed=2, top_k=0, top_p=0.5, min_p=0.5, typical_p=0.5,
                                                           top_n_sigma=1.0, xtc_probability=1.0, xtc_threshold=0.1),
                 SamplingOptions(temperature=0), SamplingOptions(seed=3, mirostat=1), SamplingOptions(seed=3, mirostat=2)):
        chain = SamplerChain(opts, 1000)
        assert {chain.sample(logits) for _ in range(5)} == {321}


def test_k_larger_than_vocab_and_p_extremes_on_tiny_vocab():
    logits = np.array([0.0, 1.0], dtype=np.float32)
    for opts in (SamplingOptions(seed=0, top_k=100), SamplingOptions(seed=0, top_p=0.0),
                 SamplingOptions(seed=0, top_p=1.0, min_p=1.0)):
        chain = SamplerChain(opts, 2)
        picks = {chain.sample(logits) for _ in range(50)}
        assert picks == ({0, 1} if opts.top_k == 100 else {1})


def test_logit_bias_is_validated_against_the_vocabulary():
    with pytest.raises(InvalidOptionError, match="logit_bias"):
        SamplerChain(SamplingOptions(logit_bias={10: 1.0}), 10)
    with pytest.raises(InvalidOptionError, match="token"):
        SamplerChain(SamplingOptions(), 10).accept(10)


def test_logprobs_are_the_log_softmax_of_raw_logits():
    logits = np.random.default_rng(4).standard_normal(50).astype(np.float32)
    chain = SamplerChain(SamplingOptions(), 50)
    token_lp, top = chain.logprobs(logits, 7, 5)
    reference = np.log(ref_softmax(logits))
    assert token_lp == pytest.approx(reference[7], abs=1e-5)
    assert [t for t, _ in top] == np.argsort(-reference)[:5].tolist()
    assert all(lp == pytest.approx(reference[t], abs=1e-5) for t, lp in top)


def test_chain_dry_uses_piece_breakers():
    pieces = [b"a", b"b", b"c", b"\n", b"d"]
    opts = SamplingOptions(seed=0, temperature=0, dry_multiplier=5.0, dry_allowed_length=1, repeat_penalty=1.0)
    chain = SamplerChain(opts, 5, pieces)
    for token in [0, 1, 2, 0, 1]:
        chain.accept(token)
    logits = np.array([0, 0, 1.0, 0, 0.5], dtype=np.float32)
    assert chain.sample(logits) == 4            # "c" would continue the repeat "a b"
    for token in [3, 0, 1]:
        chain.accept(token)
    assert chain.sample(logits) == 4


def test_speed_budget_on_a_big_vocabulary():
    # Generous bounds: catch a full sort or a Python loop over the vocabulary, not jitter.
    n = 262_144
    rng = np.random.default_rng(0)
    logits = [(rng.standard_normal(n) * 3).astype(np.float32) for _ in range(4)]
    for opts, budget_ms in ((SamplingOptions(temperature=0), 2.0), (SamplingOptions(seed=0), 8.0)):
        chain = SamplerChain(opts, n)
        for token in rng.integers(0, n, 64).tolist():
            chain.accept(token)
        chain.sample(logits[0])
        start = time.perf_counter()
        for step in range(40):
            chain.accept(chain.sample(logits[step % 4]))
        assert (time.perf_counter() - start) / 40 * 1e3 < budget_ms


def test_accept_prompt_feeds_penalties_but_not_the_grammar_or_mirostat():
    chain = SamplerChain(SamplingOptions(temperature=0, repeat_penalty=2.0), 3)
    logits = np.array([1.0, 0.8, 0.0], dtype=np.float32)
    chain.accept_prompt([0, 0])
    assert chain.sample(logits) == 1
    with pytest.raises(InvalidOptionError):
        chain.accept_prompt([3])


def test_pieces_must_be_bytes():
    with pytest.raises(InvalidOptionError, match="bytes"):
        SamplerChain(SamplingOptions(dry_multiplier=1.0), 2, ["a", "b"])
    with pytest.raises(InvalidOptionError, match="n_vocab"):
        SamplerChain(SamplingOptions(), 3, [b"a", b"b"])


def test_minus_one_windows_use_the_context_size():
    chain = SamplerChain(SamplingOptions(repeat_last_n=-1, dry_penalty_last_n=-1, dry_multiplier=1.0), 10, n_ctx=3)
    penalties, dry = chain.samplers[0], chain.samplers[1]
    assert penalties.last_n == 3 and dry.last_n == 3
    assert SamplerChain(SamplingOptions(repeat_last_n=-1), 10).samplers[0].last_n is None


def full_rewrite_argmax(chain, logits):
    """Greedy the long way: every active rewriting sampler over a copy of the whole
    vocabulary, then the first largest logit."""
    cand = Candidates(np.arange(len(logits)), logits.astype(np.float32).copy(), identity=True)
    for sampler in chain.samplers:
        if sampler.active:
            sampler.apply(cand)
    return int(np.argmax(cand.logits))


@pytest.mark.parametrize("writeable", [True, False])
def test_greedy_under_penalties_leaves_the_callers_logits_as_they_were(writeable):
    """A penalised best token makes the greedy pick mask the penalised logits off for one
    argmax, in the chain's own buffer: the pick is the full rewrite's, and the caller's
    logits, writeable or read-only, are left as they were."""
    rng = np.random.default_rng(3)
    chain = SamplerChain(SamplingOptions(temperature=0, repeat_penalty=1.5, repeat_last_n=8), 50)
    for token in (4, 7, 7, 9):
        chain.accept(token)
    for _ in range(20):
        logits = rng.standard_normal(50).astype(np.float32)
        logits[rng.choice([4, 7, 9])] = 5.0   # a penalised token is the raw best
        before = logits.copy()
        logits.flags.writeable = writeable
        assert chain.sample(logits) == full_rewrite_argmax(chain, before)
        assert np.array_equal(logits, before)


@pytest.mark.parametrize("seed", range(6))
def test_greedy_rewrites_only_touched_tokens_yet_picks_as_a_full_rewrite(seed):
    """Greedy with logit bias, penalties (also ones that raise logits) and DRY rewrites only
    the tokens those samplers touch; on logits full of ties it picks exactly what rewriting
    the whole vocabulary picks, the lower id on a tie."""
    rng = np.random.default_rng(seed)
    n_vocab = 40
    pieces = [bytes([97 + i % 26]) for i in range(n_vocab)]
    for trial in range(60):
        bias = {int(t): float(rng.choice([-np.inf, -1.0, 0.5, 2.0])) for t in rng.choice(n_vocab, 3)}
        opts = SamplingOptions(temperature=0, repeat_penalty=float(rng.choice([1.3, 0.8, 1.0])),
                               frequency_penalty=float(rng.choice([0.0, 0.5, -0.5])),
                               presence_penalty=float(rng.choice([0.0, 0.25, -0.25])), repeat_last_n=16,
                               dry_multiplier=float(rng.choice([0.0, 0.8])), dry_allowed_length=2,
                               logit_bias=bias if trial % 2 else None)
        chain = SamplerChain(opts, n_vocab, token_pieces=pieces)
        for token in rng.integers(0, 6, 24):   # a small alphabet: plenty of repeats
            chain.accept(int(token))
        logits = rng.integers(-3, 4, n_vocab).astype(np.float32)   # many ties
        assert chain.sample(logits) == full_rewrite_argmax(chain, logits), (seed, trial)


@pytest.mark.parametrize("last_n", [None, 1, 3, 64])
def test_penalties_accept_many_leaves_the_state_one_by_one_leaves(last_n):
    rng = np.random.default_rng(7)
    for before, prompt in ((5, 200), (0, 2), (40, 3)):
        one, many = (Penalties(last_n=last_n, repeat=1.3, frequency=0.2, presence=0.1) for _ in range(2))
        for token in rng.integers(0, 50, before).tolist():
            one.accept(token)
            many.accept(token)
        tokens = rng.integers(0, 50, prompt).tolist()
        for token in tokens:
            one.accept(token)
        many.accept_many(tokens)
        assert list(many.history) == list(one.history) and many.counts == one.counts
