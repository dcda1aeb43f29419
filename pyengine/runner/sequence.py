"""Per-request text handling: stop strings with hold-back, and the result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


class StopMatcher:
    """Releases generated text, holding back any tail that could still grow
    into a stop string, so text is never emitted and then retracted."""

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False

    def push(self, text: str) -> str:
        """Text that is safe to emit now; sets `stopped` when a stop string appears."""
        if self.stopped:
            return ""
        buf = self._pending + text
        if not self.stops:
            self._pending = ""
            return buf
        hit = min((i for i in (buf.find(s) for s in self.stops) if i >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            self._pending = ""
            return buf[:hit]
        keep = self._held_tail(buf)
        self._pending = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return "" if self.stopped else out

    def _held_tail(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best


@dataclass
class Completion:
    """What a finished generation reports."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = "length"     # "stop" (EOG or stop string), "length", "cancelled"
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)
