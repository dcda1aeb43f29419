"""A memo of piece -> token ids, shared by the pure-Python encoders."""

from __future__ import annotations

from typing import Callable, Iterable

CACHE_LIMIT = 1 << 17  # pieces; the memo is simply emptied when it grows past this


class WordCache:
    """Encodes pieces (words, chunks) with `encode`, remembering each result."""

    def __init__(self, encode: Callable[[str], list[int]], limit: int = CACHE_LIMIT) -> None:
        self._encode = encode
        self._limit = limit
        self._ids: dict[str, list[int]] = {}

    def encode_all(self, pieces: Iterable[str]) -> list[int]:
        """The ids of every piece, concatenated; empty pieces give none."""
        out: list[int] = []
        memo = self._ids
        for piece in pieces:
            ids = memo.get(piece)
            if ids is None:
                ids = self._encode(piece)
                if len(memo) >= self._limit:
                    memo.clear()
                memo[piece] = ids
            out += ids
        return out
