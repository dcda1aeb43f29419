"""Conversations as clients send them (OpenAI or Ollama), made ready for a chat template.

Templates are written for Hugging Face's message dicts: ``content`` a string,
assistant ``tool_calls`` with ``function.arguments`` as an object, tool results as
``tool`` turns, an earlier turn's reasoning as ``reasoning_content`` (and as
``thinking``, the name gpt-oss's template reads). Clients send other spellings
(OpenAI's content parts and JSON-string arguments, Ollama's ``thinking`` and
``tool_name``, OpenAI's ``developer`` role); this module maps them onto that one shape
and rejects what cannot be rendered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pyengine.errors import InvalidOptionError, UnsupportedError

MAX_MESSAGES = 10_000
ROLES = ("system", "user", "assistant", "tool")
# Other names clients send for those: OpenAI's developer messages and its legacy function results.
_ROLE_ALIASES = {"developer": "system", "function": "tool"}
_TEXT_PART_TYPES = ("text", "input_text")
# The names clients give an earlier turn's reasoning, first found wins (as transformers reads them).
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def normalize_messages(messages: Any) -> list[dict]:
    """The conversation as template-ready dicts (new dicts; the input is not changed)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidOptionError("messages must be a list of message objects")
    if not messages:
        raise InvalidOptionError("messages must not be empty")
    if len(messages) > MAX_MESSAGES:
        raise InvalidOptionError(f"too many messages ({len(messages)} > {MAX_MESSAGES})")
    return [_normalize_message(message, index) for index, message in enumerate(messages)]


def normalize_tools(tools: Any) -> list[dict] | None:
    """Function tools as templates expect them (``{"type": "function", "function": {...}}``)."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise InvalidOptionError("tools must be a list of tool objects")
    normalized = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidOptionError(f"tools[{index}] must be an object")
        kind = tool.get("type", "function")
        function = tool.get("function")
        if kind != "function" or not isinstance(function, Mapping):
            raise InvalidOptionError(f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidOptionError(f"tools[{index}].function.name must be a non-empty string")
        normalized.append({**tool, "type": "function", "function": dict(function)})
    return normalized or None


def _normalize_message(message: Any, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise InvalidOptionError(f"{where} must be an object with 'role' and 'content'")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidOptionError(f"{where}.role must be a non-empty string")
    role = _ROLE_ALIASES.get(role, role)
    if role not in ROLES:
        # a template would drop or misplace a turn it does not know
        raise InvalidOptionError(f"{where}.role {message['role']!r} is not a chat role; use one of "
                                 + ", ".join(ROLES + tuple(_ROLE_ALIASES)))
    out: dict[str, Any] = {"role": role, "content": _content_text(message, where)}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = _template_tool_calls(calls, where)
    reasoning = next((message[key] for key in _REASONING_KEYS if message.get(key) is not None), None)
    if isinstance(reasoning, str) and reasoning:
        # templates read it under either name (Qwen3 and GLM reasoning_content; gpt-oss,
        # Cohere and LFM thinking, as Hugging Face's messages spell it)
        out["reasoning_content"] = reasoning
        out["thinking"] = reasoning
    for key in ("name", "tool_call_id"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if isinstance(message.get("tool_name"), str):  # Ollama's name of the tool that answered
        out.setdefault("name", message["tool_name"])
    if message.get("images"):
        raise UnsupportedError(f"{where}: images are not supported by this server")
    return out


def _content_text(message: Mapping, where: str) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = []
        for n, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
                continue
            if not isinstance(part, Mapping):
                raise InvalidOptionError(f"{where}.content[{n}] must be an object")
            kind = part.get("type")
            if kind in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in _TEXT_PART_TYPES:
                raise InvalidOptionError(f"{where}.content[{n}].text must be a string")
            else:
                raise UnsupportedError(f"{where}.content[{n}]: content of type {kind!r} is not supported "
                                       "(only text)")
        return "".join(texts)
    raise InvalidOptionError(f"{where}.content must be a string, a list of text parts or null")


def _template_tool_calls(calls: Any, where: str) -> list[dict]:
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise InvalidOptionError(f"{where}.tool_calls must be a list")
    out = []
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidOptionError(f"{where}.tool_calls[{n}] must have function.name")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            # OpenAI sends a JSON string; templates index into an object.
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass
        entry = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
        if isinstance(call.get("id"), str):
            entry["id"] = call["id"]
        out.append(entry)
    return out


__all__ = ["MAX_MESSAGES", "ROLES", "normalize_messages", "normalize_tools"]
