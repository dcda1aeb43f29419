"""Byte-level BPE (tokenizer.ggml.model = gpt2, and Gemma 4's raw-UTF-8 variant).

The text is split into words by the vocabulary's pre-tokenizer; each word's UTF-8
bytes are mapped to printable characters (GPT-2's byte-to-unicode table) and merged
pairwise, always the pair of lowest merge rank first (leftmost on ties), as
llama.cpp does. Words repeat a lot, so their ids are cached.
"""

from __future__ import annotations

import heapq

from pyengine.tokenizer.pretokenizers import split_words
from pyengine.tokenizer.vocab import Vocab

_CACHE_LIMIT = 1 << 17  # words; the cache is simply emptied when it grows past this


def _bytes_to_unicode() -> list[str]:
    """GPT-2's table: printable bytes stand for themselves, the rest shift past 255."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    shift = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {ch: b for b, ch in enumerate(BYTE_TO_CHAR)}
# bytes.decode("latin-1") gives one char per byte; this maps those chars to GPT-2's.
_LATIN1_TO_GPT2 = {b: ch for b, ch in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_GPT2)


class BPEEncoder:
    """Encodes raw text fragments (special tokens already cut out) to ids."""

    def __init__(self, vocab: Vocab) -> None:
        assert vocab.pre is not None
        self._token_to_id = vocab.token_to_id
        self._ranks = _merge_ranks(vocab.merges)
        self._splitters = vocab.pre.splitters()
        self._byte_encode = vocab.pre.byte_encode
        self._ignore_merges = vocab.flags.ignore_merges
        self._newline_words_whole = vocab.pre.name == "gemma4"
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for word in split_words(text, self._splitters):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out += ids
        return out

    def _encode_word(self, word: str) -> list[int]:
        symbol_text = byte_encode(word) if self._byte_encode else word
        whole = self._token_to_id.get(symbol_text)
        if whole is not None and (self._ignore_merges or
                                  (self._newline_words_whole and not word.strip("\n"))):
            return [whole]
        return self._ids_of(self.merge(list(symbol_text)))

    def merge(self, symbols: list[str]) -> list[str]:
        """Apply the merges to a word's symbols: lowest rank first, leftmost on ties."""
        n = len(symbols)
        if n < 2:
            return symbols
        ranks = self._ranks
        heap = []
        for i in range(n - 1):
            rank = ranks.get((symbols[i], symbols[i + 1]))
            if rank is not None:
                heap.append((rank, i, symbols[i] + symbols[i + 1]))
        if not heap:
            return symbols
        heapq.heapify(heap)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, merged = pop(heap)
            right = nxt[left]
            # Outdated when either side was merged into something else since.
            if right < 0 or not symbols[left] or symbols[left] + symbols[right] != merged:
                continue
            symbols[left] = merged
            symbols[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                rank = ranks.get((symbols[before], merged))
                if rank is not None:
                    push(heap, (rank, before, symbols[before] + merged))
            if after >= 0:
                rank = ranks.get((merged, symbols[after]))
                if rank is not None:
                    push(heap, (rank, left, merged + symbols[after]))
        return [s for s in symbols if s]

    def _ids_of(self, symbols: list[str]) -> list[int]:
        ids = []
        get = self._token_to_id.get
        for symbol in symbols:
            token_id = get(symbol)
            if token_id is not None:
                ids.append(token_id)
            else:
                ids += self._fallback(symbol)
        return ids

    def _fallback(self, symbol: str) -> list[int]:
        """A symbol that is no token: llama.cpp emits whatever of its bytes are tokens."""
        get = self._token_to_id.get
        ids = []
        for b in symbol.encode("utf-8"):
            token_id = get(chr(b)) if self._byte_encode and b < 0x80 else (
                None if self._byte_encode else get(f"<0x{b:02X}>"))
            if token_id is not None:
                ids.append(token_id)
        return ids


def _merge_ranks(merges: list[str]) -> dict[tuple[str, str], int]:
    """ "left right" -> rank; the first space after the first character separates them."""
    ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(merges):
        pos = merge.find(" ", 1)
        pair = (merge[:pos], merge[pos + 1:]) if pos >= 0 else ("", "")
        ranks.setdefault(pair, rank)
    return ranks
