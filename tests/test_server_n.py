"""OpenAI's n > 1: n choices sampled as parallel sequences on one prompt computation.
The engine's twins (a request whose prompt a live sequence computes or computed starts on
its cells), then /v1/chat/completions and /v1/completions on SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from engine_support import drive, engine_factory, never_eog
from engine_support import random_prompt as prompt

from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.sample import SamplingOptions
from pyengine.server import ServerConfig
from pyengine.server.choices import MAX_CHOICES, choice_seed, start_choices
from pyengine.tokenizer import Tokenizer
from server_support import running_server

SYNTH = Path(__file__).parent / "data" / "synth"
MODEL = "smollm2-135m"


# --------------------------------------------------------------------------------------
# The engine: twins share the prompt's cells and its last logits
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def parts():
    gguf = GGUFFile(SYNTH / "llama-f16.gguf")
    return load_model(gguf), Tokenizer.from_gguf(gguf), Backend(1)


@pytest.fixture
def make(parts):
    yield from engine_factory(parts, n_ctx=128)


def sampled(engine, seed: int) -> SamplingOptions:
    return SamplingOptions(temperature=1.0, seed=seed, logit_bias={t: False for t in engine.eog_ids})


@pytest.mark.parametrize("background", [True, False])
def test_same_prompt_is_computed_once_and_each_twin_samples_as_alone(make, background):
    engine = make(n_parallel=4, n_batch=8, background=background)   # a 30-token prompt takes 4 steps
    ids = prompt(3, 30)
    options = [sampled(engine, seed) for seed in range(3)]
    alone = []
    for opts in options:
        handle = engine.submit(ids, opts, max_tokens=10, cache_prompt=False)
        if not background:
            drive(engine)
        alone.append(handle.result().tokens)
    assert len({tuple(tokens) for tokens in alone}) == 3
    before = engine.stats()["prompt_tokens_computed"]
    handles = [engine.submit(ids, opts, max_tokens=10) for opts in options]
    if not background:
        drive(engine)
    results = [handle.result() for handle in handles]
    assert engine.stats()["prompt_tokens_computed"] - before == len(ids)      # once, not three times
    assert [r.cached_tokens for r in results] == [0, len(ids), len(ids)]
    assert [r.prompt_tokens for r in results] == [len(ids)] * 3
    assert [r.tokens for r in results] == alone                               # as if each ran alone
    assert engine.stats()["cells_live"] == 0


def test_a_twin_arriving_after_the_prompt_still_skips_it(make):
    engine = make(n_parallel=2, n_batch=64, background=False)
    ids, opts = prompt(4, 20), never_eog(engine)
    first = engine.submit(ids, opts, max_tokens=8)
    engine.step()                       # the whole prompt, and the first token
    before = engine.stats()["prompt_tokens_computed"]
    second = engine.submit(ids, opts, max_tokens=8)
    drive(engine)
    assert engine.stats()["prompt_tokens_computed"] == before
    twin = second.result()
    assert twin.cached_tokens == len(ids) and twin.tokens == first.result().tokens


def test_a_request_behind_a_waiting_twin_starts_at_once(make):
    engine = make(n_parallel=4, n_batch=8, background=False)
    opts, ids = never_eog(engine), prompt(7, 40)
    leader, twin = engine.submit(ids, opts, max_tokens=4), engine.submit(ids, opts, max_tokens=4)
    other = engine.submit(prompt(8, 5), opts, max_tokens=4)
    engine.step()
    assert engine.stats()["live"] == 2 and engine.stats()["waiting"] == 1   # the twin waits, the other runs
    drive(engine)
    first, second, third = leader.result(), twin.result(), other.result()
    assert second.cached_tokens == len(ids) and third.cached_tokens == 0 and second.tokens == first.tokens


def test_different_prompts_do_not_wait_for_each_other(make):
    engine = make(n_parallel=2, n_batch=8, background=False)
    opts = never_eog(engine)
    a, b = engine.submit(prompt(5, 30), opts, max_tokens=4), engine.submit(prompt(6, 30), opts, max_tokens=4)
    drive(engine)
    assert a.result().cached_tokens == b.result().cached_tokens == 0
    assert engine.stats()["prompt_tokens_computed"] == 60


# --------------------------------------------------------------------------------------
# Seeds and starting
# --------------------------------------------------------------------------------------


def test_choice_seeds_differ_and_are_reproducible():
    assert choice_seed(None, 3) is None and choice_seed(-1, 2) == -1   # random stays random
    assert choice_seed(42, 0) == 42
    seeds = [choice_seed(42, i) for i in range(MAX_CHOICES)]
    assert len(set(seeds)) == MAX_CHOICES and all(0 <= s < 2**64 for s in seeds)
    assert seeds == [choice_seed(42, i) for i in range(MAX_CHOICES)]
    assert choice_seed(2**64 - 1, 1) < 2**64


class _Run:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_start_choices_gives_each_its_seed_and_cancels_on_failure():
    seen, runs = [], []

    def start(options):
        seen.append(options["seed"])
        if len(seen) == 3:
            raise RuntimeError("no room")
        runs.append(_Run())
        return runs[-1]

    assert start_choices(start, {"seed": 9}, 1) is runs[0] and seen == [9]
    seen.clear()
    runs.clear()
    with pytest.raises(RuntimeError):
        start_choices(start, {"seed": 9}, 4)
    assert seen == [9, choice_seed(9, 1), choice_seed(9, 2)] and all(run.cancelled for run in runs)


# --------------------------------------------------------------------------------------
# The server on SmolLM2
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(ServerConfig(parallel=4, max_queue=8, n_ctx=512)) as running:
        yield running


def engine_of(server):
    [entry] = server.state.registry.loaded()
    return entry.adapter.llm.engine


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": MODEL, **body}, timeout=120)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_chat_n2_two_choices_on_one_prompt_computation(server):
    post(server, "/v1/chat/completions", {"messages": ask("Hi"), "max_tokens": 1})   # loaded
    engine = engine_of(server)
    engine.drop_cache()   # no prefix of an earlier request to reuse
    before = engine.stats()["prompt_tokens_computed"]
    body = {"messages": ask("Tell me about owls in two sentences."), "n": 2, "max_tokens": 12, "seed": 11,
            "temperature": 1.0, "logprobs": True}
    reply = post(server, "/v1/chat/completions", body).json()
    computed = engine.stats()["prompt_tokens_computed"] - before
    choices = reply["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert all(c["finish_reason"] in ("stop", "length") and c["message"]["role"] == "assistant" for c in choices)
    usage = reply["usage"]
    assert computed == usage["prompt_tokens"]                       # the prompt was evaluated once
    assert usage["completion_tokens"] == sum(len(c["logprobs"]["content"]) for c in choices)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert choices[0]["message"]["content"] != choices[1]["message"]["content"]
    again = post(server, "/v1/chat/completions", body).json()     # a seed makes the whole reply reproducible
    assert [c["message"]["content"] for c in again["choices"]] == [c["message"]["content"] for c in choices]


def test_chat_n_streams_each_choice_with_its_index(server):
    body = {"messages": ask("Name a color."), "n": 3, "max_tokens": 6, "stream": True, "seed": 3,
            "stream_options": {"include_usage": True}}
    chunks = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={"model": MODEL, **body},
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert len({c["id"] for c in chunks}) == 1
    with_choices = [c for c in chunks if c["choices"]]
    assert {c["choices"][0]["index"] for c in with_choices} == {0, 1, 2}
    for index in range(3):
        mine = [c["choices"][0] for c in with_choices if c["choices"][0]["index"] == index]
        assert mine[0]["delta"].get("role") == "assistant"
        assert [m["finish_reason"] for m in mine if m["finish_reason"]] == [mine[-1]["finish_reason"]]
    [usage] = [c["usage"] for c in chunks if c.get("usage")]
    assert chunks[-1]["choices"] == [] and 0 < usage["completion_tokens"] <= 18


def test_greedy_choices_are_identical(server):
    reply = post(server, "/v1/chat/completions", {"messages": ask("Say hello."), "n": 2, "max_tokens": 6,
                                                  "temperature": 0}).json()
    assert reply["choices"][0]["message"] == reply["choices"][1]["message"]


def test_completions_n(server):
    reply = post(server, "/v1/completions", {"prompt": "The capital of France is", "n": 3, "max_tokens": 5,
                                             "seed": 1, "temperature": 1.0}).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in reply["choices"])
    assert reply["usage"]["completion_tokens"] == 15
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", timeout=120,
                      json={"model": MODEL, "prompt": "Once upon", "n": 2, "max_tokens": 3, "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert {c["choices"][0]["index"] for c in chunks} == {0, 1}


@pytest.mark.parametrize("n", [0, MAX_CHOICES + 1, 1.5, "2"])
def test_n_out_of_range_is_400(server, n):
    for path, body in (("/v1/chat/completions", {"messages": ask("Hi")}), ("/v1/completions", {"prompt": "Hi"})):
        reply = post(server, path, {**body, "n": n})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "n"


def test_openai_client_n(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=MODEL, messages=ask("Pick a number."), n=2, max_tokens=4, seed=5)
    assert [c.index for c in reply.choices] == [0, 1]


def test_a_client_leaving_a_stream_of_choices_frees_every_sequence(server):
    from server_support import wait_for

    engine = engine_of(server)
    body = {"model": MODEL, "messages": ask("Write a long story."), "n": 3, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                assert engine.stats()["live"] == 3
                break   # generating: now go away
    assert wait_for(lambda: engine.stats()["live"] == 0 and engine.stats()["cells_live"] == 0, timeout=10)
