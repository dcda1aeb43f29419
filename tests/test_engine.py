"""The batch loop on a tiny synthetic llama: many callers, cancellation, stop strings,
logprobs, context limits and shifts, prefix reuse, grammars, asyncio."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
from engine_support import engine_factory, never_eog, shift_with_a_live_sharer
from engine_support import random_prompt as prompt

from pyengine.errors import ContextLengthError, InvalidOptionError, SamplingError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.runner.engine import Engine
from pyengine.runner.sequence import Chunk, Completion
from pyengine.sample import Grammar, SamplingOptions
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"
GREEDY = SamplingOptions(temperature=0.0, repeat_penalty=1.0)


@pytest.fixture(scope="module")
def parts():
    gguf = GGUFFile(SYNTH / "llama-f16.gguf")
    return load_model(gguf), Tokenizer.from_gguf(gguf), Backend(1)


@pytest.fixture
def make(parts):
    yield from engine_factory(parts, n_ctx=128)


# ---- many callers ------------------------------------------------------------------------


def test_32_concurrent_callers_get_their_alone_results_and_no_cells_leak(make):
    engine = make(n_parallel=4, n_batch=16)
    opts = never_eog(engine)
    prompts = [prompt(i, 5 + i % 13) for i in range(32)]
    alone = []
    for p in prompts:
        alone.append(engine.submit(p, opts, max_tokens=12, cache_prompt=False).result().tokens)
    assert engine.stats()["cells_used"] == 0
    results = [None] * 32
    barrier = threading.Barrier(32)

    def caller(i: int) -> None:
        barrier.wait()
        results[i] = engine.submit(prompts[i], opts, max_tokens=12).result()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [r.tokens for r in results] == alone
    assert all(r.finish_reason == "length" and r.prompt_tokens == len(p) for r, p in zip(results, prompts))
    stats = engine.stats()
    assert stats["live"] == 0 and stats["waiting"] == 0 and stats["cells_live"] == 0
    engine.drop_cache()
    assert engine.stats()["cells_used"] == 0 and engine.cache.n_used == 0


def test_async_callers(make):
    engine = make(n_parallel=2)
    opts = never_eog(engine)
    alone = [engine.submit(prompt(i), opts, max_tokens=6).result().tokens for i in range(4)]

    async def run(i: int) -> list[int]:
        tokens = []
        async for event in engine.submit(prompt(i), opts, max_tokens=6):
            if isinstance(event, Chunk):
                tokens.extend(event.tokens)
            else:
                assert event.tokens == tokens
        return tokens

    async def main():
        return await asyncio.gather(*(run(i) for i in range(4)))

    assert asyncio.run(main()) == alone


# ---- cancellation --------------------------------------------------------------------------


def test_cancel_frees_the_cells_at_the_next_step(make):
    engine = make(n_parallel=2)
    handle = engine.submit(prompt(1), never_eog(engine), max_tokens=None, shift=True)
    events = iter(handle)
    for _ in range(5):
        assert isinstance(next(events), Chunk)
    assert engine.stats()["cells_live"] > 0
    handle.cancel()
    last = [e for e in events][-1]
    assert isinstance(last, Completion) and last.finish_reason == "cancelled"
    assert len(last.tokens) >= 5 and handle.done
    assert engine.cache.n_used == 0 and engine.stats()["live"] == 0


def test_cancel_while_queued_and_close(make):
    engine = make(n_parallel=1)
    opts = never_eog(engine)
    first = engine.submit(prompt(1), opts, max_tokens=None)
    queued = engine.submit(prompt(2), opts, max_tokens=5)
    queued.cancel()
    result = queued.result(timeout=30)
    assert result.finish_reason == "cancelled" and result.tokens == []
    next(iter(first))
    engine.close()
    assert first.result(timeout=30).finish_reason == "cancelled"
    with pytest.raises(Exception, match="closed"):
        engine.submit(prompt(3), opts)


# ---- text: stop strings, UTF-8, EOG -------------------------------------------------------


def test_stop_strings_are_never_emitted_then_retracted(make):
    engine = make()
    opts = never_eog(engine)
    full = engine.submit(prompt(4), opts, max_tokens=40).result()
    text = full.text
    assert len(text) > 20
    stop = text[len(text) // 2: len(text) // 2 + 3]     # likely spans a token boundary
    cut = text.index(stop)
    streamed = ""
    handle = engine.submit(prompt(4), opts, max_tokens=40, stop=["\x00never", stop])
    for event in handle:
        if isinstance(event, Chunk):
            streamed += event.text
            assert text.startswith(streamed) and len(streamed) <= cut
    result = handle.completion
    assert result.finish_reason == "stop" and result.stop_string == stop
    assert streamed == result.text == text[:cut]


def test_streamed_text_holds_back_split_characters(make):
    """Random byte-level tokens split multi-byte characters; the pieces streamed must
    add up to the one-shot decoding of all the tokens (nothing emitted half-formed)."""
    engine = make()
    multibyte = 0
    for seed in range(6):
        opts = SamplingOptions(temperature=2.0, top_k=0, top_p=1.0, seed=seed,
                               logit_bias={t: False for t in engine.eog_ids})
        handle = engine.submit(prompt(seed), opts, max_tokens=48)
        pieces = [e.text for e in handle.chunks()]
        result = handle.completion
        assert "".join(pieces) == result.text == engine.tokenizer.decode(result.tokens)
        multibyte += sum(1 for ch in result.text if ord(ch) > 127)
    assert multibyte > 0     # the test did meet characters longer than a byte


def test_eog_ends_with_stop_and_is_not_in_the_text(make):
    engine = make()
    eog = min(engine.eog_ids)
    opts = SamplingOptions(temperature=0.0, logit_bias={eog: 100.0})
    result = engine.submit(prompt(5), opts, max_tokens=10).result()
    assert result.finish_reason == "stop" and result.tokens == [] and result.text == ""


def test_max_tokens(make):
    engine = make()
    opts = never_eog(engine)
    assert engine.submit(prompt(6), opts, max_tokens=0).result().tokens == []
    result = engine.submit(prompt(6), opts, max_tokens=7).result()
    assert len(result.tokens) == 7 and result.finish_reason == "length"
    assert result.prompt_seconds > 0 and result.generation_seconds > 0


# ---- logprobs ------------------------------------------------------------------------------


def test_logprobs_shape_and_values(make):
    engine = make()
    opts = never_eog(engine)
    result = engine.submit(prompt(7), opts, max_tokens=8, logprobs=True, top_logprobs=5).result()
    assert len(result.logprobs) == len(result.tokens) == 8
    for token, lp in zip(result.tokens, result.logprobs):
        assert lp.token == token and lp.logprob <= 0
        values = [v for _, v in lp.top]
        assert len(lp.top) == 5 and values == sorted(values, reverse=True)
        assert lp.top[0][0] == token and lp.top[0][1] == pytest.approx(lp.logprob)   # greedy
        assert np.exp(values).sum() <= 1.0 + 1e-6
    plain = engine.submit(prompt(7), opts, max_tokens=8).result()
    assert plain.logprobs is None and plain.tokens == result.tokens
    assert engine.submit(prompt(7), opts, max_tokens=2, top_logprobs=20).result().logprobs[0].top.__len__() == 20
    with pytest.raises(InvalidOptionError, match="top_logprobs"):
        engine.submit(prompt(7), opts, top_logprobs=21)


# ---- context -------------------------------------------------------------------------------


def test_prompt_longer_than_the_context(make):
    engine = make(n_ctx=32)
    opts = never_eog(engine)
    with pytest.raises(ContextLengthError, match=r"40 tokens.*32"):
        engine.submit(prompt(8, 40), opts, shift=False)
    with pytest.raises(InvalidOptionError, match="num_ctx"):
        engine.submit(prompt(8), opts, num_ctx=64)
    with pytest.raises(ContextLengthError, match=r"40 tokens.*32"):
        engine.submit(prompt(8, 40), opts)            # shift on, but no truncation asked for
    result = engine.submit(prompt(8, 40), opts, max_tokens=4, num_keep=4, truncate=True).result()
    assert result.truncated_tokens == 40 - 4 - 14 and result.prompt_tokens == 18
    assert len(result.tokens) == 4


def test_generation_stops_at_the_context_without_shift(make):
    engine = make(n_ctx=32)
    result = engine.submit(prompt(9, 20), never_eog(engine), max_tokens=100, shift=False).result()
    assert result.finish_reason == "length" and len(result.tokens) == 32 - 20 + 1
    assert result.context_shifts == 0
    filled = engine.submit(prompt(9, 20), never_eog(engine), max_tokens=-2).result()
    assert len(filled.tokens) == 32 - 20 and filled.finish_reason == "length"


def test_generation_continues_past_the_context_with_shift(make):
    engine = make(n_ctx=32, n_parallel=2)
    result = engine.submit(prompt(9, 20), never_eog(engine), max_tokens=100, num_keep=5).result()
    assert len(result.tokens) == 100 and result.context_shifts >= 3
    assert engine.stats()["cells_live"] == 0


def test_shift_with_a_live_sharer_matches_each_alone(make):
    """The second request reuses the first's live prefix cells; both then shift past the
    context, which must copy the shared cells that move.  Each gets its alone output."""
    engine = make(n_ctx=40, n_parallel=2, n_batch=64, background=False)
    alone, ra, rb = shift_with_a_live_sharer(engine, prompt(10, 24), max_tokens=50)
    assert rb.cached_tokens == 24 and ra.context_shifts > 0 and rb.context_shifts > 0
    assert [ra.tokens, rb.tokens] == alone
    assert engine.stats()["cells_live"] == 0


# ---- prefix reuse --------------------------------------------------------------------------


def test_a_shifted_request_leaves_only_its_kept_tokens_reusable(make):
    """After a shift the cells past num_keep no longer equal a fresh computation: a prompt
    equal to everything the finished request left cached reuses num_keep tokens, and gets
    the output of computing the rest afresh."""
    engine = make(n_ctx=32)
    opts = never_eog(engine)
    first = engine.submit(prompt(13, 20), opts, max_tokens=20, num_keep=5).result()
    assert first.context_shifts >= 1
    (idle,) = engine.slots.idle_with_cells()
    assert idle.valid == 5 and len(idle.tokens) > 5
    follow = idle.tokens + [7]
    second = engine.submit(follow, opts, max_tokens=4, shift=False).result()
    fresh = engine.submit(follow, opts, max_tokens=4, shift=False, cache_prompt=False).result()
    assert second.cached_tokens == 5 and fresh.cached_tokens == 0
    assert second.tokens == fresh.tokens



def test_prefix_reuse_from_a_finished_request(make):
    engine = make(n_ctx=128)
    opts = never_eog(engine)
    base = prompt(11, 60)
    first = engine.submit(base, opts, max_tokens=5).result()
    follow = base + first.tokens + prompt(12, 6)
    second = engine.submit(follow, opts, max_tokens=5).result()
    assert second.cached_tokens == 60 + 4          # the last sampled token was never fed
    fresh = engine.submit(follow, opts, max_tokens=5, cache_prompt=False).result()
    assert fresh.cached_tokens == 0 and fresh.tokens == second.tokens
    again = engine.submit(base, opts, max_tokens=5).result()
    assert again.cached_tokens == 59 and again.tokens == first.tokens   # one token left to compute


# ---- sampling options through the engine ---------------------------------------------------


def test_grammar_constrains_the_output(make):
    engine = make()
    grammar = Grammar.from_gbnf('root ::= ("ab" | "ba") "!"')
    for seed in range(3):
        opts = SamplingOptions(temperature=1.0, seed=seed)
        result = engine.submit(prompt(seed), opts, max_tokens=10, grammar=grammar).result()
        assert result.text in ("ab!", "ba!") and result.finish_reason == "stop"


def test_seed_reproduces_and_errors_reach_the_caller(make):
    engine = make()
    opts = SamplingOptions(temperature=1.5, seed=42)
    runs = [engine.submit(prompt(13), opts, max_tokens=10).result().tokens for _ in range(2)]
    assert runs[0] == runs[1]
    everything_banned = SamplingOptions(temperature=0.0, logit_bias={t: False for t in range(512)})
    with pytest.raises(SamplingError):
        engine.submit(prompt(13), everything_banned, max_tokens=3).result()
    assert engine.submit(prompt(13), opts, max_tokens=10).result().tokens == runs[0]   # still serving
    assert engine.stats()["cells_live"] == 0


def test_bad_requests_raise_in_the_caller(make):
    engine = make()
    with pytest.raises(InvalidOptionError, match="empty"):
        engine.submit([])
    with pytest.raises(InvalidOptionError, match="out of range"):
        engine.submit([1, 600])
    with pytest.raises(InvalidOptionError, match="stop"):
        engine.submit([1, 2], stop=[3])
    with pytest.raises(InvalidOptionError, match="num_predict"):
        engine.submit([1, 2], max_tokens=-5)
    with pytest.raises(InvalidOptionError, match="n_parallel"):
        Engine(engine.model, engine.tokenizer, engine.backend, n_ctx=16, n_parallel=65)


def test_result_asked_twice_gives_the_same_completion(make):
    engine = make()
    handle = engine.submit(prompt(3), never_eog(engine), max_tokens=4)
    first = handle.result()
    assert handle.result() is first and len(first.tokens) == 4
