"""Sampling defaults per surface: what a request that sets nothing is sampled with through
LLM.generate / chat (Ollama's), LLM.create_completion / create_chat_completion
(llama-cpp-python's), the server's /api/* (Ollama's) and /v1/* (OpenAI's); the model
file's general.sampling.* over them; the order of the layers. The options object built
for each request is inspected, not only the text that comes out."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from gguf import GGUFValueType

from model_parity import rewrite
from pyengine.api import LLM
from pyengine.errors import InvalidOptionError
from pyengine.sample import SamplerChain, SamplingOptions
from pyengine.sample.options import SURFACE_DEFAULTS, layered_options, model_sampling

SYNTH = "qwen2-q8_0"
PROMPT = [1, 2, 3]
MESSAGES = [{"role": "user", "content": "Hi"}]

OLLAMA = {"temperature": 0.8, "top_k": 40, "top_p": 0.9, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
          "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0}
OPENAI = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
          "presence_penalty": 0.0, "frequency_penalty": 0.0}
LLAMA_CPP_PYTHON = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0,
                    "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
LLAMA_CPP_PYTHON_CHAT = {**LLAMA_CPP_PYTHON, "temperature": 0.2}
# what the rewritten file recommends (general.sampling.*)
FILE_KEYS = {
    "general.sampling.temp": (0.375, GGUFValueType.FLOAT32),
    "general.sampling.top_k": (7, GGUFValueType.INT32),
    "general.sampling.top_p": (0.5, GGUFValueType.FLOAT32),
    "general.sampling.min_p": (0.125, GGUFValueType.FLOAT32),
    "general.sampling.penalty_repeat": (1.25, GGUFValueType.FLOAT32),
    "general.sampling.penalty_last_n": (32, GGUFValueType.INT32),
    "general.sampling.sequence": ("top_k;top_p;temperature", GGUFValueType.STRING),
}
FILE = {"temperature": 0.375, "top_k": 7, "top_p": 0.5, "min_p": 0.125, "repeat_penalty": 1.25, "repeat_last_n": 32,
        "samplers": ["top_k", "top_p", "temperature"]}


def _options_of(options: SamplingOptions, names) -> dict:
    return {name: getattr(options, name) for name in names}


class Recorder:
    """Every SamplingOptions an LLM builds for a request, in order."""

    def __init__(self, monkeypatch) -> None:
        self.built: list[SamplingOptions] = []
        original = LLM.sampling_options

        def recording(llm, *args, **kwargs):
            options = original(llm, *args, **kwargs)
            self.built.append(options)
            return options

        monkeypatch.setattr(LLM, "sampling_options", recording)

    def last(self, names) -> dict:
        return _options_of(self.built[-1], names)


@pytest.fixture(scope="module")
def plain():
    with LLM(str(Path(__file__).parent / "data" / "synth" / f"{SYNTH}.gguf"), n_ctx=256, n_parallel=1) as llm:
        yield llm


@pytest.fixture(scope="module")
def recommending_path(tmp_path_factory):
    return rewrite(tmp_path_factory.mktemp("sampling"), SYNTH, meta=FILE_KEYS)


@pytest.fixture(scope="module")
def recommending(recommending_path):
    with LLM(str(recommending_path), n_ctx=256, n_parallel=1) as llm:
        yield llm


# --------------------------------------------------------------------------------------
# The Python API
# --------------------------------------------------------------------------------------


def test_generate_and_chat_take_ollamas_defaults(plain, monkeypatch):
    seen = Recorder(monkeypatch)
    plain.generate(PROMPT, max_tokens=1)
    assert seen.last(OLLAMA) == OLLAMA
    plain.submit(PROMPT, max_tokens=1).result()
    assert seen.last(OLLAMA) == OLLAMA
    plain.chat(MESSAGES, num_predict=1)
    assert seen.last(OLLAMA) == OLLAMA


def test_create_completion_takes_llama_cpp_pythons_defaults(plain, monkeypatch):
    seen = Recorder(monkeypatch)
    plain.create_completion(PROMPT, max_tokens=1)
    assert seen.last(LLAMA_CPP_PYTHON) == LLAMA_CPP_PYTHON
    plain(PROMPT, max_tokens=1)
    assert seen.last(LLAMA_CPP_PYTHON) == LLAMA_CPP_PYTHON
    plain.create_chat_completion(MESSAGES, max_tokens=1)
    assert seen.last(LLAMA_CPP_PYTHON_CHAT) == LLAMA_CPP_PYTHON_CHAT


def test_temperature_zero_is_plain_greedy(plain, monkeypatch):
    """No repetition penalty is applied unless one is asked for (before, generate's
    greedy still penalised repeats by 1.1)."""
    seen = Recorder(monkeypatch)
    for call in (lambda: plain.generate(PROMPT, max_tokens=1, temperature=0),
                 lambda: plain.chat(MESSAGES, num_predict=1, temperature=0),
                 lambda: plain.create_completion(PROMPT, max_tokens=1, temperature=0)):
        call()
        options = seen.built[-1]
        assert options.temperature == 0.0 and options.repeat_penalty == 1.0
        assert options.presence_penalty == 0.0 and options.frequency_penalty == 0.0
        assert SamplerChain(options, plain.n_vocab)._greedy
    plain.generate(PROMPT, max_tokens=1, temperature=0, repeat_penalty=1.3)
    assert seen.built[-1].repeat_penalty == 1.3


def test_greedy_text_is_the_argmax_chain(plain):
    """Greedy output equals the tokens picked one by one as each step's most likely one."""
    import numpy as np

    tokens = list(PROMPT)
    for _ in range(6):
        tokens.append(int(np.argmax(plain.forward_logits(tokens)[-1])))
    result = plain.submit(PROMPT, max_tokens=6, temperature=0).result()
    assert result.tokens == tokens[len(PROMPT):]


def test_the_files_general_sampling_comes_over_the_surfaces(recommending, monkeypatch):
    assert recommending.sampling_defaults == FILE
    seen = Recorder(monkeypatch)
    for call in (lambda: recommending.generate(PROMPT, max_tokens=1),
                 lambda: recommending.create_completion(PROMPT, max_tokens=1),
                 lambda: recommending.create_chat_completion(MESSAGES, max_tokens=1),
                 lambda: recommending.chat(MESSAGES, num_predict=1)):
        call()
        assert seen.last(FILE) == FILE
    # and what a request gives comes over the file's
    recommending.generate(PROMPT, max_tokens=1, temperature=0, top_k=3)
    assert seen.last(("temperature", "top_k", "top_p")) == {"temperature": 0.0, "top_k": 3, "top_p": 0.5}


def test_layer_order():
    surface = layered_options("ollama")
    assert {name: surface[name] for name in OLLAMA} == OLLAMA
    model = {"temperature": 0.3, "top_k": 7, "top_p": 0.5}
    created = {"temperature": 0.6, "top_k": 9}
    request = {"temperature": 0.1, "top_p": None}
    out = layered_options("openai", model=model, created=created, request=request)
    assert (out["temperature"], out["top_k"], out["top_p"], out["min_p"]) == (0.1, 9, 0.5, 0.0)
    assert layered_options("openai", request={"seed": None})["seed"] is None
    with pytest.raises(InvalidOptionError, match="surface"):
        layered_options("nobody")
    assert set(SURFACE_DEFAULTS) == {"ollama", "openai", "llama-cpp-python", "llama-cpp-python-chat"}


def test_created_parameters_sit_between_the_file_and_the_request(recommending, monkeypatch):
    seen = Recorder(monkeypatch)
    created = {"temperature": 0.6, "top_k": 9, "stop": ["END"], "num_predict": 1}
    result = recommending.submit(PROMPT, max_tokens=5, parameters=created, top_k=2).result()
    assert seen.last(("temperature", "top_k", "top_p")) == {"temperature": 0.6, "top_k": 2, "top_p": 0.5}
    assert result.completion_tokens == 1   # the created num_predict, under no request one


def test_a_bad_value_in_the_file_is_skipped():
    assert model_sampling({"general.sampling.top_p": 7.0, "general.sampling.top_k": 5,
                           "general.sampling.temp": "hot"}) == {"top_k": 5}


# --------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(recommending_path):
    from pyengine.server import ServerConfig
    from server_support import running_server

    plain_path = Path(__file__).parent / "data" / "synth" / f"{SYNTH}.gguf"
    with running_server(ServerConfig(parallel=1, n_ctx=256, models=(str(plain_path), str(recommending_path)))) as s:
        yield s, plain_path.stem, Path(recommending_path).stem


def _post(server, path: str, body: dict) -> dict:
    reply = httpx.post(server.url + path, json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_server_surfaces(server, monkeypatch):
    running, plain_name, recommending_name = server
    seen = Recorder(monkeypatch)
    _post(running, "/api/generate", {"model": plain_name, "prompt": "Hi", "stream": False,
                                     "options": {"num_predict": 1}})
    assert seen.last(OLLAMA) == OLLAMA
    _post(running, "/api/chat", {"model": plain_name, "messages": MESSAGES, "stream": False,
                                 "options": {"num_predict": 1}})
    assert seen.last(OLLAMA) == OLLAMA
    _post(running, "/v1/chat/completions", {"model": plain_name, "messages": MESSAGES, "max_tokens": 1})
    assert seen.last(OPENAI) == OPENAI
    _post(running, "/v1/completions", {"model": plain_name, "prompt": "Hi", "max_tokens": 1})
    assert seen.last(OPENAI) == OPENAI
    _post(running, "/v1/completions", {"model": plain_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0,
                                       "top_p": 0.5})
    assert seen.last(("temperature", "top_p", "repeat_penalty")) == {"temperature": 0.0, "top_p": 0.5,
                                                                     "repeat_penalty": 1.0}
    for path, body in (("/api/chat", {"messages": MESSAGES, "stream": False, "options": {"num_predict": 1}}),
                       ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1})):
        _post(running, path, {"model": recommending_name, **body})
        assert seen.last(FILE) == FILE
