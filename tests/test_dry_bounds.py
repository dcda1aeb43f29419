"""DRY's sequence breakers are bounded: too many or too long ones are refused (400 on the
server) before any work, and the largest allowed set costs little per token."""

from __future__ import annotations

import json
import random
import time

import httpx
import numpy as np
import pytest

from pyengine.errors import InvalidOptionError
from pyengine.sample import SamplerChain, SamplingOptions
from pyengine.sample.dry import build_breakers
from pyengine.sample.options import MAX_DRY_BREAKER_CHARS, MAX_DRY_BREAKERS
from pyengine.server import ServerConfig
from server_support import running_server, wait_for

MODEL = "smollm2-135m"


def breaker_set(count: int, length: int, seed: int = 0) -> list[str]:
    """Breakers of common letters: each reaches thousands of tokens of a real vocabulary."""
    rng = random.Random(seed)
    return ["".join(rng.choice("e tan\n:") for _ in range(length)) for _ in range(count)]


def test_limits_are_a_few_dozen_short_breakers():
    assert (MAX_DRY_BREAKERS, MAX_DRY_BREAKER_CHARS) == (32, 40)
    assert len(SamplingOptions(dry_sequence_breakers=breaker_set(32, 40)).dry_sequence_breakers) == 32


@pytest.mark.parametrize(("breakers", "words"), [
    (breaker_set(33, 1), ("33 breakers", "at most 32")),
    (breaker_set(1000, 100), ("1000 breakers", "at most 32")),
    (["\n", "x" * 41], ("41 characters", "at most 40")),
])
def test_too_many_or_too_long_breakers_are_refused(breakers, words):
    with pytest.raises(InvalidOptionError) as caught:
        SamplingOptions.from_dict({"dry_sequence_breakers": breakers})
    assert "dry_sequence_breakers" in str(caught.value)
    for word in words:
        assert word in str(caught.value)


@pytest.fixture(scope="module")
def pieces(smollm2_path):
    from pyengine.gguf import GGUFFile
    from pyengine.tokenizer import Tokenizer

    with GGUFFile(smollm2_path) as gguf:
        return list(Tokenizer.from_gguf(gguf).piece_table(special=False))


def test_building_the_largest_breaker_set_is_bounded(pieces):
    build_breakers(pieces, ["\n"])      # the vocabulary's index, built once per vocabulary
    for seed in range(3):
        started = time.perf_counter()
        breakers = build_breakers(pieces, breaker_set(MAX_DRY_BREAKERS, MAX_DRY_BREAKER_CHARS, seed))
        assert time.perf_counter() - started < 3.0    # about 0.3-1 s here; 11 s before
        assert breakers


def test_a_step_costs_the_same_with_the_largest_breaker_set(pieces):
    """The latest breaker is tracked as tokens arrive, so a step scans the window once
    whatever the number of breakers (before: every breaker's tails at every position)."""
    rng = np.random.default_rng(0)
    history = rng.integers(0, len(pieces), 4000).tolist()
    logits = rng.standard_normal(len(pieces)).astype(np.float32)

    def step_seconds(breakers: list[str]) -> float:
        opts = SamplingOptions(seed=0, dry_multiplier=0.8, dry_sequence_breakers=breakers)
        chain = SamplerChain(opts, len(pieces), token_pieces=pieces, n_ctx=8192)
        chain.accept_prompt(history)
        chain.accept(chain.sample(logits))
        started = time.perf_counter()
        for _ in range(16):
            chain.accept(chain.sample(logits))
        return (time.perf_counter() - started) / 16

    baseline = step_seconds([])
    loaded = step_seconds(breaker_set(MAX_DRY_BREAKERS, MAX_DRY_BREAKER_CHARS))
    assert loaded < 3 * baseline + 0.005, (loaded, baseline)


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(ServerConfig(n_ctx=1024)) as running:
        yield running


TOO_MANY = breaker_set(1000, 20)


@pytest.mark.parametrize(("path", "body"), [
    ("/api/generate", {"model": MODEL, "prompt": "Hi", "stream": False,
                       "options": {"dry_multiplier": 0.8, "dry_sequence_breakers": TOO_MANY}}),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": False,
                   "options": {"dry_multiplier": 0.8, "dry_sequence_breakers": TOO_MANY}}),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                              "dry_multiplier": 0.8, "dry_sequence_breakers": TOO_MANY}),
])
def test_server_answers_400_at_once(server, path, body):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        http.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False,
                                         "options": {"num_predict": 1}})   # loaded
        started = time.monotonic()
        reply = http.post(path, json=body)
        assert time.monotonic() - started < 1.0
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert "dry_sequence_breakers" in message and "at most 32" in message


def test_openai_fields_take_breakers(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "dry_multiplier": 0.8, "dry_sequence_breakers": ["\n", "User:"]}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 200


def _generate_seconds(http: httpx.Client, breakers: list[str]) -> float:
    body = {"model": MODEL, "prompt": "Write a list of fruits:\n1.", "stream": False,
            "options": {"num_predict": 8, "seed": 0, "temperature": 0, "dry_multiplier": 0.8,
                        "dry_sequence_breakers": breakers}}
    started = time.monotonic()
    reply = http.post("/api/generate", json=body)
    assert reply.status_code == 200 and reply.json()["eval_count"] == 8, reply.text
    return time.monotonic() - started


def test_largest_breaker_set_generates_in_bounded_time(server):
    with httpx.Client(base_url=server.url, timeout=120) as http:
        _generate_seconds(http, ["\n"])
        plain = min(_generate_seconds(http, ["\n"]) for _ in range(2))
        loaded = _generate_seconds(http, breaker_set(MAX_DRY_BREAKERS, MAX_DRY_BREAKER_CHARS, seed=7))
    # the breakers' index over the vocabulary is built once per set (~0.3-1 s); steps cost the same
    assert loaded < plain + 2.0, (loaded, plain)


def test_disconnect_cancels_a_request_with_the_largest_breaker_set(server):
    body = {"model": MODEL, "prompt": "Tell me a long story.",
            "options": {"num_predict": 1000, "dry_multiplier": 0.8,
                        "dry_sequence_breakers": breaker_set(MAX_DRY_BREAKERS, MAX_DRY_BREAKER_CHARS, seed=9)}}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        with http.stream("POST", "/api/generate", json=body) as response:
            lines = response.iter_lines()
            for _ in range(3):
                assert json.loads(next(lines))["done"] is False
        started = time.monotonic()
        stats = server.state.registry.get_loaded(MODEL).adapter.llm.stats
        assert wait_for(lambda: stats()["live"] == 0, timeout=5)
        assert time.monotonic() - started < 2.0


def test_a_step_is_linear_in_the_window_however_long_the_repeats():
    """A history of one token repeated, with a base so close to 1 that no length
    saturates: every position extends a repeat as long as the window. Each step updates
    the common suffixes in one pass (before: one numpy pass per repeat length, 230 ms a
    step over 4000 tokens)."""
    from pyengine.sample.dry import Dry

    dry = Dry(multiplier=0.8, base=1.0001, allowed_length=2, last_n=None, breakers=None)
    for _ in range(4000):
        dry.accept(5)
    dry.touched()                       # the first step computes the suffixes afresh
    started = time.perf_counter()
    for _ in range(20):
        dry.accept(5)
        tokens, lengths = dry._penalised()
        assert tokens.tolist() == [5] and lengths[0] >= 4000
    assert (time.perf_counter() - started) / 20 < 0.02
