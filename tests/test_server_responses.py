"""OpenAI's Responses API (POST /v1/responses): the input translated into chat messages,
the shaper's stream validated as the openai SDK's event types, then a server with the
real SmolLM2 through the official openai client and raw HTTP, and a scripted model for
reasoning, mixed outputs and a stream that fails."""

from __future__ import annotations

import json
import pathlib

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from pyengine.chat.parsers import Delta
from pyengine.chat.responses import ResponsesShaper
from pyengine.session import ChatPiece, ChatResult
from pyengine.server import ServerConfig
from pyengine.server.errors import HTTPError
from pyengine.server.fields import Fields
from pyengine.server.response_store import ResponseStore
from pyengine.server.responses import input_messages, read_history, with_instructions
from server_support import FakeAdapter, fake_loader, running_server

MODEL = "smollm2-135m"
SYNTH = pathlib.Path(__file__).parent / "data" / "synth"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                  "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
           "parameters": WEATHER_PARAMS, "strict": True}
CLOCK = {"type": "function", "name": "get_time", "description": "Current time in a time zone",
         "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                        "required": ["zone"]}}
ASK = "What is the weather in Paris?"
GREEDY = {"temperature": 0}
CALL = {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


# --------------------------------------------------------------------------------------
# input -> chat messages
# --------------------------------------------------------------------------------------


def test_input_string_and_instructions_come_first():
    fields = Fields({"input": "Hi", "instructions": "Be brief."})
    assert with_instructions(fields, read_history(fields)) == [{"role": "system", "content": "Be brief."},
                                                               {"role": "user", "content": "Hi"}]
    earlier = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [CALL]}]
    answer = Fields({"input": [{"type": "function_call_output", "call_id": "call_abc", "output": "sun"}]})
    history = read_history(answer, earlier)
    assert history[:2] == earlier and history[2]["name"] == "get_weather"   # the call was in the earlier turns


def test_store_is_bounded_by_count_and_size():
    store = ResponseStore(max_responses=3, max_bytes=2000)
    for n in range(5):
        store.put({"id": f"resp_{n}"}, [{"role": "user", "content": "x" * 100}])
    assert len(store) == 3 and store.get("resp_0") is None and store.get("resp_4") is not None
    store.get("resp_2")   # used: kept over resp_3
    store.put({"id": "resp_big"}, [{"role": "user", "content": "y" * 1500}])
    assert [store.get(f"resp_{n}") is not None for n in (2, 3, 4)] == [True, False, True]
    assert store.get("resp_big") is not None
    store.put({"id": "resp_big2"}, [{"role": "user", "content": "w" * 1500}])   # the size bound drops the oldest
    assert store.get("resp_big2") is not None and store.get("resp_big") is None and len(store) < 3
    store.put({"id": "resp_huge"}, [{"role": "user", "content": "z" * 5000}])
    assert store.get("resp_huge") is None and store._bytes <= 2000


def test_input_items_become_chat_turns():
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                         {"type": "input_text", "text": "in Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.",
                                                              "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": '{"zone": "CET"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "12:00"}]},
    ]
    messages = input_messages(items)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == "Weather in Oslo?"
    turn = messages[2]
    assert turn["content"] == "Checking." and turn["reasoning_content"] == "Look."
    assert [c["id"] for c in turn["tool_calls"]] == ["call_1", "call_2"]
    assert turn["tool_calls"][1]["function"] == {"name": "get_time", "arguments": '{"zone": "CET"}'}
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "rain", "name": "get_weather"}
    assert messages[4]["content"] == "12:00" and messages[4]["name"] == "get_time"
    # a call with no text before it is an assistant turn of its own
    [alone] = input_messages([items[4]])
    assert alone["role"] == "assistant" and alone["content"] == "" and len(alone["tool_calls"]) == 1


@pytest.mark.parametrize("items, param", [
    (["just text"], "input[0]"),
    ([{"role": "wizard", "content": "x"}], "input[0].role"),
    ([{"role": "user", "content": 5}], "input[0].content"),
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}], "input[0].content[0]"),
    ([{"role": "user", "content": [{"type": "input_text", "text": 3}]}], "input[0].content[0]"),
    ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
    ([{"type": "function_call_output", "output": "x"}], "input[0].call_id"),
    ([{"type": "item_reference", "id": "msg_1"}], "input[0]"),
    ([{"type": "web_search_call", "id": "ws_1"}], "input[0].type"),
])
def test_bad_input_items_name_the_item(items, param):
    with pytest.raises(HTTPError) as info:
        input_messages(items)
    assert info.value.status == 400 and info.value.param == param


# --------------------------------------------------------------------------------------
# The shaper, its events validated as the SDK's types
# --------------------------------------------------------------------------------------


def _result(content="", reasoning=None, calls=(), finish="stop", forced=False) -> ChatResult:
    return ChatResult(content=content, reasoning=reasoning, tool_calls=list(calls), finish_reason=finish,
                      prompt_tokens=7, completion_tokens=5, forced_call=forced)


def _sdk_final(events: list[dict]):
    """Each event validated as the openai SDK's typed event; the final response."""
    typed = [TypeAdapter(ResponseStreamEvent).validate_python(event) for event in events]
    return typed[-1].response


def _echo() -> dict:
    return {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}


def test_shaper_stream_of_reasoning_text_and_a_call_reads_back_in_the_sdk():
    shaper = ResponsesShaper("m", _echo())
    events = shaper.start_events()
    for deltas in ([Delta("reasoning", "Think")], [Delta("reasoning", "ing."), Delta("content", "Hel")],
                   [Delta("content", "lo")], [Delta("tool_call", tool_call=CALL)]):
        events += shaper.piece_events(ChatPiece(tuple(deltas)))
    events += shaper.final_events(_result("Hello", "Thinking.", [CALL], "tool_calls"))
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert "response.reasoning_text.delta" in kinds and kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    final = _sdk_final(events)
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "Thinking."
    assert final.output_text == "Hello"
    assert final.output[2].call_id == "call_abc" and json.loads(final.output[2].arguments) == {"city": "Oslo"}
    # the whole reply has the same items
    whole = ResponsesShaper("m", _echo()).response(_result("Hello", "Thinking.", [CALL], "tool_calls"))
    assert [item["type"] for item in whole["output"]] == ["reasoning", "message", "function_call"]
    assert Response.model_validate(whole).output_text == "Hello"   # every field the SDK's type requires


def test_shaper_cut_off_and_empty_replies():
    shaper = ResponsesShaper("m", _echo())
    events = shaper.start_events() + shaper.final_events(_result(finish="length"))
    assert events[-1]["type"] == "response.incomplete" and _sdk_final(events).status == "incomplete"
    response = events[-1]["response"]
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = response["output"]   # an empty reply still has its message, as the whole reply does
    assert message["type"] == "message" and message["content"][0]["text"] == ""
    cut_call = ResponsesShaper("m", _echo()).response(_result(finish="length", forced=True))
    assert cut_call["output"] == [] and cut_call["status"] == "incomplete"


# --------------------------------------------------------------------------------------
# SmolLM2 through the server
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_path):
    with running_server(ServerConfig(parallel=2, max_queue=8, n_ctx=512)) as running:
        yield running


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _sse_events(server, body: dict) -> list[tuple[str, dict]]:
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        text = reply.read().decode()
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_text_input_cut_off_by_max_output_tokens(oai):
    reply = oai.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=6,
                                 **GREEDY)
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.model == MODEL
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    [message] = reply.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    [part] = message.content
    assert part.type == "output_text" and part.annotations == [] and part.text.strip()
    assert reply.output_text == part.text
    assert reply.usage.output_tokens == 6 and reply.usage.input_tokens > 0
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.max_output_tokens == 6 and reply.temperature == 0


def test_messages_with_instructions(oai):
    conversation = [{"role": "user", "content": [{"type": "input_text", "text": "Hi! I am Ann."}]},
                    {"role": "assistant", "content": [{"type": "output_text", "text": "Hello Ann."}]},
                    {"role": "user", "content": "What is my name?"}]
    bare = oai.responses.create(model=MODEL, input=conversation, max_output_tokens=4, **GREEDY)
    told = oai.responses.create(model=MODEL, input=conversation, instructions="Answer in one word.",
                                max_output_tokens=4, metadata={"trace": "t1"}, store=False, **GREEDY)
    assert told.output_text.strip() and told.instructions == "Answer in one word."
    assert told.metadata == {"trace": "t1"}
    # the instructions are a system turn of the prompt: SmolLM2's template shows them in place of its default
    assert told.usage.input_tokens != bare.usage.input_tokens


def test_stream_events_in_order_and_deltas_add_up(server):
    events = _sse_events(server, {"model": MODEL, "input": "Tell me about Paris.", "max_output_tokens": 10,
                                  **GREEDY})
    names = [name for name, _ in events]
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    data = [d for _, d in events]
    streamed = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    assert streamed and data[-4]["text"] == streamed
    final = data[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == streamed and final["usage"]["output_tokens"] == 10
    assert data[0]["response"]["status"] == "in_progress" and data[0]["response"]["id"] == final["id"]


def test_sdk_stream_matches_the_whole_reply(oai):
    ask = {"model": MODEL, "input": "Name a colour.", "max_output_tokens": 8, **GREEDY}
    whole = oai.responses.create(**ask)
    events = list(oai.responses.create(**ask, stream=True))
    assert events[-1].type == "response.incomplete"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_tool_call_is_a_function_call_item(oai, choice):
    reply = oai.responses.create(model=MODEL, input=ASK, tools=[WEATHER, CLOCK],
                                 tool_choice=choice, max_output_tokens=60, **GREEDY)
    assert reply.status == "completed"
    [call] = reply.output
    assert call.type == "function_call" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert call.name in ({"get_weather", "get_time"} if choice == "required" else {"get_weather"})
    arguments = json.loads(call.arguments)
    if call.name == "get_weather":
        jsonschema.validate(arguments, WEATHER_PARAMS)
    assert reply.output_text == "" and reply.tool_choice is not None


def test_forced_tool_call_streamed(server):
    events = _sse_events(server, {"model": MODEL, "input": ASK, "tools": [WEATHER], "max_output_tokens": 60,
                                  "tool_choice": {"type": "function", "name": "get_weather"}, **GREEDY})
    names = [name for name, _ in events]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    data = [d for _, d in events]
    assert data[2]["item"]["type"] == "function_call" and data[2]["item"]["arguments"] == ""
    assert data[3]["delta"] == data[4]["arguments"] == data[5]["item"]["arguments"]
    jsonschema.validate(json.loads(data[4]["arguments"]), WEATHER_PARAMS)
    assert data[-1]["response"]["output"] == [data[5]["item"]]


def test_function_call_output_round_trip(oai):
    first = oai.responses.create(model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required",
                                 max_output_tokens=60, **GREEDY)
    [call] = first.output

    def follow_up(result: str):
        history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": call.call_id, "output": result}]
        return oai.responses.create(model=MODEL, input=history, tools=[WEATHER], tool_choice="none",
                                    max_output_tokens=5, **GREEDY)

    short, long = follow_up("rain"), follow_up("rain all day, 11 degrees Celsius, strong wind from the north")
    assert short.output[0].type == "message" and short.output_text.strip()
    assert long.usage.input_tokens > short.usage.input_tokens > first.usage.input_tokens  # the result is rendered
    # the same turn, continuing the stored first response instead of sending it back
    continued = oai.responses.create(model=MODEL, previous_response_id=first.id, tools=[WEATHER], tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "rain"}], max_output_tokens=5, **GREEDY)
    assert continued.previous_response_id == first.id
    assert continued.usage.input_tokens == short.usage.input_tokens and continued.output_text == short.output_text


def test_stored_responses_continue_and_can_be_read_and_deleted(oai, server):
    first = oai.responses.create(model=MODEL, input="My name is Ann.", max_output_tokens=4, **GREEDY)
    kept = oai.responses.retrieve(first.id)
    assert kept.id == first.id and kept.output_text == first.output_text
    second = oai.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                  max_output_tokens=4, **GREEDY)
    alone = oai.responses.create(model=MODEL, input="What is my name?", max_output_tokens=4, **GREEDY)
    grown = second.usage.input_tokens - alone.usage.input_tokens
    assert grown >= first.usage.output_tokens   # the first turn and its reply come before the question
    events = list(oai.responses.create(model=MODEL, input="And mine?", previous_response_id=second.id,
                                       max_output_tokens=3, stream=True, **GREEDY))
    streamed = events[-1].response
    assert oai.responses.retrieve(streamed.id).output_text == streamed.output_text
    assert streamed.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    unkept = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=2, store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(unkept.id)
    with pytest.raises(openai.BadRequestError, match="was not found"):
        oai.responses.create(model=MODEL, input="x", previous_response_id=unkept.id)
    oai.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(first.id)
    assert httpx.delete(server.url + f"/v1/responses/{first.id}").status_code == 404


class City(BaseModel):
    name: str
    country: str


def test_text_format_json_schema(oai):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    reply = oai.responses.create(model=MODEL, input="Give me a big city and its population as JSON.",
                                 text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                  "strict": True}},
                                 max_output_tokens=80, **GREEDY)
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), schema)
    assert reply.text.format.type == "json_schema"
    parsed = oai.responses.parse(model=MODEL, input="Give me a city in JSON.", text_format=City,
                                 max_output_tokens=80, **GREEDY)
    assert isinstance(parsed.output_parsed, City) and parsed.output_parsed.name
    loose = oai.responses.create(model=MODEL, input="What is 2+2? Answer in JSON.", max_output_tokens=60,
                                 text={"format": {"type": "json_object"}}, **GREEDY)
    assert loose.status == "completed" and isinstance(json.loads(loose.output_text), dict)


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "wizard": 1}, "wizard"),
    ({"input": "x", "messages": []}, "messages"),
    ({"input": 3}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": "hot"}, "temperature"),
    ({"input": "x", "instructions": 5}, "instructions"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools[0].name"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_mail"}}, "tool_choice"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": 3}}}, "text.format"),
    ({"input": "x", "text": {"colour": "red"}}, "text.colour"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "metadata": {"k": 1}}, "metadata"),
    ({"input": "x", "store": "yes"}, "store"),
])
def test_bad_requests_are_400_naming_the_field(server, body, param):
    reply = httpx.post(server.url + "/v1/responses", json={"model": MODEL, **body}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_unknown_model_and_capabilities(server, oai):
    reply = httpx.post(server.url + "/v1/responses", json={"model": "no-such-model", "input": "x"}, timeout=60)
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError, match="does not support thinking"):
        oai.responses.create(model=MODEL, input="x", reasoning={"effort": "high"})


# --------------------------------------------------------------------------------------
# A scripted model: reasoning, text and a call in one reply; a stream that fails
# --------------------------------------------------------------------------------------


class ScriptedRun:
    def __init__(self, pieces, result, fail_with=None) -> None:
        self.pieces, self.final, self.fail_with = pieces, result, fail_with
        self.result = None

    def cancel(self) -> None:
        pass

    def __aiter__(self):
        return self._events()

    async def _events(self):
        for piece in self.pieces:
            yield piece
            if self.fail_with is not None:
                raise self.fail_with
        self.result = self.final
        yield self.final


class ScriptedAdapter(FakeAdapter):
    fail_with = None

    def start_chat(self, messages, **kwargs):
        self.seen = messages, kwargs
        pieces = [ChatPiece((Delta("reasoning", "The user "),)), ChatPiece((Delta("reasoning", "asks."),)),
                  ChatPiece((Delta("content", "Let me "), Delta("content", "check."))),
                  ChatPiece((Delta("tool_call", tool_call=CALL),))]
        return ScriptedRun(pieces, _result("Let me check.", "The user asks.", [CALL], "tool_calls"), self.fail_with)


@pytest.fixture()
def scripted():
    adapter = ScriptedAdapter()
    with running_server(ServerConfig(), loader=fake_loader(adapter), served={"fake": SYNTH / "llama-f16.gguf"}) as srv:
        yield adapter, srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_reasoning_text_and_call_through_the_sdk(scripted):
    adapter, _, client = scripted
    ask = {"model": "fake", "input": ASK, "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": False}
    whole = client.responses.create(**ask)
    assert [item.type for item in whole.output] == ["reasoning", "message", "function_call"]
    assert whole.output[0].content[0].text == "The user asks." and whole.output_text == "Let me check."
    assert whole.output[2].name == "get_weather" and whole.output[2].call_id == "call_abc"
    assert whole.tools[0].name == "get_weather" and whole.parallel_tool_calls is False
    _, kwargs = adapter.seen
    assert kwargs["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather of a city", "parameters": WEATHER_PARAMS}}]
    with client.responses.stream(**ask) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds.count("response.reasoning_text.delta") == 2 and kinds[-1] == "response.completed"
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Let me check." and final.output[0].content[0].text == "The user asks."


def test_a_failing_stream_ends_with_an_error_event(scripted):
    adapter, _, client = scripted
    adapter.fail_with = RuntimeError("the model broke")
    events = list(client.responses.create(model="fake", input="x", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert "the model broke" in events[-2].message
    assert events[-1].response.status == "failed" and events[-1].response.error.code == "server_error"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_output_text_logprobs_when_included(oai, server):
    reply = oai.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=5, top_logprobs=2,
                                 include=["message.output_text.logprobs"], **GREEDY)
    [part] = reply.output[0].content
    assert len(part.logprobs) == 5
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in part.logprobs)
    assert "".join(entry.token for entry in part.logprobs).strip() == part.text.strip()
    events = _sse_events(server, {"model": MODEL, "input": "Name a colour.", "max_output_tokens": 5,
                                  "include": ["message.output_text.logprobs"], **GREEDY})
    data = [d for _, d in events]
    streamed = [entry for d in data if d["type"] == "response.output_text.delta" for entry in d["logprobs"]]
    done = next(d for d in data if d["type"] == "response.output_text.done")
    assert len(done["logprobs"]) == 5
    assert [e["token"] for e in streamed] == [e["token"] for e in done["logprobs"]][:len(streamed)]
    plain = oai.responses.create(model=MODEL, input="Name a colour.", max_output_tokens=2, **GREEDY)
    assert plain.output[0].content[0].logprobs is None
