"""Collectors: each gathers the text of one tool-call block while it streams in.

A collector is created when the parser meets the opening marker of a block (or, for
Llama 3's bare JSON, a ``{`` at the start of the reply). :meth:`examine` is shown the
text after the opener, growing, and answers None (needs more text) or a
:class:`BlockResult`: how many characters the block spans and the calls found in them
(None when the block is not a well-formed call; its text then stays content).

Every decision depends only on the text seen so far, and a "not a call" verdict points
at the first character that rules the call out, so the split of the reply into pieces
never changes the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.chat.toolcalls import JsonExtent, calls_from_json, parse_hermes, parse_mistral_named, parse_python_tag

_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
_MAX_NAME_CHARS = 256


@dataclass(frozen=True)
class BlockResult:
    end: int
    calls: list[dict] | None


def _first_non_space(text: str) -> int:
    return len(text) - len(text.lstrip())


class HermesCollector:
    """``<tool_call>{json}</tool_call>`` (also the XML body of Qwen3-Coder/Qwen3.5)."""

    opener = "<tool_call>"
    closer = "</tool_call>"

    def __init__(self) -> None:
        self._searched = 0

    def examine(self, text: str, final: bool) -> BlockResult | None:
        close_at = text.find(self.closer, self._searched)
        if close_at >= 0:
            return BlockResult(close_at + len(self.closer), parse_hermes(text[:close_at]))
        self._searched = max(0, len(text) - len(self.closer) + 1)
        if final:  # the model stopped before closing: accept a complete body
            return BlockResult(len(text), parse_hermes(text))
        return None


class JsonCallCollector:
    """A bare JSON call: Llama 3's ``{"name": ..., "parameters": ...}`` at the start of a
    reply (opener ""), or the JSON after ``<|python_tag|>``."""

    def __init__(self, opener: str = "") -> None:
        self.opener = opener
        self._extent = JsonExtent()
        self._start: int | None = None

    def examine(self, text: str, final: bool) -> BlockResult | None:
        if self._start is None:
            start = _first_non_space(text)
            if start == len(text):
                return BlockResult(len(text), None) if final else None
            if text[start] != "{":
                return self._not_json(text, start, final)
            self._start = start
        end = self._extent.end(text, self._start)
        if end is None:
            return BlockResult(len(text), None) if final else None
        body = text[self._start : end]
        return BlockResult(end, parse_python_tag(body) if self.opener else calls_from_json(body))

    def _not_json(self, text: str, start: int, final: bool) -> BlockResult | None:
        if not self.opener:
            return BlockResult(start, None)
        # <|python_tag|> followed by code: the whole rest of the reply is the program
        return BlockResult(len(text), parse_python_tag(text)) if final else None


class MistralCollector:
    """``[TOOL_CALLS][{...}, ...]`` or ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``."""

    opener = "[TOOL_CALLS]"
    _ARGS = "[ARGS]"
    _CALL_ID = "[CALL_ID]"

    def __init__(self) -> None:
        self._extent = JsonExtent()
        self._start: int | None = None
        self._named = False

    def examine(self, text: str, final: bool) -> BlockResult | None:
        if self._start is None:
            start = _first_non_space(text)
            if start == len(text):
                return BlockResult(len(text), None) if final else None
            self._start, self._named = start, text[start] not in "[{"
        if self._named:
            return self._examine_named(text, final)
        end = self._extent.end(text, self._start)
        if end is None:
            return BlockResult(len(text), None) if final else None
        return BlockResult(end, calls_from_json(text[self._start : end]))

    def _examine_named(self, text: str, final: bool) -> BlockResult | None:
        args_at = text.find(self._ARGS, self._start)
        head_end = len(text) if args_at < 0 else args_at
        bad = self._first_bad_head_char(text, self._start, head_end, partial_ok=args_at < 0)
        if bad is not None:
            return BlockResult(bad, None)
        if args_at < 0:
            return BlockResult(len(text), None) if final else None
        json_at = args_at + len(self._ARGS)
        json_at += _first_non_space(text[json_at:])
        if json_at == len(text):
            return BlockResult(len(text), None) if final else None
        if text[json_at] != "{":
            return BlockResult(json_at, None)
        end = self._extent.end(text, json_at)
        if end is None:
            return BlockResult(len(text), None) if final else None
        return BlockResult(end, parse_mistral_named(text[self._start : args_at], text[json_at:end]))

    def _first_bad_head_char(self, text: str, start: int, end: int, partial_ok: bool) -> int | None:
        """Where ``name[CALL_ID]id`` stops being possible, or None if it still is."""
        index = start
        while index < end:
            if index - start > _MAX_NAME_CHARS:
                return index
            if text.startswith(self._CALL_ID, index):
                index += len(self._CALL_ID)
            elif text[index] in _NAME_CHARS:
                index += 1
            elif partial_ok and text[index] == "[" and self._is_partial_marker(text[index:end]):
                return None  # "[ARG" at the end of what has arrived
            else:
                return index
        return None

    def _is_partial_marker(self, tail: str) -> bool:
        return self._ARGS.startswith(tail) or self._CALL_ID.startswith(tail)


def collector_for(opener: str) -> HermesCollector | JsonCallCollector | MistralCollector:
    """The collector that reads the block opened by `opener`."""
    if opener == HermesCollector.opener:
        return HermesCollector()
    if opener == MistralCollector.opener:
        return MistralCollector()
    return JsonCallCollector(opener)
