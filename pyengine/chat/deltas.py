"""What reply parsers emit, and the marker search they share.

A parser (:class:`~pyengine.chat.parsers.StreamParser`, or
:class:`~pyengine.chat.harmony.HarmonyParser` for gpt-oss) turns pushed text into
:class:`Delta` pieces; :func:`collect` adds them up into one :class:`ParsedOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Delta:
    """One streamed piece: text of `kind` "content" or "reasoning", or a whole tool call."""

    kind: str
    text: str = ""
    tool_call: dict | None = None


@dataclass
class ParsedOutput:
    content: str
    reasoning: str | None = None
    tool_calls: list[dict] = field(default_factory=list)


def collect(deltas: list[Delta]) -> ParsedOutput:
    """Add streamed deltas up into the one-shot result."""
    content = "".join(delta.text for delta in deltas if delta.kind == "content")
    reasoning = "".join(delta.text for delta in deltas if delta.kind == "reasoning")
    calls = [delta.tool_call for delta in deltas if delta.kind == "tool_call" and delta.tool_call is not None]
    return ParsedOutput(content=content, reasoning=reasoning or None, tool_calls=calls)


def earliest_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """The first marker occurring in `text` (the longest one at a tie)."""
    best: tuple[int, str] | None = None
    for marker in markers:
        index = text.find(marker)
        if index < 0:
            continue
        if best is None or index < best[0] or (index == best[0] and len(marker) > len(best[1])):
            best = (index, marker)
    return best


def partial_marker_length(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that is the start of a marker."""
    longest = max((len(marker) for marker in markers), default=0)
    for length in range(min(len(text), longest - 1), 0, -1):
        tail = text[-length:]
        if any(marker.startswith(tail) for marker in markers):
            return length
    return 0


__all__ = ["Delta", "ParsedOutput", "collect", "earliest_marker", "partial_marker_length"]
