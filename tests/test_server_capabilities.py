"""Capabilities as Ollama computes and checks them: /api/show's list, and the 400s
(`"<model>" does not support tools|thinking|insert`) on /api/chat, /api/generate,
/v1/chat/completions and through the Python API. SmolLM2's template shows no tools and has
no reasoning, its vocabulary no FIM tokens; the synthetic FIM model has all but thinking."""

from __future__ import annotations

import json
import pathlib

import httpx
import pytest

from pyengine import LLM
from pyengine.chat.capabilities import capabilities, template_capabilities
from pyengine.errors import InvalidOptionError, UnsupportedCapabilityError
from pyengine.server import ServerConfig
from server_support import running_server

SYNTH = pathlib.Path(__file__).parent / "data" / "synth"
FIM_MODEL = SYNTH.parent / "fim" / "llama-fim-q8_0.gguf"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


def test_template_capabilities():
    assert template_capabilities("{% for m in messages %}{{ m.content }}{% endfor %}") == ()
    assert template_capabilities("{% if tools %}{{ tools | tojson }}{% endif %}") == ("tools",)
    assert template_capabilities("{% for t in tools %}{{ t.name }}{% endfor %}") == ("tools",)
    # "tools" in a text is not the variable
    assert template_capabilities("{{ 'You have no tools.' }}") == ()
    assert template_capabilities("{% if enable_thinking %}x{% endif %}") == ("thinking",)
    assert template_capabilities("{{ '<think>\\n' }}{{ m }}{{ '</think>' }}") == ("thinking",)
    assert template_capabilities("{{ '<think>' }}") == ()   # an opener alone marks no block


@pytest.mark.parametrize("name, expected", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", ("tools",)),
    ("Qwen-Qwen3-0.6B.jinja", ("tools", "thinking")),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", ("tools",)),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ("thinking",)),
    ("google-gemma-2-2b-it.jinja", ()),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", ("tools", "thinking")),
])
def test_real_templates(name, expected):
    golden = json.loads((pathlib.Path(__file__).parent / "data" / "templates_golden.json").read_text())
    assert template_capabilities(golden["templates"][name]["source"]) == expected


def test_capabilities_from_metadata_and_vocab():
    fim = {"fim_pre": 1, "fim_suf": 2, "fim_mid": 3}
    assert capabilities({"general.architecture": "llama"}, "", {}) == ("completion",)
    assert capabilities({"general.architecture": "llama"}, "", fim) == ("completion", "insert")
    assert capabilities({"general.architecture": "llama"}, "", {**fim, "fim_mid": None}) == ("completion",)
    embedder = {"general.architecture": "qwen3", "qwen3.pooling_type": 1}
    assert capabilities(embedder, "", {}) == ("embedding",)
    assert capabilities({"general.architecture": "llama"}, "", {}, has_projector=True) == ("completion", "vision")


def test_error_wording():
    error = UnsupportedCapabilityError("smollm2-135m", "tools")
    assert str(error) == '"smollm2-135m" does not support tools' and isinstance(error, InvalidOptionError)
    assert str(error.for_model('a"b')) == '"a\\"b" does not support tools'


# --------------------------------------------------------------------------------------
# The Python API
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    llm = LLM(str(smollm2_path), n_ctx=512)
    yield llm
    llm.close()


def test_python_api_refuses_what_the_model_lacks(smollm2):
    with pytest.raises(UnsupportedCapabilityError, match='"smollm2-135m" does not support tools'):
        smollm2.chat(ASK, tools=TOOLS, num_predict=4)
    with pytest.raises(UnsupportedCapabilityError, match="does not support tools"):
        smollm2.create_chat_completion(ASK, tools=TOOLS, max_tokens=4)
    with pytest.raises(UnsupportedCapabilityError, match="does not support thinking"):
        smollm2.chat(ASK, think=True, num_predict=4)
    with pytest.raises(UnsupportedCapabilityError, match="does not support thinking"):
        smollm2.create_chat_completion(ASK, think="high", max_tokens=4)
    # nothing asked for: fine; tools hidden by tool_choice "none" or a forced call: fine
    assert smollm2.chat(ASK, think=False, num_predict=2)["done"]
    assert smollm2.create_chat_completion(ASK, tools=TOOLS, tool_choice="none", max_tokens=2)["choices"]
    forced = smollm2.create_chat_completion(ASK, tools=TOOLS, tool_choice="required", max_tokens=40, temperature=0)
    assert forced["choices"][0]["finish_reason"] in ("tool_calls", "length")


# --------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_path):
    config = ServerConfig(parallel=2, max_queue=8, n_ctx=512)
    with running_server(config, served={"coder": FIM_MODEL}) as running:
        yield running


def test_show_lists_capabilities(server):
    show = httpx.post(f"{server.url}/api/show", json={"model": "smollm2-135m"}, timeout=60).json()
    assert show["capabilities"] == ["completion"]
    show = httpx.post(f"{server.url}/api/show", json={"model": "coder"}, timeout=60).json()
    assert show["capabilities"] == ["completion", "tools", "insert"]


@pytest.mark.parametrize("path, body, message", [
    ("/api/chat", {"messages": ASK, "tools": TOOLS}, '"smollm2-135m:latest" does not support tools'),
    ("/api/chat", {"messages": ASK, "think": True}, '"smollm2-135m:latest" does not support thinking'),
    ("/api/chat", {"messages": ASK, "think": "low"}, '"smollm2-135m:latest" does not support thinking'),
    ("/api/generate", {"prompt": "Hi", "think": True}, '"smollm2-135m:latest" does not support thinking'),
    ("/api/generate", {"prompt": "def f(", "suffix": "):"}, '"smollm2-135m:latest" does not support insert'),
    ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS}, '"smollm2-135m:latest" does not support tools'),
    ("/v1/chat/completions", {"messages": ASK, "reasoning_effort": "high"},
     '"smollm2-135m:latest" does not support thinking'),
])
def test_capability_400s(server, path, body, message):
    reply = httpx.post(f"{server.url}{path}", json={"model": "smollm2-135m:latest", "stream": False, **body},
                       timeout=120)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["message"] if isinstance(error, dict) else error) == message


def test_what_is_not_asked_for_passes(server):
    options = {"num_predict": 2, "temperature": 0}
    for body in ({"messages": ASK, "think": False}, {"messages": ASK, "tools": []}):
        reply = httpx.post(f"{server.url}/api/chat", json={"model": "smollm2-135m", "stream": False,
                                                           "options": options, **body}, timeout=120)
        assert reply.status_code == 200, reply.text
    reply = httpx.post(f"{server.url}/v1/chat/completions",
                       json={"model": "smollm2-135m", "messages": ASK, "max_tokens": 2, "reasoning_effort": "none"},
                       timeout=120)
    assert reply.status_code == 200, reply.text
    # the FIM model's template shows tools: they are accepted there
    reply = httpx.post(f"{server.url}/api/chat", json={"model": "coder", "stream": False, "messages": ASK,
                                                       "tools": TOOLS, "options": options}, timeout=120)
    assert reply.status_code == 200, reply.text
