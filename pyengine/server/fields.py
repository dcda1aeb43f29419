"""Reading request bodies: strict JSON, then typed fields with clear 400 messages.

Strict means: UTF-8 only, no NaN/Infinity literals, an object at the top, no lone
surrogates in strings (they cannot be encoded back to text), bounded nesting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Iterable

from pyengine.server.errors import HTTPError

MAX_DEPTH = 64
_MISSING = object()


def parse_json_object(raw: bytes) -> dict:
    """The request body as a dict, or HTTPError 400 saying what is wrong with it."""
    if not raw.strip():
        raise HTTPError(400, "the request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HTTPError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except HTTPError:
        raise
    except RecursionError:
        raise HTTPError(400, "the request body is nested too deeply") from None
    except ValueError as exc:
        raise HTTPError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HTTPError(400, f"the request body must be a JSON object, not {_json_type(value)}")
    _check_strings(value)
    return value


def _reject_constant(name: str) -> Any:
    raise HTTPError(400, f"the request body is not valid JSON: {name} is not a JSON number")


def _check_strings(value: Any) -> None:
    """Reject lone surrogates ("\\ud800") and nesting deeper than MAX_DEPTH."""
    pending = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise HTTPError(400, f"the request body is nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key)
                pending.append((child, depth + 1))
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise HTTPError(400, "the request body contains a lone UTF-16 surrogate (invalid Unicode)") from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class Fields:
    """Typed access to a request object; every mistake raises HTTPError 400 naming the field."""

    def __init__(self, data: Mapping[str, Any], where: str = "") -> None:
        self.data = data
        self.where = where

    def _name(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def _fail(self, name: str, expected: str, value: Any) -> HTTPError:
        shown = json.dumps(value)[:80] if not isinstance(value, bytes) else repr(value)[:80]
        return HTTPError(400, f"'{self._name(name)}' must be {expected}, got {shown}", param=self._name(name))

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def reject_unknown(self, known: Iterable[str]) -> None:
        known = set(known)
        for name in self.data:
            if name not in known:
                raise HTTPError(400, f"unrecognized request argument supplied: {self._name(name)}",
                                param=self._name(name))

    def raw(self, name: str, default: Any = None) -> Any:
        value = self.data.get(name)
        return default if value is None else value

    def string(self, name: str, default: str | None = None, *, required: bool = False,
               non_empty: bool = False) -> str | None:
        value = self.data.get(name)
        if value is None:
            if required:
                raise HTTPError(400, f"'{self._name(name)}' is required", param=self._name(name))
            return default
        if not isinstance(value, str):
            raise self._fail(name, "a string", value)
        if (non_empty or required) and not value:
            raise HTTPError(400, f"'{self._name(name)}' must not be empty", param=self._name(name))
        return value

    def boolean(self, name: str, default: bool | None = None) -> bool | None:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(name, "true or false", value)
        return value

    def integer(self, name: str, default: int | None = None, *, low: int | None = None,
                high: int | None = None) -> int | None:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(name, "an integer", value)
        if (low is not None and value < low) or (high is not None and value > high):
            raise self._fail(name, _range("an integer", low, high), value)
        return value

    def number(self, name: str, default: float | None = None, *, low: float | None = None,
               high: float | None = None) -> float | None:
        value = self.data.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(name, "a number", value)
        number = float(value) if abs(value) < 1e308 else math.inf
        if not math.isfinite(number) or (low is not None and number < low) or (high is not None and number > high):
            raise self._fail(name, _range("a number", low, high), value)
        return number

    def obj(self, name: str, default: dict | None = None) -> dict | None:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, dict):
            raise self._fail(name, "an object", value)
        return value

    def array(self, name: str, default: list | None = None, *, max_items: int | None = None) -> list | None:
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, list):
            raise self._fail(name, "an array", value)
        if max_items is not None and len(value) > max_items:
            raise HTTPError(400, f"'{self._name(name)}' has {len(value)} items; at most {max_items} are allowed",
                            param=self._name(name))
        return value

    def stop(self, name: str = "stop", max_items: int = 16) -> list[str] | None:
        """OpenAI's/Ollama's stop: a string or a list of strings."""
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, str):
            return [value] if value else None
        items = self.array(name, max_items=max_items)
        if any(not isinstance(item, str) for item in items):
            raise self._fail(name, "a string or an array of strings", value)
        return [item for item in items if item] or None

    def nested(self, name: str) -> "Fields":
        return Fields(self.obj(name, {}), self._name(name))


def _range(kind: str, low: float | None, high: float | None) -> str:
    if high is None:
        return f"{kind} >= {low}"
    if low is None:
        return f"{kind} <= {high}"
    return f"{kind} in [{low}, {high}]"


__all__ = ["Fields", "MAX_DEPTH", "parse_json_object"]
