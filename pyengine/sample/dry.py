"""DRY ("don't repeat yourself"): penalise tokens that would extend a repeated sequence.

If the last L tokens of the history also occur earlier, followed by token t, then emitting
t would repeat L+1 tokens; when L >= allowed_length, t's logit drops by
multiplier * base ** (L - allowed_length). Sequence breakers (pieces such as "\\n" or ":")
cap how far back a repeat may reach, and tokens that are breakers are never penalised.
"""

from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

from pyengine.errors import InvalidOptionError
from pyengine.sample.candidates import Candidates

_MAX_BREAKER_BYTES = 40   # longer breakers are truncated (as llama.cpp does)
_MAX_BREAKER_TAIL = 20    # tokens kept of a breaker's continuation
_LOG_FLOAT_MAX = 88.7228391  # log(float32 max): penalties beyond this exponent saturate

Breakers = dict[int, list[tuple[int, ...]]]


class Dry:
    """The DRY sampler; `breakers` maps a head token to the token tails completing a breaker."""

    name = "dry"

    def __init__(self, multiplier: float, base: float, allowed_length: int, last_n: int | None,
                 breakers: Breakers) -> None:
        self.multiplier = multiplier
        self.base = base
        self.allowed_length = allowed_length
        self.last_n = last_n            # None = the whole history
        self.breakers = breakers
        self.single_breakers = np.fromiter(
            (head for head, tails in breakers.items() if () in tails), dtype=np.int64)
        self.heads = np.fromiter(breakers.keys(), dtype=np.int64, count=len(breakers))
        self.max_exponent = int(_LOG_FLOAT_MAX / math.log(base)) if base > 1.000001 else 0
        self._tokens = np.zeros(64, dtype=np.int64)
        self._size = 0

    @property
    def enabled(self) -> bool:
        return self.multiplier != 0.0 and self.base >= 1.0 and self.last_n != 0

    @property
    def active(self) -> bool:
        return self.enabled and self._window_size() > self.allowed_length

    def accept(self, token: int) -> None:
        if not self.enabled:
            return
        if self._size == self._tokens.shape[0]:
            self._compact_or_grow()
        self._tokens[self._size] = token
        self._size += 1

    def reset(self) -> None:
        self._size = 0

    def _compact_or_grow(self) -> None:
        if self.last_n is not None and self._size >= 2 * self.last_n:
            keep = self._tokens[self._size - self.last_n:self._size].copy()
            self._tokens[: keep.shape[0]] = keep
            self._size = keep.shape[0]
        else:
            self._tokens = np.concatenate([self._tokens, np.zeros_like(self._tokens)])

    def _window_size(self) -> int:
        return self._size if self.last_n is None else min(self._size, self.last_n)

    def touched(self) -> np.ndarray:
        """The ids whose logits apply() may change (each from its own logit alone)."""
        return self._penalised()[0]

    def apply(self, cand: Candidates) -> None:
        tokens, lengths = self._penalised()
        if tokens.size == 0:
            return
        positions, which = cand.positions_of(tokens)
        exponents = lengths[which] - self.allowed_length
        if self.max_exponent > 0:
            exponents = np.minimum(exponents, self.max_exponent)
        cand.logits[positions] -= (self.multiplier * np.power(self.base, exponents)).astype(np.float32)
        cand.sorted = False

    def _penalised(self) -> tuple[np.ndarray, np.ndarray]:
        """The tokens that would extend a repeat, with the repeat's length."""
        none = np.empty(0, np.int64), np.empty(0, np.int64)
        if not self.active:
            return none
        n = self._window_size()
        window = self._tokens[self._size - n:self._size]
        limit = self._repeat_limit(window)
        if limit < self.allowed_length:
            return none
        return self._repeat_lengths(window, limit)

    def _repeat_limit(self, window: np.ndarray) -> int:
        """How many tokens back a repeat may reach: up to the most recent breaker."""
        n = window.shape[0]
        if self.heads.size == 0:
            return n
        for position in np.flatnonzero(np.isin(window, self.heads))[::-1].tolist():
            back = n - 1 - position       # distance from the end
            longest = -1
            for tail in self.breakers[int(window[position])]:
                if longest < len(tail) <= back and \
                        tuple(window[position + 1:position + 1 + len(tail)].tolist()) == tail:
                    longest = len(tail)
            if longest >= 0:
                return back - longest
        return n

    def _repeat_lengths(self, window: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """For each token that follows an earlier occurrence of the current suffix, the
        longest such suffix length (capped), keeping those >= allowed_length."""
        n = window.shape[0]
        # Lengths past the saturation point all get the same penalty, so stop counting there
        # (with base 1 every counted repeat gets exactly the multiplier).
        saturation = self.allowed_length + self.max_exponent if self.max_exponent > 0 else self.allowed_length
        cap = min(limit, max(saturation, 1))
        ends = np.flatnonzero(window[: n - 1] == window[n - 1]) if cap > 0 else np.empty(0, np.int64)
        found_ends, found_lengths = [], []
        length = 1
        while ends.size:
            if length >= cap:
                found_ends.append(ends)
                found_lengths.append(np.full(ends.size, cap))
                break
            # extend every match one more token back in time
            room = ends - length >= 0
            extends = np.zeros(ends.size, dtype=bool)
            extends[room] = window[ends[room] - length] == window[n - 1 - length]
            found_ends.append(ends[~extends])
            found_lengths.append(np.full(int(np.count_nonzero(~extends)), length))
            ends = ends[extends]
            length += 1
        if not found_ends:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        all_ends = np.concatenate(found_ends)
        all_lengths = np.concatenate(found_lengths)
        wanted = all_lengths >= self.allowed_length
        next_tokens = window[all_ends[wanted] + 1]
        lengths = all_lengths[wanted]
        if self.single_breakers.size:
            keep = ~np.isin(next_tokens, self.single_breakers)
            next_tokens, lengths = next_tokens[keep], lengths[keep]
        return _max_per_token(next_tokens, lengths)


def _max_per_token(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if tokens.size == 0:
        return tokens, lengths
    order = np.lexsort((-lengths, tokens))
    tokens, lengths = tokens[order], lengths[order]
    first = np.concatenate([[True], tokens[1:] != tokens[:-1]])
    return tokens[first], lengths[first]


# ---- sequence breakers: strings -> (head token, tail tokens), computed once per vocabulary

_cache_lock = threading.Lock()
_breaker_cache: dict[tuple[int, int, tuple[str, ...]], tuple[Sequence[bytes], Breakers]] = {}


def build_breakers(pieces: Sequence[bytes] | None, breakers: Sequence[str]) -> Breakers:
    """Map each token that starts (or contains) a breaker to the tails that complete it."""
    if pieces is None or not breakers:
        return {}
    key = (id(pieces), len(pieces), tuple(breakers))
    with _cache_lock:
        hit = _breaker_cache.get(key)
        if hit is not None and hit[0] is pieces:
            return hit[1]
    if any(not isinstance(p, (bytes, bytearray)) for p in pieces):
        raise InvalidOptionError("token_pieces must be bytes (each token's UTF-8 text, raw bytes for byte tokens)")
    result: Breakers = {}
    lookup: dict[bytes, int] | None = None
    for text in breakers:
        target = text.encode("utf-8")[:_MAX_BREAKER_BYTES]
        for token, piece in enumerate(pieces):
            if not piece:
                continue
            if target in piece:
                _add_tail(result, token, ())
                continue
            for start in _overlap_starts(piece, target):
                if lookup is None:
                    lookup = _piece_lookup(pieces)
                tail = _greedy_tokenize(target[len(piece) - start:], lookup)[:_MAX_BREAKER_TAIL]
                _add_tail(result, token, tuple(tail))
    with _cache_lock:
        if len(_breaker_cache) > 8:
            _breaker_cache.clear()
        _breaker_cache[key] = (pieces, result)
    return result


def _add_tail(result: Breakers, token: int, tail: tuple[int, ...]) -> None:
    tails = result.setdefault(token, [])
    if tail not in tails:
        tails.append(tail)


def _overlap_starts(piece: bytes, target: bytes):
    """Offsets where the piece ends with a proper prefix of target (a breaker split over tokens)."""
    start = piece.find(target[:1])
    while start != -1:
        rest = piece[start:]
        if len(rest) < len(target) and target.startswith(rest):
            yield start
        start = piece.find(target[:1], start + 1)


def _piece_lookup(pieces: Sequence[bytes]) -> dict[bytes, int]:
    lookup: dict[bytes, int] = {}
    for token, piece in enumerate(pieces):
        if piece and len(piece) <= _MAX_BREAKER_BYTES:
            lookup.setdefault(piece, token)
    return lookup


def _greedy_tokenize(data: bytes, lookup: dict[bytes, int]) -> list[int]:
    """Longest-match split of a breaker's remainder into tokens (a stand-in tokenizer)."""
    tokens: list[int] = []
    start = 0
    while start < len(data):
        for end in range(len(data), start, -1):
            token = lookup.get(data[start:end])
            if token is not None:
                tokens.append(token)
                start = end
                break
        else:
            return tokens  # a byte no piece covers: keep what matched
    return tokens
