"""Bad requests get a 4xx with a message in their API's shape, never a 5xx, and the
server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from pyengine.server import ServerConfig
from server_support import running_server

MODEL = "smollm2-135m"
HI = [{"role": "user", "content": "Hi"}]
OLLAMA_CHAT = {"model": MODEL, "messages": HI, "stream": False, "options": {"num_predict": 1}}
OPENAI_CHAT = {"model": MODEL, "messages": HI, "max_tokens": 1}


@pytest.fixture(scope="module")
def client(smollm2_path):
    with running_server(ServerConfig(n_ctx=256)) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            yield http


def assert_ollama_error(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert isinstance(message, str) and message
    for word in words:
        assert word.lower() in message.lower(), message


def assert_openai_error(response: httpx.Response, status: int, *words: str, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"]
    for word in words:
        assert word.lower() in error["message"].lower(), error
    if param is not None:
        assert error["param"] == param


RAW_BODIES = [
    (b"{bad", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b"", "empty"),
    (b'{"model": "\xff\xfe"}', "UTF-8"),
    (b'{"model": "x", "options": {"temperature": NaN}}', "NaN"),
    (b'{"model": "x", "n": ' + b"9" * 5000 + b"}", "not valid JSON"),
    (b"[" * 100_000, ""),
    (b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "\\ud800"}]}', "surrogate"),
]


@pytest.mark.parametrize("body, words", RAW_BODIES)
def test_malformed_bodies(client, body, words):
    assert_ollama_error(client.post("/api/chat", content=body), 400, words)
    assert_openai_error(client.post("/v1/chat/completions", content=body), 400, words)


OLLAMA_BAD = [
    ({"model": 5}, "model"),
    ({"model": None}, "model"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "no role"}]}, "role"),
    ({"messages": [{"role": "user", "content": {"a": 1}}]}, "content"),
    ({"options": {"num_predict": -5}}, "num_predict"),
    ({"options": {"num_predict": 10**30}}, "num_predict"),
    ({"options": {"temperature": "hot"}}, "temperature"),
    ({"options": {"top_k": -1}}, "top_k"),
    ({"options": {"top_p": 1e300}}, "top_p"),
    ({"options": {"seed": 2**70}}, "seed"),
    ({"options": {"stop": [1, 2]}}, "stop"),
    ({"options": {"no_such_option": 1}}, "no_such_option"),
    ({"options": "fast"}, "options"),
    ({"options": {"num_ctx": 10**6}}, "num_ctx"),
    ({"stream": "yes"}, "stream"),
    ({"keep_alive": "forever"}, "keep_alive"),
    ({"keep_alive": True}, "keep_alive"),
    ({"format": "xml"}, "format"),
    ({"think": "maybe"}, "think"),
    ({"tools": "all"}, "tools"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "wizard"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "", "content": "x"}]}, "role"),
    ({"prompt": "Hi"}, "unrecognized", "prompt"),
    ({"temperature": 0.5}, "unrecognized", "temperature"),
    ({"grammar": 'root ::= ("a"'}, "gbnf"),
    ({"grammar": 'root ::= "a"', "format": "json"}, "grammar", "format"),
    ({"shift": "no"}, "shift"),
    ({"truncate": 1}, "truncate"),
    ({"model": "../../etc/passwd"}, "invalid model name"),
    ({"model": "/abs/path.gguf"}, "invalid model name"),
]


@pytest.mark.parametrize("change, words", [(case[0], case[1:]) for case in OLLAMA_BAD])
def test_ollama_chat_bad_fields(client, change, words):
    body = {**OLLAMA_CHAT, **change}
    assert_ollama_error(client.post("/api/chat", json=body), 400, *words)


def test_ollama_unknown_model_and_endpoint(client):
    assert_ollama_error(client.post("/api/chat", json={**OLLAMA_CHAT, "model": "no-such-model"}), 404, "not found")
    assert_ollama_error(client.post("/api/show", json={"model": "no-such-model"}), 404, "not found")
    assert_ollama_error(client.request("DELETE", "/api/delete", json={"model": "no-such-model"}), 404)
    assert_ollama_error(client.post("/api/pull", json={"model": "no-such-model"}), 404, "catalog")
    assert_ollama_error(client.post("/api/pull", json={"model": "../x"}), 400, "invalid model name")
    assert_ollama_error(client.get("/api/nothing"), 404, "no such endpoint")
    assert_ollama_error(client.get("/api/chat"), 405, "not allowed")


GENERATE_BAD = [
    ({"template": "{{ .Prompt }}"}, "template"),
    ({"suffix": "end"}, "does not support insert"),
    ({"images": ["aGk="]}, "images"),
    ({"context": ["a"]}, "context"),
    ({"context": [10**9]}, "token"),
    ({"raw": "no"}, "raw"),
    ({"prompt": 7}, "prompt"),
    ({"messages": [{"role": "user", "content": "Hi"}]}, "unrecognized", "messages"),
    ({"num_predict": 4}, "unrecognized", "num_predict"),
    ({"grammar": "root ::= \"unterminated"}, "gbnf", "unterminated"),
    ({"grammar": "no rules here"}, "gbnf"),
    ({"grammar": 'root ::= "a" | undefined-rule'}, "undefined-rule"),
    ({"grammar": ["root ::= x"]}, "grammar"),
]


@pytest.mark.parametrize("change, words", [(case[0], case[1:]) for case in GENERATE_BAD])
def test_ollama_generate_bad_fields(client, change, words):
    body = {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 1}, **change}
    assert_ollama_error(client.post("/api/generate", json=body), 400, *words)


def test_ollama_top_level_grammar_constrains_the_reply(client):
    grammar = 'root ::= ("yes" | "no") "!"'
    for route, body in (("/api/generate", {"prompt": "Is water wet?"}),
                        ("/api/chat", {"messages": [{"role": "user", "content": "Is water wet?"}]})):
        reply = client.post(route, json={"model": MODEL, "stream": False, "grammar": grammar,
                                         "options": {"num_predict": 8, "temperature": 0}, **body})
        assert reply.status_code == 200, reply.text
        data = reply.json()
        text = data["response"] if route == "/api/generate" else data["message"]["content"]
        assert text in ("yes!", "no!"), text


def test_ollama_accepts_every_field_ollama_defines(client):
    common = {"model": MODEL, "stream": False, "options": {"num_predict": 1}, "keep_alive": "5m", "format": None,
              "think": None, "truncate": True, "shift": True, "logprobs": False}
    generate = client.post("/api/generate", json={**common, "prompt": "Hi", "system": "Be brief.", "raw": False,
                                                  "context": None, "images": None})
    assert generate.status_code == 200, generate.text
    chat = client.post("/api/chat", json={**common, "messages": HI, "tools": None})
    assert chat.status_code == 200, chat.text


OPENAI_BAD = [
    ({"foo": 1}, "unrecognized", "foo"),
    ({"max_tokens": -1}, "max_tokens", "max_tokens"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens"),
    ({"max_tokens": 10**20}, "max_tokens", "max_tokens"),
    ({"temperature": "warm"}, "temperature", "temperature"),
    ({"n": 9}, "[1, 8]", "n"),
    ({"messages": []}, "messages", "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "image_url",
     None),
    ({"tools": "all"}, "tools", None),
    ({"tool_choice": "sometimes"}, "tool_choice", None),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "logit_bias"),
    ({"logit_bias": {"5": 1000}}, "logit_bias", "logit_bias"),
    ({"stream_options": {"include_usage": True}}, "stream", "stream_options"),
    ({"seed": "abc"}, "seed", "seed"),
    ({"top_k": -3}, "top_k", None),
    ({"num_ctx": 10**6}, "num_ctx", None),
    ({"top_logprobs": 3}, "logprobs", "top_logprobs"),
    ({"reasoning_effort": "max"}, "reasoning_effort", "reasoning_effort"),
    ({"model": ""}, "model", "model"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "wizard", None),
    ({"messages": [{"role": "System", "content": "Hi"}]}, "System", None),
]


@pytest.mark.parametrize("change, words, param", OPENAI_BAD)
def test_openai_chat_bad_fields(client, change, words, param):
    response = client.post("/v1/chat/completions", json={**OPENAI_CHAT, **change})
    assert_openai_error(response, 400, words, param=param)


def test_openai_overflowing_number(client):
    body = b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "temperature": 1e400}'
    assert_openai_error(client.post("/v1/chat/completions", content=body), 400, "temperature",
                        param="temperature")


@pytest.mark.parametrize("change, words", [
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "one prompt"),
    ({"prompt": [1, "a"]}, "prompt"),
    ({"logprobs": 10}, "logprobs"),
    ({"suffix": "x"}, "does not support insert"),
    ({"best_of": 3}, "best_of"),
    ({"echo": "yes"}, "echo"),
])
def test_openai_completions_bad_fields(client, change, words):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 1, **change}
    assert_openai_error(client.post("/v1/completions", json=body), 400, words)


def test_openai_unknown_model_and_endpoint(client):
    assert_openai_error(client.post("/v1/chat/completions", json={**OPENAI_CHAT, "model": "nope"}), 404,
                        "not found", param="model")
    assert_openai_error(client.get("/v1/nothing"), 404, "no such endpoint")


def test_prompt_longer_than_the_context(client):
    long = [{"role": "user", "content": "word " * 2000}]
    assert_ollama_error(client.post("/api/chat", json={**OLLAMA_CHAT, "messages": long}), 400, "context")
    assert_openai_error(client.post("/v1/chat/completions", json={**OPENAI_CHAT, "messages": long}), 400,
                        "context")
    assert_openai_error(client.post("/v1/completions", json={"model": MODEL, "prompt": "word " * 2000}), 400,
                        "context")
    # Streaming requests fail the same way, before any byte of the stream.
    assert_ollama_error(client.post("/api/generate", json={"model": MODEL, "prompt": "word " * 2000}), 400,
                        "context")


def test_bodies_over_the_limit(client):
    huge = b'{"model": "' + b"a" * (64 * 1024 * 1024) + b'"}'
    assert_ollama_error(client.post("/api/chat", content=huge), 413, "larger than")

    def chunks():  # no Content-Length: the limit is found while reading
        for _ in range(12):
            yield b" " * (1024 * 1024)

    assert_openai_error(client.post("/v1/chat/completions", content=chunks()), 413, "larger than")


def test_server_keeps_serving(client):
    for _ in range(2):
        client.post("/api/chat", content=b"{bad")
        client.post("/v1/chat/completions", json={**OPENAI_CHAT, "max_tokens": -1})
    response = client.post("/api/chat", json=OLLAMA_CHAT)
    assert response.status_code == 200 and response.json()["done"] is True
    response = client.post("/v1/chat/completions", json=OPENAI_CHAT)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 1
