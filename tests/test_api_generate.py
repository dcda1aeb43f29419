"""The Python API on SmolLM2-135M: concurrent generations share the batch loop without
changing anyone's tokens, prefix reuse, OpenAI shapes, Ollama option names and errors."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from pyengine.api import LLM
from pyengine.errors import ContextLengthError, GrammarError, InvalidOptionError

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three laws of robotics are"]


@pytest.fixture(scope="module")
def llm():
    model = LLM("smollm2-135m", n_ctx=1024, n_threads=1, n_parallel=4)
    yield model
    model.close()


def run_threads(fn, n: int) -> list:
    results = [None] * n
    errors = []

    def call(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as error:   # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return results


def test_four_concurrent_greedy_generations_equal_each_alone(llm):
    alone = [llm.submit(p, max_tokens=64, temperature=0, cache_prompt=False).result().tokens for p in PROMPTS]
    steps = llm.stats()["steps"]
    together = run_threads(lambda i: llm.submit(PROMPTS[i], max_tokens=64, temperature=0).result().tokens, 4)
    assert together == alone
    assert all(len(t) == 64 for t in alone)
    assert llm.stats()["steps"] - steps < 2 * 64          # they really shared forward passes
    assert llm.stats()["cells_live"] == 0


def test_prefix_reuse_reaches_the_first_token_much_sooner(llm):
    text = " ".join(f"Item {i}: the {w} is on the table." for i, w in enumerate(
        ["apple", "book", "cup", "lamp", "pen", "phone", "key", "plate"] * 7))
    prefix = llm.tokenize(text)
    assert len(prefix) >= 600
    llm.engine.drop_cache()
    first = llm.submit(prefix + llm.tokenize(" Question one?", add_special=False), max_tokens=1).result()
    second = llm.submit(prefix + llm.tokenize(" Another question?", add_special=False), max_tokens=1).result()
    assert first.cached_tokens == 0 and second.cached_tokens >= 600
    ttft_first = first.queue_seconds + first.prompt_seconds
    ttft_second = second.queue_seconds + second.prompt_seconds
    assert ttft_first >= 5 * ttft_second, (ttft_first, ttft_second)


def test_streaming_equals_the_whole_text_and_stops_hold_back(llm):
    whole = llm.generate(PROMPTS[2], temperature=0, max_tokens=40)
    assert llm.generate(PROMPTS[2], temperature=0, max_tokens=40, stream=False) == whole
    pieces = list(llm.generate(PROMPTS[2], temperature=0, max_tokens=40, stream=True))
    assert "".join(pieces) == whole and len(pieces) > 5
    stop = whole[15:19]
    cut = whole.index(stop)
    streamed = ""
    for piece in llm.generate(PROMPTS[2], temperature=0, max_tokens=40, stream=True, stop=[stop]):
        streamed += piece
        assert whole.startswith(streamed) and len(streamed) <= cut
    assert streamed == whole[:cut]


def test_closing_a_stream_cancels_its_request(llm):
    stream = llm.generate(PROMPTS[1], max_tokens=500, stream=True)
    for _, _piece in zip(range(3), stream):
        pass
    stream.close()
    deadline = time.time() + 30
    while llm.stats()["live"] and time.time() < deadline:
        time.sleep(0.01)
    assert llm.stats()["live"] == 0 and llm.stats()["cells_live"] == 0


def test_create_completion_has_the_openai_shape(llm):
    out = llm.create_completion(PROMPTS[0], temperature=0, max_tokens=8, logprobs=3)
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    choice = out["choices"][0]
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    usage = out["usage"]
    assert usage["completion_tokens"] == 8 and usage["total_tokens"] == usage["prompt_tokens"] + 8
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 8
    assert all(len(top) <= 3 and max(top.values()) <= 0 for top in lp["top_logprobs"])
    assert "".join(lp["tokens"]) == choice["text"]
    chunks = list(llm.create_completion(PROMPTS[0], temperature=0, max_tokens=8, stream=True))
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["usage"] == usage and len({c["id"] for c in chunks}) == 1


def test_calling_the_llm_is_create_completion(llm):
    """llm(prompt, ...) as llama-cpp-python's Llama is called: the completion object."""
    out = llm(PROMPTS[0], max_tokens=5, temperature=0)
    assert out["object"] == "text_completion" and out["usage"]["completion_tokens"] == 5
    assert out["choices"][0]["text"] == llm.create_completion(PROMPTS[0], max_tokens=5, temperature=0)["choices"][0]["text"]


def test_sampling_options_use_ollama_names(llm):
    kw = dict(temperature=0.9, top_k=30, top_p=0.8, min_p=0.05, typical_p=0.95, repeat_penalty=1.2,
              repeat_last_n=32, presence_penalty=0.1, frequency_penalty=0.1, seed=7, num_predict=12)
    a = llm.generate(PROMPTS[3], **kw)
    b = llm.generate(PROMPTS[3], **kw)
    assert a == b and len(llm.tokenize(a, add_special=False)) <= 14
    mirostat = llm.submit(PROMPTS[3], temperature=0.8, mirostat=2, mirostat_tau=4.0, mirostat_eta=0.2,
                          seed=1, num_predict=10).result()
    assert len(mirostat.tokens) == 10
    banned = llm.tokenize(" Paris", add_special=False)[0]
    text = llm.generate(PROMPTS[0], max_tokens=3, logit_bias={banned: False})
    assert not text.startswith(" Paris")


def test_unknown_and_out_of_range_options_name_the_option(llm):
    with pytest.raises(InvalidOptionError, match="temprature"):
        llm.generate("Hi", temprature=0.5)
    with pytest.raises(InvalidOptionError, match="top_p"):
        llm.generate("Hi", top_p=1.5)
    with pytest.raises(InvalidOptionError, match="num_ctx"):
        llm.generate("Hi", num_ctx=4096)
    with pytest.raises(InvalidOptionError, match="grammar.*format|format.*grammar"):
        llm.generate("Hi", grammar='root ::= "a"', format="json")
    with pytest.raises(GrammarError):
        llm.generate("Hi", grammar="root ::= (")
    with pytest.raises(InvalidOptionError, match="logprobs"):
        llm.create_completion("Hi", logprobs=50)


def test_prompt_longer_than_the_context_gives_both_sizes(llm):
    ids = llm.tokenize("one two three four five six seven eight nine ten " * 10)
    n = len(ids)
    with pytest.raises(ContextLengthError, match=rf"{n} tokens.* 64\b"):
        llm.generate(ids, num_ctx=64, shift=False)
    with pytest.raises(ContextLengthError, match=rf"{n} tokens"):
        LLM("smollm2-135m", n_ctx=32, n_threads=1).forward_logits(ids)
    with pytest.raises(ContextLengthError, match=rf"{n} tokens"):
        llm.generate(ids, num_ctx=64)
    result = llm.submit(ids, num_ctx=64, max_tokens=4, truncate=True).result()
    assert result.truncated_tokens > 0 and len(result.tokens) == 4


def test_shift_keeps_a_counting_sequence_going(llm):
    count = ", ".join(str(i) for i in range(1, 21)) + ","
    assert len(llm.tokenize(count)) > 64
    result = llm.submit(count, num_ctx=64, max_tokens=90, temperature=0, repeat_penalty=1.0, num_keep=4, truncate=True).result()
    assert result.context_shifts >= 2
    numbers = [int(x) for x in result.text.replace(",", " ").split()]
    assert numbers[:20] == list(range(21, 41))


def test_grammar_and_format_options(llm):
    answer = llm.generate("Is the sky blue? Answer:", grammar='root ::= " yes" | " no"', max_tokens=5)
    assert answer in (" yes", " no")
    colour = llm.generate("My favourite colour is", format={"type": "string", "enum": ["red", "green"]},
                          max_tokens=8)
    assert json.loads(colour) in ("red", "green")


def test_methods_are_safe_from_many_threads(llm):
    ids = llm.tokenize(PROMPTS[1])
    want_logits = llm.forward_logits(ids)
    want_text = llm.generate(PROMPTS[0], max_tokens=8, temperature=0)

    def work(i: int):
        if i % 3 == 0:
            return np.array_equal(llm.forward_logits(ids), want_logits)
        if i % 3 == 1:
            return llm.generate(PROMPTS[0], max_tokens=8, temperature=0) == want_text
        return llm.detokenize(llm.tokenize(PROMPTS[i % 4], add_special=False)) == PROMPTS[i % 4]

    assert all(run_threads(work, 9))
