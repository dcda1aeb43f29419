"""Speculative decoding (runner/speculative.py) on tiny synthetic llamas sharing one 512-token
vocabulary: the output equals plain decoding token for token (greedy, seeded sampling, a
grammar, concurrent company), drafts get accepted where the text repeats, the acceptance rule
keeps the target's distribution, bad options and unfit models are refused, and the server
reports the drafts."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from engine_support import drive, engine_factory

from pyengine.errors import ContextLengthError, InvalidOptionError, TokenizerError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.runner.sequence import Chunk
from pyengine.runner.speculative import (
    DraftModel, accept_probability, check_same_vocab, ngram_draft, residual, speculative_draw, verify)
from pyengine.sample import Grammar, SamplerChain, SamplingOptions
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"
TARGET, OTHER = SYNTH / "llama-f16.gguf", SYNTH / "llama-bpe-q5_1-tied.gguf"   # one vocabulary
REPEATS = [5, 6, 7, 8, 9, 10, 11, 12] * 4


def _parts(path: Path):
    gguf = GGUFFile(path)
    return load_model(gguf), Tokenizer.from_gguf(gguf)


@pytest.fixture(scope="module")
def parts():
    model, tok = _parts(TARGET)
    return model, tok, Backend(1)


@pytest.fixture
def make(parts):
    yield from engine_factory(parts, n_ctx=256, n_parallel=4, n_batch=64)


def _draft(parts, path: Path | None = None) -> DraftModel:
    model, tok, backend = parts
    if path is not None:
        model, tok = _parts(path)
    return DraftModel(model, tok, backend, n_ctx=256, n_parallel=4, n_batch=64)


def _greedy(engine) -> SamplingOptions:
    return SamplingOptions(temperature=0.0, repeat_penalty=1.0, logit_bias={t: False for t in engine.eog_ids})


def _run(engine, prompt, options, **fields):
    return engine.submit(prompt, options, cache_prompt=False, **fields).result()


# ---- drafting ------------------------------------------------------------------------------


def test_ngram_draft_takes_the_longest_latest_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3]
    assert ngram_draft(tokens, 4, 2, 3) == [4, 5, 7]          # [2, 3] last followed by 4 (latest)
    assert ngram_draft(tokens + [4], 4, 2, 2) == [5, 7]       # [2, 3, 4] beats the shorter matches
    assert ngram_draft([1, 2, 3, 4], 4, 2, 8) == []           # nothing recurs
    assert ngram_draft([3, 3, 3], 2, 1, 4) == [3]             # an occurrence may run into the suffix
    assert ngram_draft(tokens, 4, 2, 0) == []


# ---- the output is plain decoding's ----------------------------------------------------------


def test_ngram_greedy_is_identical_and_accepts_drafts_on_repeats(make):
    engine = make()
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=60, speculative="off")
    fast = _run(engine, REPEATS, _greedy(engine), max_tokens=60, speculative="ngram")
    assert fast.tokens == plain.tokens and fast.text == plain.text
    assert fast.draft_accepted > 0 and fast.draft_tokens >= fast.draft_accepted
    assert fast.speculative == "ngram" and plain.speculative is None and plain.draft_tokens == 0
    assert 0 < fast.draft_acceptance <= 1


def test_a_draft_model_that_is_the_target_accepts_every_token(make, parts):
    engine = make(draft=_draft(parts))
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=50)
    fast = _run(engine, REPEATS, _greedy(engine), max_tokens=50, speculative="draft")
    assert fast.tokens == plain.tokens
    assert fast.draft_tokens > 0 and fast.draft_accepted == fast.draft_tokens


def test_another_draft_model_gives_the_same_tokens(make, parts):
    engine = make(draft=_draft(parts, OTHER))
    for prompt in (REPEATS, [40, 41, 300, 7, 19]):
        plain = _run(engine, prompt, _greedy(engine), max_tokens=40)
        fast = _run(engine, prompt, _greedy(engine), max_tokens=40, speculative="draft")
        assert fast.tokens == plain.tokens
        assert fast.draft_tokens > 0


def test_seeded_sampling_is_identical_with_speculation(make, parts):
    """The chain picks from each verified row as a plain step would, consuming its random
    draws in the same order: a seeded sampled output does not change."""
    engine = make(draft=_draft(parts))
    options = SamplingOptions(temperature=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1, seed=7,
                              logit_bias={t: False for t in engine.eog_ids})
    plain = _run(engine, REPEATS, options, max_tokens=48, logprobs=True, top_logprobs=3)
    for mode in ("ngram", "draft"):
        fast = _run(engine, REPEATS, options, max_tokens=48, speculative=mode, logprobs=True, top_logprobs=3)
        assert fast.tokens == plain.tokens, mode
        assert fast.logprobs == plain.logprobs, mode   # each from its own verified row
    assert fast.draft_accepted > 0   # the target drafting for itself with sampling still hits


def test_rejected_drafts_leave_every_kept_token_reusable(make):
    """A speculating request whose drafts were partly rejected leaves its cells valid up
    to the last token it fed: a follow-up reuses all of them."""
    engine = make()
    first = engine.submit(REPEATS, _greedy(engine), max_tokens=40, speculative="ngram").result()
    assert 0 < first.draft_tokens and first.draft_accepted < first.draft_tokens
    follow = REPEATS + first.tokens + [40, 41]
    second = engine.submit(follow, _greedy(engine), max_tokens=8).result()
    fresh = _run(engine, follow, _greedy(engine), max_tokens=8)
    assert second.cached_tokens == len(REPEATS) + len(first.tokens) - 1   # the last pick was never fed
    assert second.tokens == fresh.tokens


def test_grammar_output_is_identical_with_speculation(make):
    engine = make()
    grammar = Grammar.from_gbnf('root ::= ("ab" | "cd" | " ")+')
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=30, grammar=grammar)
    fast = _run(engine, REPEATS, _greedy(engine), max_tokens=30, grammar=grammar, speculative="ngram")
    assert fast.tokens == plain.tokens
    assert set(fast.text) <= set("abcd ")


def test_max_tokens_and_stop_strings_hold(make, parts):
    engine = make(draft=_draft(parts))
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=37)
    fast = _run(engine, REPEATS, _greedy(engine), max_tokens=37, speculative="draft")
    assert len(fast.tokens) == 37 and fast.tokens == plain.tokens and fast.finish_reason == "length"
    stop = plain.text[len(plain.text) // 2:][:3]
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=37, stop=[stop])
    fast = _run(engine, REPEATS, _greedy(engine), max_tokens=37, stop=[stop], speculative="draft")
    assert (fast.text, fast.stop_string, fast.finish_reason) == (plain.text, plain.stop_string, "stop")


def test_concurrent_speculative_and_plain_requests_match_each_alone(make, parts):
    engine = make(draft=_draft(parts, OTHER), background=False)
    prompts = [REPEATS, [30, 31, 32, 30, 31, 32, 30], [200, 17, 4, 88], REPEATS[3:]]
    modes = ["ngram", "off", "draft", "ngram"]
    alone = []
    for prompt, mode in zip(prompts, modes):
        handle = engine.submit(prompt, _greedy(engine), max_tokens=30, speculative="off", cache_prompt=False)
        drive(engine)
        alone.append(handle.result().tokens)
    handles = [engine.submit(p, _greedy(engine), max_tokens=30, speculative=m) for p, m in zip(prompts, modes)]
    drive(engine)
    assert [h.result().tokens for h in handles] == alone
    assert engine.slots.live_cells() == 0


def test_cancel_mid_draft_and_the_engine_goes_on(make):
    engine = make()
    handle = engine.submit(REPEATS, _greedy(engine), max_tokens=200, speculative="ngram")
    for event in handle:
        if isinstance(event, Chunk) and event.tokens:
            handle.cancel()
            break
    assert handle.result().finish_reason == "cancelled"
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=40)
    again = _run(engine, REPEATS, _greedy(engine), max_tokens=40, speculative="ngram")
    assert again.tokens == plain.tokens
    assert engine.slots.live_cells() == 0


def test_the_engine_default_and_a_request_turning_it_off(make):
    engine = make(speculative="ngram")
    assert _run(engine, REPEATS, _greedy(engine), max_tokens=20).speculative == "ngram"
    assert _run(engine, REPEATS, _greedy(engine), max_tokens=20, speculative="off").speculative is None


# ---- the acceptance rule ---------------------------------------------------------------------


def test_leviathan_rule_keeps_the_target_distribution():
    rng = np.random.default_rng(0)
    n, draws = 6, 40_000
    for _ in range(3):
        p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        counts = np.bincount([speculative_draw(p, q, rng) for _ in range(draws)], minlength=n)
        assert 0.5 * np.abs(counts / draws - p).sum() < 0.015
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.6, 0.3])
    assert accept_probability(p, q, 0) == 1.0 and accept_probability(p, q, 1) == pytest.approx(0.5)
    np.testing.assert_allclose(residual(p, q), [1.0, 0.0, 0.0])


def test_verifying_a_point_mass_draft_keeps_the_chain_distribution():
    """A draft token x is accepted with probability p(x), and the tokens that come out follow
    p (the chain's distribution after its transforms), as a plain draw does."""
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, 1.5], np.float32)
    options = dict(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    p = np.exp(logits / 0.7)
    p /= p.sum()
    rows = np.stack([logits, logits])
    first, accepted, draws = [], 0, 6000
    for seed in range(draws):
        chain = SamplerChain(SamplingOptions(seed=seed, **options), len(logits))

        def pick(row, chain=chain):
            token = chain.sample(row)
            chain.accept(token)
            return token, None

        out = verify(pick, rows, [5], lambda t: False, 8)
        first.append(out[0][0])
        accepted += out[0][0] == 5
    counts = np.bincount(first, minlength=len(logits))
    assert 0.5 * np.abs(counts / draws - p).sum() < 0.03
    assert abs(accepted / draws - p[5]) < 0.03


# ---- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, words", [
    ({"speculative": "fast"}, "speculative"),
    ({"speculative": "ngram", "draft_max": 0}, "draft_max"),
    ({"speculative": "ngram", "draft_max": 4, "draft_min": 5}, "draft_min"),
    ({"speculative": "ngram", "ngram_min": 3, "ngram_max": 2}, "ngram_max"),
    ({"speculative": "draft"}, "draft model"),
])
def test_bad_options_raise_in_the_caller(make, fields, words):
    engine = make()
    with pytest.raises(InvalidOptionError, match=words):
        engine.submit(REPEATS, _greedy(engine), **fields)


def test_a_draft_model_with_another_vocabulary_is_refused(parts):
    model, tok, _ = parts
    other, other_tok = _parts(SYNTH / "llama-spm-q4_0.gguf")
    with pytest.raises(TokenizerError, match="token 0"):
        check_same_vocab(tok, model.cfg.n_vocab, other_tok, other.cfg.n_vocab)
    with pytest.raises(TokenizerError, match="600 tokens"):
        check_same_vocab(tok, model.cfg.n_vocab, tok, 600)


def test_a_recurrent_model_refuses_speculation():
    model, tok = _parts(SYNTH / "mamba2-q8_0.gguf")
    parts = (model, tok, Backend(1))
    for build in engine_factory(parts, n_ctx=64, n_parallel=1):
        engine = build()
        with pytest.raises(UnsupportedError, match="recurrent"):
            engine.submit([5, 6, 7], SamplingOptions(temperature=0.0), speculative="ngram")
        default = build(speculative="ngram")   # a default does not apply: plain decoding
        assert default.submit([5, 6, 7], SamplingOptions(temperature=0.0), max_tokens=3).result().speculative is None
        with pytest.raises(UnsupportedError, match="recurrent"):
            _draft((model, tok, Backend(1)))


# ---- the server --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    from pyengine.server import ServerConfig
    from server_support import running_server

    config = ServerConfig(parallel=2, n_ctx=256, models=(str(TARGET),), draft_model=str(TARGET))
    with running_server(config) as running:
        yield running


def test_server_options_and_reported_drafts(server):
    name = TARGET.stem
    options = {"num_predict": 24, "temperature": 0, "speculative": "draft", "draft_max": 8}
    reply = httpx.post(server.url + "/api/generate", json={"model": name, "prompt": "ab ab ab ab", "stream": False,
                                                           "raw": True, "options": options}, timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["speculative"] == "draft" and body["draft_count"] > 0
    assert body["draft_accepted_count"] == body["draft_count"] and body["draft_acceptance"] == 1.0
    reply = httpx.post(server.url + "/v1/completions", json={"model": name, "prompt": "ab ab ab ab", "max_tokens": 24,
                                                             "temperature": 0, "speculative": "ngram"}, timeout=60)
    assert reply.status_code == 200, reply.text
    timings = reply.json()["timings"]
    assert timings["draft_n"] >= timings["draft_n_accepted"] >= 0 and timings["predicted_n"] == 24
    plain = httpx.post(server.url + "/v1/completions", json={"model": name, "prompt": "ab ab ab ab", "max_tokens": 24,
                                                             "temperature": 0}, timeout=60).json()
    assert "timings" not in plain and plain["choices"][0]["text"] == reply.json()["choices"][0]["text"]


@pytest.mark.parametrize("path, body", [
    ("/api/generate", {"prompt": "hi", "stream": False, "options": {"speculative": "fast"}}),
    ("/api/generate", {"prompt": "hi", "stream": False, "options": {"speculative": "ngram", "draft_max": 1000}}),
    ("/v1/completions", {"prompt": "hi", "speculative": "fast"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "speculative": "ngram",
                              "draft_min": -1}),
])
def test_server_bad_speculative_options_are_400(server, path, body):
    reply = httpx.post(server.url + path, json={"model": TARGET.stem, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    assert "draft" in reply.text or "speculative" in reply.text


def test_a_context_shift_with_speculation_matches_plain(make, parts):
    """A shift drops cells in the middle: the n-gram context and the draft model's cache
    follow the sequence's tokens, and the output stays plain decoding's."""
    engine = make(n_ctx=48, draft=_draft(parts, OTHER))
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=70)
    assert plain.context_shifts > 0
    for mode in ("ngram", "draft"):
        fast = _run(engine, REPEATS, _greedy(engine), max_tokens=70, speculative=mode)
        assert fast.tokens == plain.tokens and fast.context_shifts > 0, mode


# ---- the LLM, the bench and the CLI ---------------------------------------------------------


def test_llm_draft_model_and_its_vocabulary_check():
    from pyengine import LLM

    with pytest.raises(TokenizerError, match="draft model's token 0"):
        LLM(str(TARGET), n_ctx=128, n_threads=1, draft_model=str(SYNTH / "llama-spm-q4_0.gguf"))
    with LLM(str(TARGET), n_ctx=128, n_threads=1, n_parallel=1, draft_model=str(TARGET)) as llm:
        plain = llm.generate(REPEATS, max_tokens=24, temperature=0)
        assert llm.generate(REPEATS, max_tokens=24, temperature=0, speculative="draft") == plain
        completion = llm.create_completion(REPEATS, max_tokens=24, temperature=0, speculative="ngram")
        assert completion["choices"][0]["text"] == plain
        assert completion["usage"]["draft_tokens"] >= completion["usage"]["draft_accepted_tokens"] > 0


def test_bench_measures_speculative_generation():
    from pyengine.bench import run_bench

    result = run_bench(str(TARGET), n_threads=1, n_prompt=16, n_gen=16, repeat=1, speculative="ngram")
    assert result["speculative"] == "ngram" and result["spec_tg_tps"] > 0 and result["plain_tg_tps"] > 0
    assert 0.0 <= result["spec_acceptance"] <= 1.0


def test_cli_speculative_flags(capsys):
    from pyengine import cli

    def run(*argv):
        try:
            return cli.main(list(argv))
        except SystemExit as exc:
            return exc.code

    assert run("run", str(TARGET), "hi", "--speculative", "draft") == cli.EXIT_ERROR
    assert "--draft-model" in capsys.readouterr().err
    assert run("bench", str(TARGET), "--prompt-tokens", "8", "--gen-tokens", "8", "--repeat", "1",
               "--threads", "1", "--speculative", "ngram") == cli.EXIT_OK
    assert "drafts accepted" in capsys.readouterr().out
    assert run("serve", "--speculative", "draft", "--model", str(TARGET)) == cli.EXIT_ERROR
    assert "--draft-model" in capsys.readouterr().err


def test_a_failing_draft_model_falls_back_to_plain_steps(make, parts, monkeypatch):
    draft = _draft(parts)
    engine = make(draft=draft)
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=20)

    def broken(*args):
        raise ContextLengthError("the draft's cache is full")

    monkeypatch.setattr(draft, "_feed", broken)
    fast = _run(engine, REPEATS, _greedy(engine), max_tokens=20, speculative="draft")
    assert fast.tokens == plain.tokens and fast.draft_tokens == 0 and fast.finish_reason == "length"


def test_wrong_verifiers_are_caught(make, parts, monkeypatch):
    """The checks above can fail: a verifier that keeps every draft changes the tokens, and
    one that keeps the rejected drafts' cells is refused by the cache."""
    from pyengine.runner import engine as engine_module

    engine = make(draft=_draft(parts, OTHER))
    plain = _run(engine, REPEATS, _greedy(engine), max_tokens=40)

    def keep_every_draft(pick, rows, draft, stops, limit):
        picked = [pick(row) for row in rows[:min(len(rows), limit)]]
        return [(d, extra) for d, (_, extra) in zip(draft, picked)] + picked[len(draft):]

    with monkeypatch.context() as patch:
        patch.setattr(engine_module, "verify", keep_every_draft)
        assert _run(engine, REPEATS, _greedy(engine), max_tokens=40, speculative="draft").tokens != plain.tokens
    monkeypatch.setattr(engine.cache, "remove", lambda *args: None)
    with pytest.raises(InvalidOptionError, match="remove the tail first"):
        _run(engine, REPEATS, _greedy(engine), max_tokens=40, speculative="draft")
