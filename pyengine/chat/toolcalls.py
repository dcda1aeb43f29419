"""Turning the text of one tool-call block into OpenAI ``tool_calls`` entries.

Each ``parse_*`` function takes the text a model wrote for its tool-call syntax and
returns a list of calls, or None when the text is not a well-formed call (the caller
then keeps the text as content). :class:`JsonExtent` finds where a JSON value that is
still arriving piece by piece ends, without parsing it twice.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from typing import Any

_ID_ALPHABET = string.ascii_letters + string.digits
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.:-]+\Z")
_XML_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_BUILTIN_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.call\((.*)\)\s*\Z", re.DOTALL)


def new_call_id() -> str:
    """An id in OpenAI's shape: ``call_`` and 24 letters or digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def make_tool_call(name: Any, arguments: Any, call_id: str | None = None) -> dict | None:
    """One OpenAI tool call, or None when the name or arguments are not usable."""
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name.strip()):
        return None
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
        arguments = decoded
    if not isinstance(arguments, dict):
        return None
    return {
        "id": call_id or new_call_id(),
        "type": "function",
        "function": {"name": name.strip(), "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def call_from_object(obj: Any) -> dict | None:
    """A call from ``{"name", "arguments"|"parameters"}``, also wrapped as
    ``{"type": "function", "function": {...}}``."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if "name" not in obj:
        return None
    arguments = obj.get("arguments", obj.get("parameters"))
    return make_tool_call(obj.get("name"), arguments)


def calls_from_json(text: str) -> list[dict] | None:
    """Calls from a JSON object or a JSON list of objects."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item) for item in items]
    if not calls or any(call is None for call in calls):
        return None
    return calls


def parse_hermes(inner: str) -> list[dict] | None:
    """The inside of ``<tool_call>...</tool_call>``: JSON (Hermes, Qwen2.5/3) or the XML
    form of Qwen3-Coder/Qwen3.5 (``<function=name><parameter=key>value</parameter>``)."""
    inner = inner.strip()
    if inner.startswith("<function="):
        return _parse_xml_functions(inner)
    return calls_from_json(inner)


def _parse_xml_functions(text: str) -> list[dict] | None:
    calls = []
    for match in _XML_FUNCTION.finditer(text):
        arguments = {key.strip(): _xml_value(value) for key, value in _XML_PARAMETER.findall(match.group(2))}
        call = make_tool_call(match.group(1), arguments)
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _xml_value(raw: str) -> Any:
    """A parameter value: JSON when it reads as JSON (numbers, objects...), else text."""
    value = raw.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_mistral_named(head: str, arguments: str) -> list[dict] | None:
    """``name[ARGS]{...}`` or ``name[CALL_ID]id[ARGS]{...}`` (Mistral's newer syntax)."""
    name, _, call_id = head.partition("[CALL_ID]")
    call_id = call_id.strip()
    call = make_tool_call(name, arguments, call_id if call_id.isalnum() else None)
    return [call] if call else None


def parse_python_tag(payload: str) -> list[dict] | None:
    """After Llama 3's ``<|python_tag|>``: a JSON call, a built-in ``tool.call(k=v)``,
    or code for the built-in python tool."""
    payload = payload.strip()
    if not payload:
        return None
    if payload.startswith("{"):
        return calls_from_json(payload)
    builtin = _BUILTIN_CALL.match(payload)
    if builtin:
        arguments = _literal_keywords(builtin.group(2))
        if arguments is not None:
            call = make_tool_call(builtin.group(1), arguments)
            return [call] if call else None
    call = make_tool_call("python", {"code": payload})
    return [call] if call else None


def _literal_keywords(text: str) -> dict | None:
    """``query="x", n=3`` as a dict, when every value is a Python literal."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call) or call.args:
        return None
    try:
        return {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg}
    except (ValueError, SyntaxError):
        return None


class JsonExtent:
    """Finds the end of the JSON object or array that starts at the beginning of a
    growing text, tracking strings and nesting across calls (each character is looked
    at once)."""

    def __init__(self) -> None:
        self._position = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def end(self, text: str, start: int = 0) -> int | None:
        """The index just past the value that begins at `start` (a ``{`` or ``[``) in
        `text`, or None while it is incomplete. Call again with the text grown."""
        for index in range(max(self._position, start), len(text)):
            char = text[index]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth <= 0:
                    self._position = index + 1
                    return index + 1
        self._position = len(text)
        return None
