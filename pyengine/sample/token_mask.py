"""Which vocabulary tokens a grammar matcher accepts next, without matching each from scratch.

All token pieces advance together, one byte position per round: each round looks up the
(state, byte) pairs that occur among the surviving pieces -- a few hundred distinct pairs,
whatever the vocabulary size -- and moves every piece with numpy. Pieces that share a
prefix share its work through the automaton's transition cache, like walking a trie.
Masks are cached per grammar state, because generation keeps revisiting the same states
(inside a string, between array items, ...).
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

from pyengine.errors import InvalidOptionError
from pyengine.sample.automaton import DEAD
from pyengine.sample.grammar import GrammarMatcher

_MASK_CACHE_SIZE = 64
_INDEX_CACHE_SIZE = 4


class TokenIndex:
    """The pieces of one vocabulary as flat byte arrays, plus a per-state mask cache."""

    _cache: OrderedDict[tuple, "TokenIndex"] = OrderedDict()
    _lock = threading.Lock()

    def __init__(self, pieces: Sequence[bytes], eog_ids: Iterable[int] = ()) -> None:
        if any(not isinstance(p, (bytes, bytearray)) for p in pieces):
            raise InvalidOptionError("token_pieces must be bytes (each token's UTF-8 text, raw bytes for byte tokens)")
        self.pieces = pieces
        self.n_vocab = len(pieces)
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=self.n_vocab)
        matchable = lengths > 0
        eog = np.fromiter(eog_ids, dtype=np.int64)
        matchable[eog[(eog >= 0) & (eog < self.n_vocab)]] = False
        # Tokens a grammar may accept by their text, longest first: at byte position d the
        # tokens still going are a prefix of `ids`, and columns[d] holds their d-th bytes
        # contiguously, so each round reads memory in order.
        ids = np.flatnonzero(matchable)
        ids = ids[np.argsort(-lengths[ids], kind="stable")]
        self.ids = ids.astype(np.int64)
        self.neg_lengths = -lengths[ids]          # ascending, for searchsorted
        self.columns = _byte_columns([pieces[i] for i in ids.tolist()], int(lengths[ids[0]]) if ids.size else 0)
        self.matchable = matchable                # bool [n_vocab]
        # first two bytes per token (256 = "no such byte") for the two-byte pre-filter
        self.first_bytes = np.zeros(self.n_vocab, dtype=np.int64)
        self.second_bytes = np.full(self.n_vocab, 256, dtype=np.int64)
        if ids.size:
            self.first_bytes[ids] = self.columns[0]
        if len(self.columns) > 1:
            self.second_bytes[ids[: self.columns[1].shape[0]]] = self.columns[1]
        self._pairs: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._masks: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._by_text: tuple[list[bytes], np.ndarray, dict[bytes, int]] | None = None

    @classmethod
    def for_pieces(cls, pieces: Sequence[bytes], eog_ids: Iterable[int] = ()) -> "TokenIndex":
        """The index of a vocabulary, built once per pieces object and reused."""
        eog_key = tuple(sorted(eog_ids))
        key = (id(pieces), len(pieces), eog_key)
        with cls._lock:
            index = cls._cache.get(key)
            if index is not None and index.pieces is pieces:
                cls._cache.move_to_end(key)
                return index
        index = cls(pieces, eog_key)
        with cls._lock:
            cls._cache[key] = index
            while len(cls._cache) > _INDEX_CACHE_SIZE:
                cls._cache.popitem(last=False)
        return index

    def __deepcopy__(self, memo: dict) -> "TokenIndex":
        return self

    def token_of(self, text: bytes) -> int | None:
        """The (lowest) matchable token whose piece is exactly `text`, or None."""
        return self._text_order()[2].get(text)

    def tokens_starting_with(self, prefix: bytes) -> np.ndarray:
        """Matchable tokens whose piece starts with `prefix`, in the pieces' byte order."""
        texts, ids, _ = self._text_order()
        low = bisect.bisect_left(texts, prefix)
        stripped = prefix.rstrip(b"\xff")
        if not stripped:   # every piece from `low` on starts with 0xff bytes
            return ids[low:] if prefix else ids
        above = stripped[:-1] + bytes([stripped[-1] + 1])   # the first text after all that start with prefix
        return ids[low:bisect.bisect_left(texts, above, lo=low)]

    def _text_order(self) -> tuple[list[bytes], np.ndarray, dict[bytes, int]]:
        """The matchable pieces sorted by their bytes, their ids, and piece -> lowest id
        (built on first use: only grammars that force text need them)."""
        if self._by_text is None:
            ids = np.flatnonzero(self.matchable)
            order = sorted(ids.tolist(), key=lambda i: (self.pieces[i], i))
            texts = [bytes(self.pieces[i]) for i in order]
            first: dict[bytes, int] = {}
            for text, i in zip(texts, order):
                first.setdefault(text, i)
            self._by_text = (texts, np.asarray(order, dtype=np.int64), first)
        return self._by_text

    def allowed_mask(self, matcher: GrammarMatcher) -> np.ndarray:
        """bool [n_vocab]: tokens (EOG excluded) whose whole piece the grammar accepts next."""
        automaton = matcher.grammar.automaton
        automaton.compact_if_large()
        state = matcher.state_id()
        key = (automaton.uid, automaton.generation, state)
        with self._cache_lock:
            mask = self._masks.get(key)
            if mask is not None:
                self._masks.move_to_end(key)
                return mask
        mask = self._compute(automaton, state)
        mask.flags.writeable = False
        with self._cache_lock:
            self._masks[key] = mask
            while len(self._masks) > _MASK_CACHE_SIZE:
                self._masks.popitem(last=False)
        return mask

    def prefix_ok(self, matcher: GrammarMatcher) -> np.ndarray:
        """bool [n_vocab]: matchable tokens whose first two bytes may come next (a cheap
        pre-filter: survivors still need a full check)."""
        automaton = matcher.grammar.automaton
        state = matcher.state_id()
        key = (automaton.uid, automaton.generation, state)
        with self._cache_lock:
            pairs = self._pairs.get(key)
        if pairs is None:
            pairs = self._pair_table(automaton, state)
            with self._cache_lock:
                self._pairs[key] = pairs
                while len(self._pairs) > _MASK_CACHE_SIZE:
                    self._pairs.popitem(last=False)
        return self.matchable & pairs[self.first_bytes, self.second_bytes]

    @staticmethod
    def _pair_table(automaton, state: int) -> np.ndarray:
        """table[b0, b1]: b0 then b1 may come next; column 256 = b0 alone may come next."""
        table = np.zeros((256, 257), dtype=bool)
        first = automaton.next_bytes[state]
        for byte in range(256):
            if (first >> byte) & 1:
                following = automaton.next_bytes[automaton.step(state, byte)]
                table[byte, :256] = _bits(following)
                table[byte, 256] = True
        return table

    def _compute(self, automaton, start_state: int) -> np.ndarray:
        mask = np.zeros(self.n_vocab, dtype=bool)
        ids, neg_lengths = self.ids, self.neg_lengths
        rows = None           # positions into the full arrays once dead pieces were dropped
        # slot per piece: 0 = dead, s >= 1 = states[s - 1] (slots are renumbered every round)
        slots = np.ones(ids.shape[0], dtype=np.int32)
        states = [start_state]
        step = automaton.step
        depth = 0
        going = ids.shape[0]
        while going:
            column = self.columns[depth]
            data = column[:going] if rows is None else column[rows[:going]]
            keys = slots[:going] * 256 + data
            table = np.zeros((len(states) + 1) * 256, dtype=np.int32)
            next_states: list[int] = []
            slot_of: dict[int, int] = {}
            counts = np.bincount(keys, minlength=table.shape[0])
            present = np.flatnonzero(counts[256:]) + 256
            survivors = 0
            for key, count in zip(present.tolist(), counts[present].tolist()):
                following = step(states[(key >> 8) - 1], key & 255)
                if following == DEAD:
                    continue
                survivors += count
                slot = slot_of.get(following)
                if slot is None:
                    slot = slot_of[following] = len(next_states) + 1
                    next_states.append(following)
                table[key] = slot
            moved = table[keys]
            still = int(np.searchsorted(neg_lengths, -(depth + 1), side="left"))  # pieces longer than depth+1
            ending = moved[still:going] > 0
            ended = ids[still:going][ending]
            mask[ended] = True
            depth += 1
            going = still
            survivors -= ended.shape[0]
            if not survivors or not going:
                break
            if survivors * 2 < going:
                # most pieces died: drop them so later rounds touch fewer bytes
                kept = np.flatnonzero(moved[:going])
                rows = kept if rows is None else rows[kept]
                ids, neg_lengths, slots = ids[kept], neg_lengths[kept], moved[kept]
                going = ids.shape[0]
            else:
                slots = moved
            states = next_states
        return mask


def _bits(mask: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(mask.to_bytes(32, "little"), dtype=np.uint8), bitorder="little").astype(bool)


def _byte_columns(pieces: list[bytes], longest: int) -> list[np.ndarray]:
    """columns[d][i] = byte d of pieces[i], for the pieces longer than d (sorted longest first)."""
    if not pieces:
        return []
    flat = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    starts = np.cumsum(lengths) - lengths
    columns = []
    for depth in range(longest):
        count = int(np.count_nonzero(lengths > depth))
        columns.append(flat[starts[:count] + depth])
    return columns
