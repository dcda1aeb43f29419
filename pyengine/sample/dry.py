"""DRY ("don't repeat yourself"): penalise tokens that would extend a repeated sequence.

If the last L tokens of the history also occur earlier, followed by token t, then emitting
t would repeat L+1 tokens; when L >= allowed_length, t's logit drops by
multiplier * base ** (L - allowed_length). Sequence breakers (pieces such as "\\n" or ":")
cap how far back a repeat may reach, and tokens that are breakers are never penalised.
"""

from __future__ import annotations

import math
import threading
from typing import Iterable, Mapping, Sequence

import numpy as np

from pyengine.errors import InvalidOptionError
from pyengine.sample.candidates import Candidates

_MAX_BREAKER_BYTES = 40   # longer breakers are truncated (as llama.cpp does)
_MAX_BREAKER_TAIL = 20    # tokens kept of a breaker's continuation
_LOG_FLOAT_MAX = 88.7228391  # log(float32 max): penalties beyond this exponent saturate


class Breakers:
    """Sequence breakers in token space: the tokens that hold a whole breaker (`single`),
    and the token sequences (head, *tail) that spell one across several tokens, indexed by
    their last token so that the sampler checks only what the newest token can complete."""

    def __init__(self, single: np.ndarray, sequences: Iterable[tuple[int, ...]]) -> None:
        self.single = np.unique(np.asarray(single, dtype=np.int64))
        self._single_set = frozenset(self.single.tolist())
        self.sequences = frozenset(sequences)
        lengths: dict[int, set[int]] = {}
        for sequence in self.sequences:
            lengths.setdefault(sequence[-1], set()).add(len(sequence))
        # last token -> the lengths of the sequences it ends, shortest first
        self.lengths_ending = {token: sorted(found) for token, found in lengths.items()}

    @classmethod
    def from_tails(cls, tails: Mapping[int, Iterable[tuple[int, ...]]]) -> Breakers:
        """From a map head token -> tails completing a breaker (an empty tail: the head
        alone holds one)."""
        single = [head for head, heads_tails in tails.items() if () in heads_tails]
        sequences = [(head, *tail) for head, heads_tails in tails.items() for tail in heads_tails if tail]
        return cls(np.array(single, dtype=np.int64), sequences)

    def __bool__(self) -> bool:
        return bool(self.single.size or self.sequences)

    def tails(self, head: int) -> list[tuple[int, ...]]:
        """The tails that complete a breaker after `head` (() when it holds one alone)."""
        found = [()] if head in self._single_set else []
        found += sorted(sequence[1:] for sequence in self.sequences if sequence[0] == head)
        return found

    def __getitem__(self, head: int) -> list[tuple[int, ...]]:
        found = self.tails(head)
        if not found:
            raise KeyError(head)
        return found

    def is_single(self, token: int) -> bool:
        return token in self._single_set


_NO_BREAKERS = Breakers(np.empty(0, np.int64), ())


class Dry:
    """The DRY sampler; `breakers` says which token sequences spell a sequence breaker.

    The most recent breaker is found as tokens arrive (each token is checked against the
    breaker sequences it can end, a bounded number), so a step costs the repeat scan alone:
    linear in the window, whatever the number of breakers."""

    name = "dry"

    def __init__(self, multiplier: float, base: float, allowed_length: int, last_n: int | None,
                 breakers: Breakers | Mapping[int, Iterable[tuple[int, ...]]] | None) -> None:
        self.multiplier = multiplier
        self.base = base
        self.allowed_length = allowed_length
        self.last_n = last_n            # None = the whole history
        if breakers is None:
            breakers = _NO_BREAKERS
        elif not isinstance(breakers, Breakers):
            breakers = Breakers.from_tails(breakers)
        self.breakers = breakers
        self.single_breakers = breakers.single
        self.max_exponent = int(_LOG_FLOAT_MAX / math.log(base)) if base > 1.000001 else 0
        self._tokens = np.zeros(64, dtype=np.int64)
        self._size = 0
        # the latest breaker seen: (index of its first token in _tokens, its tail length)
        self._last_break: tuple[int, int] | None = None
        self._matches: np.ndarray | None = None   # see _suffix_matches

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
        self._note_breaker(token)

    def accept_many(self, tokens: list[int]) -> None:
        if self.enabled:
            for token in tokens:
                self.accept(token)

    def reset(self) -> None:
        self._size = 0
        self._last_break = None
        self._matches = None

    def _note_breaker(self, token: int) -> None:
        """Record a breaker that the token just added completes. A scan back from the end
        would stop at the latest-starting breaker (and take its longest tail): of those
        ending here that is the shortest, and it beats the one kept unless it starts earlier."""
        end = self._size - 1
        found = (end, 0) if self.breakers.is_single(token) else None
        if found is None:
            for length in self.breakers.lengths_ending.get(token, ()):
                first = end - length + 1
                if first >= 0 and tuple(self._tokens[first:end + 1].tolist()) in self.breakers.sequences:
                    found = (first, length - 1)
                    break
        if found is not None and (self._last_break is None or found > self._last_break):
            self._last_break = found

    def _compact_or_grow(self) -> None:
        if self.last_n is not None and self._size >= 2 * self.last_n:
            dropped = self._size - self.last_n
            keep = self._tokens[dropped:self._size].copy()
            self._tokens[: keep.shape[0]] = keep
            self._size = keep.shape[0]
            if self._last_break is not None:
                self._last_break = (self._last_break[0] - dropped, self._last_break[1])
            self._matches = None
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
        if self._last_break is None:
            return n
        first, tail = self._last_break
        if first < self._size - n:
            return n            # the breaker has left the window
        return self._size - 1 - first - tail

    def _repeat_lengths(self, window: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """For each token that follows an earlier occurrence of the current suffix, the
        longest such suffix length (capped), keeping those >= allowed_length."""
        n = window.shape[0]
        # Lengths past the saturation point all get the same penalty, so stop counting there
        # (with base 1 every counted repeat gets exactly the multiplier).
        saturation = self.allowed_length + self.max_exponent if self.max_exponent > 0 else self.allowed_length
        cap = min(limit, max(saturation, 1))
        if cap <= 0 or n < 2:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        # the common suffix ending at each position, bounded by the window's start and the cap
        lengths = np.minimum(self._suffix_matches()[self._size - n:], np.arange(1, n, dtype=np.int64))
        np.minimum(lengths, cap, out=lengths)
        ends = np.flatnonzero(lengths >= max(self.allowed_length, 1))
        next_tokens = window[ends + 1]
        lengths = lengths[ends]
        if self.single_breakers.size:
            keep = ~np.isin(next_tokens, self.single_breakers)
            next_tokens, lengths = next_tokens[keep], lengths[keep]
        return _max_per_token(next_tokens, lengths)

    def _suffix_matches(self) -> np.ndarray:
        """For each position j before the last, how many tokens ending at j equal the
        last ones (the longest common suffix of history[:j+1] and history). Kept from step
        to step: one more token turns it into the next in one vectorized pass (a match
        grows by one where the new token repeats, else ends), so a step is linear in the
        window however long the repeats; computed afresh (Z-algorithm) after a prompt or
        a compaction."""
        size = self._size
        if self._matches is not None and self._matches.shape[0] == size - 1:
            return self._matches
        if self._matches is not None and self._matches.shape[0] == size - 2:
            previous, tokens = self._matches, self._tokens
            updated = np.zeros(size - 1, dtype=np.int64)
            repeats = tokens[:size - 1] == tokens[size - 1]
            updated[0] = repeats[0]
            updated[1:] = np.where(repeats[1:], previous + 1, 0)
        else:
            updated = _common_suffixes(self._tokens[:size])
        self._matches = updated
        return updated


def _common_suffixes(tokens: np.ndarray) -> np.ndarray:
    """out[j] = the longest common suffix of tokens[:j+1] and tokens, for j < n - 1 (the
    Z-algorithm over the reversed tokens: linear)."""
    reversed_tokens = tokens[::-1].tolist()
    n = len(reversed_tokens)
    z = [0] * n
    left = right = 0
    for i in range(1, n):
        length = min(right - i, z[i - left]) if i < right else 0
        while i + length < n and reversed_tokens[length] == reversed_tokens[i + length]:
            length += 1
        z[i] = length
        if i + length > right:
            left, right = i, i + length
    # position j of tokens is index n - 1 - j of the reversed ones
    return np.array(z[:0:-1], dtype=np.int64) if n > 1 else np.empty(0, np.int64)


def _max_per_token(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if tokens.size == 0:
        return tokens, lengths
    order = np.lexsort((-lengths, tokens))
    tokens, lengths = tokens[order], lengths[order]
    first = np.concatenate([[True], tokens[1:] != tokens[:-1]])
    return tokens[first], lengths[first]


# ---- sequence breakers: strings -> token sequences, computed once per vocabulary

_cache_lock = threading.Lock()
_breaker_cache: dict[tuple[int, int, tuple[str, ...]], tuple[Sequence[bytes], Breakers]] = {}
_vocab_cache: dict[int, tuple[Sequence[bytes], _Vocab]] = {}


def build_breakers(pieces: Sequence[bytes] | None, breakers: Sequence[str]) -> Breakers:
    """The token sequences that spell each breaker: every token whose piece contains it
    (alone), and every token whose piece ends with a proper prefix of it, followed by the
    greedy tokenization of the rest (at most 20 tokens, as llama.cpp keeps).

    One vectorized pass over the concatenated vocabulary per breaker: about a millisecond
    per breaker on a 50k vocabulary, whatever the breaker."""
    if pieces is None or not breakers:
        return _NO_BREAKERS
    key = (id(pieces), len(pieces), tuple(breakers))
    with _cache_lock:
        hit = _breaker_cache.get(key)
        if hit is not None and hit[0] is pieces:
            return hit[1]
    vocab = _vocab_of(pieces)
    single: list[np.ndarray] = []
    sequences: set[tuple[int, ...]] = set()
    for text in breakers:
        target = text.encode("utf-8")[:_MAX_BREAKER_BYTES]
        if not target:
            continue
        holders, partial = vocab.matches(target)
        single.append(holders)
        tails = {}   # bytes of the piece that match -> the tokens spelling the rest
        for token, matched in partial:
            if matched not in tails:
                tails[matched] = tuple(vocab.greedy_tokenize(target[matched:])[:_MAX_BREAKER_TAIL])
            if tails[matched]:
                sequences.add((token, *tails[matched]))
    result = Breakers(np.concatenate(single), sequences)
    with _cache_lock:
        if len(_breaker_cache) > 8:
            _breaker_cache.clear()
        _breaker_cache[key] = (pieces, result)
    return result


class _Vocab:
    """A vocabulary's pieces laid end to end, for vectorized searches of short byte strings."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        if any(not isinstance(p, (bytes, bytearray)) for p in pieces):
            raise InvalidOptionError(
                "token_pieces must be bytes (each token's UTF-8 text, raw bytes for byte tokens)")
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        self.blob = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        self.owner = np.repeat(np.arange(len(pieces), dtype=np.int64), lengths)   # token of each byte
        self.piece_end = np.cumsum(lengths)                                       # per token
        self.lookup: dict[bytes, int] = {}
        for token, piece in enumerate(pieces):
            if piece and len(piece) <= _MAX_BREAKER_BYTES:
                self.lookup.setdefault(bytes(piece), token)

    def matches(self, target: bytes) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Tokens whose piece contains `target`, and (token, n) for the tokens that do not
        but end with its first n bytes (n < len(target)), once per distinct n."""
        starts = np.flatnonzero(self.blob == target[0])
        left = self.piece_end[self.owner[starts]] - starts     # bytes from the start to the piece's end
        alive = np.ones(starts.size, dtype=bool)
        for k in range(1, len(target)):
            check = alive & (left > k)
            alive[check] = self.blob[starts[check] + k] == target[k]
        whole = alive & (left >= len(target))
        holders = np.unique(self.owner[starts[whole]])
        part = alive & (left < len(target))
        tokens, matched = self.owner[starts[part]], left[part]
        keep = ~np.isin(tokens, holders)
        pairs = set(zip(tokens[keep].tolist(), matched[keep].tolist()))
        return holders, sorted(pairs)

    def greedy_tokenize(self, data: bytes) -> list[int]:
        """Longest-match split of a breaker's remainder into tokens (a stand-in tokenizer)."""
        tokens: list[int] = []
        start = 0
        while start < len(data):
            for end in range(len(data), start, -1):
                token = self.lookup.get(data[start:end])
                if token is not None:
                    tokens.append(token)
                    start = end
                    break
            else:
                return tokens  # a byte no piece covers: keep what matched
        return tokens


def _vocab_of(pieces: Sequence[bytes]) -> _Vocab:
    with _cache_lock:
        hit = _vocab_cache.get(id(pieces))
        if hit is not None and hit[0] is pieces and len(pieces) == hit[1].piece_end.size:
            return hit[1]
    vocab = _Vocab(pieces)
    with _cache_lock:
        if len(_vocab_cache) > 4:
            _vocab_cache.clear()
        _vocab_cache[id(pieces)] = (pieces, vocab)
    return vocab
