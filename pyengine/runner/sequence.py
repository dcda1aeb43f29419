"""Per-request text handling: stop strings with hold-back, the events a request
streams (Chunk per generated token) and what it reports at the end (Completion)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

class StopMatcher:
    """Releases generated text, holding back any tail that could still grow
    into a stop string, so text is never emitted and then retracted."""

    def __init__(self, stops: Iterable[str] = ()) -> None:
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """Text that is safe to emit now; sets `stopped` when a stop string appears."""
        if self.stopped:
            return ""
        buf = self._pending + text
        if not self.stops:
            self._pending = ""
            return buf
        hits = [(i, n, s) for n, s in enumerate(self.stops) if (i := buf.find(s)) >= 0]
        if hits:
            hit, _, self.matched = min(hits)
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


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of a generated token under the raw logits, and the best alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Chunk:
    """What one step released for a request: text that is now safe to show (maybe
    empty while a stop string or a UTF-8 character is pending), the token(s) it
    generated and their log-probabilities when asked for."""

    text: str
    tokens: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass
class Completion:
    """What a finished generation reports."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    finish_reason: str = "length"     # "stop" (EOG or stop string), "length", "cancelled"
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0       # from the first prompt chunk to the first token's logits
    generation_seconds: float = 0.0   # from the first token's logits to the end
    queue_seconds: float = 0.0        # waiting for a free sequence slot
    cached_tokens: int = 0            # prompt tokens reused from the cache (not recomputed)
    truncated_tokens: int = 0         # prompt tokens dropped to fit the context (shift on)
    context_shifts: int = 0
    stop_string: str | None = None    # the stop string that ended the text, if one did
    logprobs: list[TokenLogprob] | None = None
    logits: np.ndarray | None = None  # every prompt position's logits, for scoring requests
    speculative: str | None = None    # "ngram" or "draft" when the request speculated
    draft_tokens: int = 0             # drafted tokens verified by the model
    draft_accepted: int = 0           # of those, the ones that were kept

    @property
    def draft_acceptance(self) -> float:
        """The share of verified drafts that were kept (0 when none was drafted)."""
        return self.draft_accepted / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)
