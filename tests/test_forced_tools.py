"""Forced tool calls and structured output are compact: the grammars allow no runs of
whitespace, forced text is written in whole tokens, and a call cut off by max_tokens
leaves no markup in the content. SmolLM2 (a template without tool syntax) through the
Python API and the server."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from pyengine import LLM
from pyengine.chat.tool_choice import forced_call_grammar, read_tool_choice
from pyengine.sample import Grammar, SamplerChain, SamplingOptions
from pyengine.server import ServerConfig
from server_support import running_server

MODEL = "smollm2-135m"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"]}
SAMPLINGS = [dict(temperature=0), *(dict(temperature=t, seed=s) for t in (0.7, 1.0) for s in range(3))]


# --------------------------------------------------------------------------------------
# The grammars
# --------------------------------------------------------------------------------------


def test_schema_grammar_allows_one_space_after_colon_and_comma_only():
    grammar = Grammar.from_json_schema(PERSON)
    assert grammar.matches('{"name":"Ann","age":3}') and grammar.matches('{"name": "Ann", "age": 3}')
    for loose in ('{ "name": "Ann", "age": 3}', '{"name" : "Ann", "age": 3}', '{"name":  "Ann", "age": 3}',
                  '{"name": "Ann" , "age": 3}', '{"name": "Ann", "age": 3 }', '{\n"name": "Ann", "age": 3}',
                  '{"name":\n"Ann", "age": 3}', '{"name": "Ann",\n  "age": 3}', '{"name": "Ann", "age": 3}\n',
                  '{"name":\t"Ann", "age": 3}'):
        assert not grammar.matches(loose), loose
    items = Grammar.from_json_schema({"type": "array", "items": {"type": "integer"}})
    assert items.matches("[1, 2,3]") and not items.matches("[ 1, 2]") and not items.matches("[1,  2]")
    assert not items.matches("[1,\n2]")


def test_any_json_grammar_is_compact_too():
    grammar = Grammar.json_object()
    assert grammar.matches('{"a": [1, {"b": null}], "c":"d"}')
    assert not grammar.matches('{"a": [1,   2]}') and not grammar.matches('{\n  "a": 1\n}')


def test_forced_call_grammar_refuses_long_whitespace_runs():
    forced = read_tool_choice([WEATHER], "required").forced
    for syntax, call in (("json", '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
                         ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                                    '</tool_call>')):
        grammar = forced_call_grammar(forced, syntax)
        assert grammar.matches(call) and grammar.matches(call.replace(": ", ":").replace(", ", ","))
        for loose in (call.replace("{", "{\n    ", 1), call.replace('": ', '":       '),
                      call.replace(", ", ",\n    ")):
            assert not grammar.matches(loose), loose
        # the automaton itself: after '{"name":' one space may come, then no more whitespace
        matcher = grammar.matcher()
        assert matcher.accept_bytes(call[:call.index(":") + 1].encode())
        assert matcher.accept_bytes(b" ") and not matcher.accepts(b" ") and not matcher.accepts(b"\n")


# --------------------------------------------------------------------------------------
# Forced text in whole tokens
# --------------------------------------------------------------------------------------


def test_forced_text_is_written_in_whole_tokens():
    """The model prefers single letters; where the grammar leaves no choice of text the
    chain takes whole tokens: one covering the forced text, else the longest prefix."""
    pieces = [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz:"] + [b"argu", b"arguments", b"ments:", b":x",
                                                                       b"</s>"]
    eos = len(pieces) - 1
    grammar = Grammar.from_gbnf('root ::= "arguments:" [xy]')
    logits = np.zeros(len(pieces), np.float32)
    logits[:27] = 5.0                          # letters are what the model wants
    for options in (SamplingOptions(temperature=0), SamplingOptions(temperature=1.0, seed=3)):
        chain = SamplerChain(options, len(pieces), pieces, [eos], grammar)
        out = []
        while True:
            token = chain.sample(logits)
            chain.accept(token)
            if token == eos:
                break
            out.append(pieces[token])
        assert out[:1] == [b"arguments"]       # no token covers "arguments:": the longest prefix
        assert b"".join(out) in (b"arguments:x", b"arguments:y") and len(out) <= 3


# --------------------------------------------------------------------------------------
# SmolLM2: the Python API
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with LLM(str(smollm2_path), n_ctx=512, n_parallel=2) as model:
        yield model


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: f"t{s['temperature']}-s{s.get('seed')}")
def test_one_argument_forced_call_is_short_and_parses(llm, sampling):
    reply = llm.create_chat_completion(ASK, tools=[WEATHER], tool_choice="required", max_tokens=30, **sampling)
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert set(json.loads(call["function"]["arguments"])) == {"city"}
    assert reply["usage"]["completion_tokens"] < 25


def test_forced_call_cut_off_leaves_no_markup(llm):
    for syntax_tools in ([WEATHER],):
        reply = llm.create_chat_completion(ASK, tools=syntax_tools, tool_choice="required", temperature=0,
                                           max_tokens=6)
        [choice] = reply["choices"]
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"] is None and "tool_calls" not in choice["message"]
        chunks = list(llm.create_chat_completion(ASK, tools=syntax_tools, tool_choice="required", temperature=0,
                                                 max_tokens=6, stream=True))
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("content") or "" for d in deltas) == ""
        assert not any(d.get("tool_calls") for d in deltas)
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    ollama = llm.chat(ASK, tools=[WEATHER], tool_choice="required", num_predict=6)
    assert ollama["message"]["content"] == "" and "tool_calls" not in ollama["message"]


@pytest.mark.parametrize("sampling", SAMPLINGS[:4], ids=lambda s: f"t{s['temperature']}-s{s.get('seed')}")
def test_structured_output_is_compact(llm, sampling):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    reply = llm.create_chat_completion([{"role": "user", "content": "Describe a person as JSON."}],
                                       response_format=fmt, max_tokens=40, **sampling)
    text = reply["choices"][0]["message"]["content"]
    assert reply["choices"][0]["finish_reason"] == "stop", text
    value = json.loads(text)
    assert set(value) == {"name", "age"}
    # at most one space after each ":" and ",": never longer than json.dumps's ", " / ": " form
    assert "\n" not in text and len(text) <= len(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value and text.startswith('{"name":')


# --------------------------------------------------------------------------------------
# SmolLM2: the server (langchain's forced calls send tool_choice with a small max_tokens)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(ServerConfig(parallel=2, max_queue=8, n_ctx=512)) as running:
        yield running


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_server_forced_call_fits_in_30_tokens(server, tool_choice):
    for seed in range(3):   # the server's default temperature: sampled
        body = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": tool_choice,
                "max_tokens": 30, "seed": seed}
        reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
        [choice] = reply["choices"]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, reply
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and "city" in json.loads(call["function"]["arguments"])
        assert reply["usage"]["completion_tokens"] < 30


def test_server_cut_off_call_is_length_with_null_content(server):
    body = {"model": MODEL, "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 5,
            "temperature": 0}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None and not choice["message"].get("tool_calls")
