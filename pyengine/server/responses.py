"""OpenAI's Responses API: ``POST /v1/responses``.

The request is translated into what ``/v1/chat/completions`` runs: ``input`` (a string,
or a list of items: messages with text parts, and the ``function_call`` /
``function_call_output`` items of earlier turns) and ``instructions`` (a system message
placed first) become the chat messages; Responses' flat function tools become chat
tools; ``text.format`` becomes the reply's JSON constraint; ``reasoning.effort`` the
template's thinking switch. The reply is shaped by
:class:`~pyengine.chat.responses.ResponsesShaper`, streamed as server-sent events with
``event:`` names.

Responses are kept as OpenAI keeps them (``store``, true unless the request says false),
in memory and bounded (:mod:`pyengine.server.response_store`: the last 256, 64 MiB in
all): ``previous_response_id`` continues the conversation of one of them, ``GET`` and
``DELETE /v1/responses/{id}`` read and drop one. ``conversation`` objects and item
references are refused with a 400. Unknown fields are refused, naming the field.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from pyengine.chat.responses import ResponsesShaper
from pyengine.session import ChatResult, response_format_to_format
from pyengine.chat.tool_choice import read_tool_choice
from pyengine.errors import InvalidOptionError
from pyengine.sample.options import MAX_TOP_LOGPROBS
from pyengine.server import profiles
from pyengine.server.common import read_fields, start_reply, state_of
from pyengine.server.errors import HTTPError
from pyengine.server.fields import Fields
from pyengine.server.openai import EXTRA_OPTIONS, MAX_TOKENS, REASONING_EFFORTS, read_keep_alive, read_sampling
from pyengine.server.response_store import ResponseStore, reply_message
from pyengine.server.streaming import SSE, collect_started, stream_error_message, streamed_reply

router = APIRouter()

RESPONSE_FIELDS = frozenset({
    "model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "stream_options",
    "tools", "tool_choice", "parallel_tool_calls", "max_tool_calls", "text", "reasoning", "metadata", "store",
    "previous_response_id", "conversation", "background", "include", "truncation", "user", "seed",
    "service_tier", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "top_logprobs",
    "keep_alive", *EXTRA_OPTIONS})
# Fields of the API this server cannot honour: refused rather than ignored.
_NOT_KEPT = "this server keeps no conversation objects; send the turns in 'input' or name a previous_response_id"
EFFORTS = {**REASONING_EFFORTS, "xhigh": "high"}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_METADATA = 16


# --------------------------------------------------------------------------------------
# input and instructions -> chat messages
# --------------------------------------------------------------------------------------


def read_history(fields: Fields, prior: list[dict] | None = None) -> list[dict]:
    """The turns so far: a previous response's conversation (`prior`), then the input."""
    prior = prior or []
    value = fields.data.get("input")
    if isinstance(value, str) and value:
        return prior + [{"role": "user", "content": value}]
    if isinstance(value, list) and value:
        return prior + input_messages(value, _call_names(prior))
    raise HTTPError(400, "'input' must be a non-empty string or a non-empty array of input items", param="input")


def with_instructions(fields: Fields, history: list[dict]) -> list[dict]:
    """The conversation the template renders: `instructions` first (a previous response's
    are not carried over, as OpenAI does), then the turns."""
    instructions = fields.string("instructions")
    return ([{"role": "system", "content": instructions}] if instructions else []) + history


def _call_names(turns: list[dict]) -> dict[str, str]:
    return {call["id"]: call["function"]["name"] for turn in turns for call in turn.get("tool_calls") or ()
            if isinstance(call.get("id"), str)}


def input_messages(items: list, names: dict[str, str] | None = None) -> list[dict]:
    """Input items as chat turns; `names` maps earlier call ids to their functions."""
    messages: list[dict] = []
    names = dict(names or {})   # call_id -> the function it called, for the tool turns
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise HTTPError(400, f"'{where}' must be an object (a message or an item)", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            _add_message(messages, item, where)
        elif kind == "function_call":
            _add_call(messages, item, where, names)
        elif kind == "function_call_output":
            messages.append(_call_output(item, where, names))
        elif kind == "reasoning":
            _add_reasoning(messages, item, where)
        elif kind == "item_reference":
            raise HTTPError(400, f"'{where}': item references are not supported; send the item itself or name "
                            "a previous_response_id", param=where)
        else:
            raise HTTPError(400, f"'{where}.type' {kind!r} is not supported (message, function_call, "
                            "function_call_output, reasoning)", param=f"{where}.type")
    return _finish_messages(messages)


def _add_message(messages: list[dict], item: dict, where: str) -> None:
    role = item.get("role")
    if role not in ROLES:
        raise HTTPError(400, f"'{where}.role' must be one of {', '.join(ROLES)}, got {json.dumps(role)[:40]}",
                        param=f"{where}.role")
    text = _text_of(item.get("content"), f"{where}.content")
    last = messages[-1] if messages else None
    if ROLES[role] == "assistant" and _only_reasoning(last):
        last["content"] = text   # the reasoning item before it was this turn's
        return
    messages.append({"role": ROLES[role], "content": text})


def _text_of(content: Any, where: str) -> str:
    """A message's content: a string, or text parts (``input_text``, an assistant's
    ``output_text`` and ``refusal``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise HTTPError(400, f"'{where}' must be a string or an array of content parts", param=where)
    texts = []
    for n, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("refusal" if kind == "refusal" else "text") if isinstance(part, dict) else None
        if kind not in (*TEXT_PARTS, "refusal"):
            shown = f"of type {kind!r}" if kind else "that is not a typed object"
            raise HTTPError(400, f"'{where}[{n}]': a content part {shown} is not supported (only text)",
                            param=f"{where}[{n}]")
        if not isinstance(text, str):
            raise HTTPError(400, f"'{where}[{n}].text' must be a string", param=f"{where}[{n}]")
        texts.append(text)
    return "".join(texts)


def _add_call(messages: list[dict], item: dict, where: str, names: dict[str, str]) -> None:
    fields = Fields(item, where)
    call_id = fields.string("call_id", required=True)
    name = fields.string("name", required=True)
    arguments = fields.string("arguments", "")
    names[call_id] = name
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)   # the same turn's text or calls before it
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _call_output(item: dict, where: str, names: dict[str, str]) -> dict:
    call_id = Fields(item, where).string("call_id", required=True)
    output = item.get("output")
    text = _text_of(output, f"{where}.output") if output is not None else ""
    message = {"role": "tool", "tool_call_id": call_id, "content": text}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _add_reasoning(messages: list[dict], item: dict, where: str) -> None:
    """An earlier turn's reasoning: kept with that turn (templates that show past reasoning
    render it, the others drop it)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise HTTPError(400, f"'{where}.content' must be an array of reasoning parts", param=f"{where}.content")
    text = "\n".join(part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str))
    messages.append({"role": "assistant", "content": "", "reasoning_content": text, "_reasoning_only": True})


def _only_reasoning(message: dict | None) -> bool:
    return bool(message and message.pop("_reasoning_only", False))


def _finish_messages(messages: list[dict]) -> list[dict]:
    for message in messages:
        message.pop("_reasoning_only", None)
    return messages


# --------------------------------------------------------------------------------------
# tools, tool_choice, text.format, reasoning
# --------------------------------------------------------------------------------------


def read_tools(fields: Fields) -> list[dict] | None:
    """Responses' flat function tools as chat tools (``{"type": "function", "function": {...}}``)."""
    tools = fields.array("tools")
    if not tools:
        return None
    return [_chat_tool(tool, f"tools[{n}]") for n, tool in enumerate(tools)]


def _chat_tool(tool: Any, where: str) -> dict:
    if not isinstance(tool, dict):
        raise HTTPError(400, f"'{where}' must be an object", param=where)
    if tool.get("type") != "function":
        raise HTTPError(400, f"'{where}.type' {tool.get('type')!r} is not supported: this server runs only "
                        "function tools", param=f"{where}.type")
    fields = Fields(tool, where)
    function = {"name": fields.string("name", required=True)}
    if fields.string("description"):
        function["description"] = tool["description"]
    parameters = fields.obj("parameters")
    if parameters is not None:
        function["parameters"] = parameters
    fields.boolean("strict")
    return {"type": "function", "function": function}


def read_choice(fields: Fields, tools: list[dict] | None) -> tuple[list[dict] | None, Any]:
    """The tools to show and the chat layer's tool_choice (checked against them)."""
    choice = fields.data.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        tools, choice = _allowed_tools(choice, tools)
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        choice = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None and choice not in ("auto", "none", "required"):
        raise HTTPError(400, 'tool_choice must be "auto", "none", "required", {"type": "function", "name": ...} '
                        'or {"type": "allowed_tools", ...}', param="tool_choice")
    try:
        read_tool_choice(tools, choice)
    except InvalidOptionError as exc:
        raise HTTPError(400, str(exc), param="tool_choice") from None
    return tools, choice


def _allowed_tools(choice: dict, tools: list[dict] | None) -> tuple[list[dict] | None, str]:
    mode = choice.get("mode", "auto")
    allowed = choice.get("tools")
    if mode not in ("auto", "required") or not isinstance(allowed, list):
        raise HTTPError(400, "tool_choice allowed_tools needs a mode (auto or required) and a list of tools",
                        param="tool_choice")
    names = {tool.get("name") for tool in allowed if isinstance(tool, dict)}
    kept = [tool for tool in tools or [] if tool["function"]["name"] in names]
    return kept or None, mode


def read_format(fields: Fields) -> tuple[Any, dict]:
    """``text.format`` as the `format` option, and the ``text`` the response repeats."""
    text = fields.nested("text")
    text.reject_unknown({"format", "verbosity"})
    spec = text.obj("format", {"type": "text"})
    kind = spec.get("type")
    if kind == "json_schema":
        response_format = {"type": "json_schema", "json_schema": {"name": spec.get("name"),
                                                                  "schema": spec.get("schema", {})}}
    else:
        response_format = spec
    try:
        fmt = response_format_to_format(response_format)
    except InvalidOptionError as exc:
        message = str(exc).replace("response_format.json_schema.", "text.format.")
        message = message.replace("response_format", "text.format")
        raise HTTPError(400, message, param="text.format") from None
    return fmt, {"format": spec, "verbosity": text.string("verbosity", "medium")}


def read_reasoning(fields: Fields) -> tuple[Any, dict | None]:
    """``reasoning.effort`` as the template's thinking switch (None: the model's default)."""
    reasoning = fields.nested("reasoning")
    reasoning.reject_unknown({"effort", "summary", "generate_summary"})
    effort = reasoning.string("effort")
    if effort is None:
        return None, (dict(reasoning.data) or None)
    if effort not in EFFORTS:
        raise HTTPError(400, f"reasoning.effort must be one of {', '.join(EFFORTS)}", param="reasoning.effort")
    return EFFORTS[effort], {"effort": effort, "summary": reasoning.data.get("summary")}


def read_metadata(fields: Fields) -> dict:
    metadata = fields.obj("metadata", {})
    if len(metadata) > MAX_METADATA or any(not isinstance(v, str) or len(k) > 64 or len(v) > 512
                                           for k, v in metadata.items()):
        raise HTTPError(400, f"metadata holds at most {MAX_METADATA} string values (keys up to 64 characters, "
                        "values up to 512)", param="metadata")
    return metadata


def previous_turns(store: ResponseStore, fields: Fields) -> list[dict]:
    """The conversation of the response `previous_response_id` names (none: [])."""
    previous = fields.string("previous_response_id", non_empty=True)
    if previous is None:
        return []
    entry = store.get(previous)
    if entry is None:
        raise HTTPError(400, f"previous response {previous!r} was not found (this server keeps the last "
                        f"{store.max_responses} stored responses, in memory)", param="previous_response_id")
    return [dict(turn) for turn in entry[1]]


def refuse_unkept(fields: Fields) -> None:
    """What needs conversation objects, or running in the background."""
    if fields.has("conversation"):
        raise HTTPError(400, f"'conversation' is not supported: {_NOT_KEPT}", param="conversation")
    if fields.boolean("background", False):
        raise HTTPError(400, "'background' responses are not supported: this server answers in the request",
                        param="background")
    fields.boolean("store")
    fields.nested("stream_options").reject_unknown({"include_obfuscation"})
    for name in ("user", "service_tier", "safety_identifier", "prompt_cache_key", "prompt_cache_retention"):
        fields.string(name)
    if fields.string("truncation", "disabled") not in ("auto", "disabled"):
        raise HTTPError(400, "truncation must be 'auto' or 'disabled'", param="truncation")


def read_include(fields: Fields) -> bool:
    """Whether the output text's log-probabilities were asked for (the other ``include``
    values name outputs of tools this server does not run)."""
    include = fields.array("include", [], max_items=32)
    if any(not isinstance(name, str) for name in include):
        raise HTTPError(400, "'include' must be an array of strings", param="include")
    return LOGPROBS_INCLUDE in include


# --------------------------------------------------------------------------------------
# The route
# --------------------------------------------------------------------------------------


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    fields = await read_fields(request)
    fields.reject_unknown(RESPONSE_FIELDS)
    model = fields.string("model", required=True)
    refuse_unkept(fields)
    store, keep = store_of(request), bool(fields.boolean("store", True))
    history = read_history(fields, previous_turns(store, fields))
    profile = profiles.profile_of(state_of(request).registry, model)
    messages = profiles.conversation(profile, with_instructions(fields, history))
    stream = bool(fields.boolean("stream", False))
    options = read_options(fields, profile)
    tools, choice = read_choice(fields, read_tools(fields))
    fmt, text = read_format(fields)
    think, reasoning = read_reasoning(fields)
    echo = _echo(fields, options, text, reasoning)
    keep_alive = read_keep_alive(fields)

    def start(adapter):
        return adapter.start_chat(messages, tools=tools, tool_choice=choice, format=fmt, think=think,
                                  options=options)

    def finished(response: dict, result: ChatResult) -> None:
        if keep:
            store.put(response, history + [reply_message(result)])

    started = await start_reply(state_of(request), model, start, options=options)
    shaper = ResponsesShaper(model, echo, token_bytes=started.lease.adapter.token_bytes,
                             logprobs=bool(options.get("logprobs")))
    if stream:
        return streamed_reply(_event_stream(started.run, shaper, finished), SSE, started, keep_alive)
    return await _whole_reply(request, started, shaper, finished, keep_alive)


def read_options(fields: Fields, profile: Any) -> dict:
    """Sampling options by Ollama's names (the chat route's reader), the output limit and
    the log-probabilities."""
    options = read_sampling(fields, None, profile)
    options["num_predict"] = fields.integer("max_output_tokens", options.get("num_predict"), low=1, high=MAX_TOKENS)
    top_logprobs = fields.integer("top_logprobs", 0, low=0, high=min(20, MAX_TOP_LOGPROBS))
    if read_include(fields) or top_logprobs:
        options.update(logprobs=True, top_logprobs=top_logprobs)
    fields.integer("max_tool_calls", low=1, high=1 << 16)   # a forced reply is one call; others stop at will
    return options


async def _whole_reply(request: Request, started, shaper: ResponsesShaper, finished, keep_alive) -> Response:
    """The response object once the reply is done (499 when the client went away first)."""
    result = await collect_started(started, request.receive, keep_alive)
    if result is None:
        return Response(status_code=499)
    response = shaper.response(result)
    finished(response, result)
    return JSONResponse(response)


def store_of(request: Request) -> ResponseStore:
    """The app's response store (made on first use)."""
    store = getattr(request.app.state, "responses", None)
    if store is None:
        store = request.app.state.responses = ResponseStore()
    return store


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> Response:
    return JSONResponse(_stored(request, response_id)[0])


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    _stored(request, response_id)
    store_of(request).delete(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _stored(request: Request, response_id: str) -> tuple[dict, list[dict]]:
    entry = store_of(request).get(response_id)
    if entry is None:
        raise HTTPError(404, f"no stored response with id {response_id!r}", param="response_id")
    return entry


def _echo(fields: Fields, options: dict, text: dict, reasoning: dict | None) -> dict:
    """The request's settings, as the response object repeats them."""
    data = fields.data
    return {
        "instructions": data.get("instructions"), "max_output_tokens": data.get("max_output_tokens"),
        "parallel_tool_calls": fields.boolean("parallel_tool_calls", True),
        "previous_response_id": data.get("previous_response_id"),
        "reasoning": reasoning or {"effort": None, "summary": None}, "store": bool(data.get("store", True)),
        "temperature": _effective(options, "temperature"), "text": text,
        "tool_choice": data.get("tool_choice") or "auto", "tools": data.get("tools") or [],
        "top_p": _effective(options, "top_p"), "truncation": data.get("truncation") or "disabled",
        "user": data.get("user"), "metadata": read_metadata(fields), "background": False,
        "service_tier": "default",
    }


def _effective(options: dict, name: str) -> float:
    value = options.get(name)
    return 1.0 if value is None else value   # OpenAI's default for both


async def _event_stream(run, shaper: ResponsesShaper, finished) -> AsyncIterator[bytes]:
    """The reply's events; `finished(response, result)` is told of the whole response."""
    events = shaper.start_events()
    try:
        for event in events:
            yield _sse(event)
        async for step in run:
            if isinstance(step, ChatResult):
                events = shaper.final_events(step)
                finished(events[-1]["response"], step)
            else:
                events = shaper.piece_events(step)
            for event in events:
                yield _sse(event)
    except Exception as exc:  # after the headers: report in the stream
        for event in shaper.error_events(stream_error_message(exc)):
            yield _sse(event)


def _sse(event: dict) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


__all__ = ["RESPONSE_FIELDS", "create_response", "input_messages", "read_history", "router", "with_instructions"]
