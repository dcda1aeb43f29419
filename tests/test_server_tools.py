"""tool_choice "required" and a named function force a tool call: the grammar that does
it, then SmolLM2 (whose template has no tool syntax at all) through the Python API and
through the server with the official openai client, whole and streamed."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from pyengine import LLM
from pyengine.chat.parsers import parse_output
from pyengine.chat.tool_choice import forced_call_grammar, forced_syntax, read_tool_choice
from pyengine.errors import InvalidOptionError
from pyengine.server import ServerConfig
from server_support import running_server

MODEL = "smollm2-135m"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                  "required": ["city"]}
TIME_PARAMS = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
               "required": ["zone"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": WEATHER_PARAMS}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                          "parameters": TIME_PARAMS}}
TOOLS = [WEATHER, CLOCK]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
NAMED_CLOCK = {"type": "function", "function": {"name": "get_time"}}
GREEDY = {"temperature": 0, "max_tokens": 80}


def check_call(call: dict, names: set[str]) -> dict:
    """A call in OpenAI's shape, of one of `names`, its arguments valid for its schema."""
    assert call["type"] == "function" and call["id"].startswith("call_")
    name = call["function"]["name"]
    assert name in names
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, SCHEMAS[name])
    return arguments


# --------------------------------------------------------------------------------------
# The choice and its grammar
# --------------------------------------------------------------------------------------


def test_read_tool_choice():
    assert read_tool_choice(TOOLS, None).tools is TOOLS and not read_tool_choice(TOOLS, "auto").is_forced
    assert read_tool_choice(TOOLS, "none").tools is None
    required = read_tool_choice(TOOLS, "required")
    assert required.tools is TOOLS and [f["name"] for f in required.forced] == ["get_weather", "get_time"]
    named = read_tool_choice(TOOLS, NAMED_CLOCK)
    assert named.tools is TOOLS and [f["name"] for f in named.forced] == ["get_time"]
    for bad in ("sometimes", {"type": "function", "function": {"name": "get_mail"}}, {"type": "function"},
                {"function": {"name": "get_time"}}, 3):
        with pytest.raises(InvalidOptionError):
            read_tool_choice(TOOLS, bad)
    with pytest.raises(InvalidOptionError, match="needs at least one tool"):
        read_tool_choice(None, "required")


def test_hermes_grammar_takes_exactly_one_valid_call():
    grammar = forced_call_grammar(read_tool_choice(TOOLS, "required").forced, "hermes")
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    assert grammar.matches(call)
    assert grammar.matches('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    for wrong in (call.replace("get_time", "get_mail"),            # not a tool
                  call.replace('"CET"', '"EST"'),                   # outside the enum
                  call.replace('{"zone": "CET"}', "{}"),           # a required argument missing
                  call.replace('"arguments"', '"parameters"'),     # the other syntax's key
                  "Sure! " + call,                                  # text before the call
                  call + call):                                     # a second call
        assert not grammar.matches(wrong), wrong
    [parsed] = parse_output(call, tool_format="hermes").tool_calls
    assert check_call(parsed, {"get_time"}) == {"zone": "CET"}


def test_llama3_grammar_is_bare_json_with_parameters():
    assert forced_syntax("llama3") == "llama3"
    assert forced_syntax("hermes") == "hermes"
    assert forced_syntax("mistral") == forced_syntax(None) == "json"   # bare JSON, "arguments"
    grammar = forced_call_grammar(read_tool_choice(TOOLS, NAMED_CLOCK).forced, "llama3")
    call = '{"name": "get_time", "parameters": {"zone": "UTC"}}'
    assert grammar.matches(call)
    assert not grammar.matches(call.replace("get_time", "get_weather"))
    [parsed] = parse_output(call, tool_format="llama3").tool_calls
    assert check_call(parsed, {"get_time"}) == {"zone": "UTC"}


def test_parameters_the_converter_refuses_become_any_object():
    odd = {"type": "function", "function": {"name": "odd", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}}}
    grammar = forced_call_grammar(read_tool_choice([odd], "required").forced, "hermes")
    assert grammar.matches('<tool_call>\n{"name": "odd", "arguments": {"anything": [1, 2]}}\n</tool_call>')
    assert not grammar.matches('<tool_call>\n{"name": "even", "arguments": {}}\n</tool_call>')
    no_params = {"type": "function", "function": {"name": "ping"}}
    grammar = forced_call_grammar(read_tool_choice([no_params], "required").forced, "hermes")
    assert grammar.matches('<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')


# --------------------------------------------------------------------------------------
# The Python API
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with LLM(str(smollm2_path), n_ctx=512, n_parallel=2) as model:
        yield model


@pytest.mark.parametrize("choice, names", [("required", {"get_weather", "get_time"}), (NAMED_CLOCK, {"get_time"})])
def test_api_forced_call_whole_and_streamed(llm, choice, names):
    reply = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=choice, **GREEDY)
    [result] = reply["choices"]
    assert result["finish_reason"] == "tool_calls"
    assert result["message"]["content"] is None
    [call] = result["message"]["tool_calls"]
    arguments = check_call(call, names)
    chunks = list(llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=choice, stream=True, **GREEDY))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    streamed = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert len(streamed) == 1 and streamed[0]["function"]["name"] == call["function"]["name"]
    assert json.loads(streamed[0]["function"]["arguments"]) == arguments
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


def test_api_auto_and_none_do_not_force(llm):
    # "none" hides the tools; "auto" would show them to a template that cannot (Ollama's 400)
    reply = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=4)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert "tool_calls" not in reply["choices"][0]["message"]
    with pytest.raises(InvalidOptionError, match="does not support tools"):
        llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="auto", temperature=0, max_tokens=4)


def test_api_forced_call_errors(llm):
    with pytest.raises(InvalidOptionError, match="get_mail"):
        llm.create_chat_completion(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_mail"}})
    with pytest.raises(InvalidOptionError, match="grammar"):
        llm.create_chat_completion(ASK, tools=TOOLS, tool_choice="required", grammar='root ::= "x"')


def test_api_forced_call_overrides_a_response_format(llm):
    reply = llm.create_chat_completion(ASK, tools=TOOLS, tool_choice=NAMED_CLOCK,
                                       response_format={"type": "json_object"}, **GREEDY)
    [call] = reply["choices"][0]["message"]["tool_calls"]
    check_call(call, {"get_time"})


# --------------------------------------------------------------------------------------
# The server, with the openai client
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(ServerConfig(parallel=2, max_queue=8, n_ctx=512)) as running:
        yield running


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("choice, names", [("required", {"get_weather", "get_time"}), (NAMED_CLOCK, {"get_time"})])
def test_server_forced_call(oai, choice, names):
    reply = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, **GREEDY)
    [result] = reply.choices
    assert result.finish_reason == "tool_calls" and not result.message.content
    [call] = result.message.tool_calls
    arguments = check_call(call.model_dump(), names)
    stream = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, stream=True,
                                         **GREEDY)
    chunks = [c for c in stream if c.choices]
    streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(streamed) == 1 and streamed[0].index == 0 and streamed[0].id.startswith("call_")
    assert streamed[0].function.name == call.function.name
    assert json.loads(streamed[0].function.arguments) == arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_server_forced_call_then_the_tool_result(oai):
    first = oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=NAMED_CLOCK, **GREEDY)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "12:00"}]
    follow_up = oai.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none",
                                            temperature=0, max_tokens=4)
    assert follow_up.choices[0].finish_reason == "length" and not follow_up.choices[0].message.tool_calls


def test_server_unknown_function_is_400_in_openai_shape(oai, server):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                    tool_choice={"type": "function", "function": {"name": "get_mail"}})
    body = info.value.body
    assert body["param"] == "tool_choice" and "get_mail" in body["message"]
    assert body["type"] == "invalid_request_error"
    reply = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "messages": ASK, "tool_choice": "required"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tool_choice"
