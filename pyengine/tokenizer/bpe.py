"""Byte-level BPE (tokenizer.ggml.model = gpt2, and Gemma 4's raw-UTF-8 variant).

The text is split into words by the vocabulary's pre-tokenizer; each word's UTF-8
bytes are mapped to printable characters (GPT-2's byte-to-unicode table) and merged
pairwise, always the pair of lowest merge rank first (leftmost on ties), as
llama.cpp does. Words repeat a lot, so their ids are cached.
"""

from __future__ import annotations

import heapq
import operator

import numpy as np

from pyengine.errors import TokenizerError
from pyengine.tokenizer import native
from pyengine.tokenizer.pretokenizers import split_words
from pyengine.tokenizer.vocab import ESCAPED_SPACE, Vocab
from pyengine.tokenizer.wordcache import WordCache

# The pure-Python merge loop costs ~3 us and ~100 bytes per character of a word; past
# this a word (a run of letters, spaces, ...) is refused rather than eating gigabytes.
PURE_MAX_WORD = 1_000_000


def check_pure_length(word: str) -> None:
    if len(word) > PURE_MAX_WORD:
        raise TokenizerError(
            f"a single word of {len(word)} characters (no spaces or punctuation to split it) "
            f"is more than the pure-Python tokenizer takes ({PURE_MAX_WORD}); the native core "
            "(pyengine._core) tokenizes it")


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


# GPT-2 characters back to latin-1 ones; other characters become one that latin-1
# cannot encode, so that byte_decode_strict rejects text that is no byte sequence.
_GPT2_TO_LATIN1 = {**{ord(ch): chr(b) for b, ch in enumerate(BYTE_TO_CHAR)},
                   **{c: "\uffff" for c in range(256) if chr(c) not in CHAR_TO_BYTE}}


def byte_encode(word: str) -> str:
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_GPT2)


def byte_decode_strict(text: str) -> bytes | None:
    """The bytes a GPT-2-mapped text stands for; None if it has other characters."""
    try:
        return text.translate(_GPT2_TO_LATIN1).encode("latin-1")
    except UnicodeEncodeError:
        return None


class BPEEncoder:
    """Encodes raw text fragments (special tokens already cut out) to ids."""

    def __init__(self, vocab: Vocab) -> None:
        assert vocab.pre is not None
        self._token_to_id = vocab.token_to_id
        self._merges = vocab.merges
        self._rank_table: dict[tuple[str, str], int] | None = None
        self._splitters = vocab.pre.splitters()
        self._byte_encode = vocab.pre.byte_encode
        self._ignore_merges = vocab.flags.ignore_merges
        self._newline_words_whole = vocab.pre.name == "gemma4"
        self._words = WordCache(self._encode_word)
        self._native_fragments = None
        self._native = self._native_encoder(vocab) if native.available() else None

    def _ranks(self) -> dict[tuple[str, str], int]:
        """Merge pair -> rank, built on first use (the native path does not need it)."""
        if self._rank_table is None:
            self._rank_table = {pair: rank for rank, pair in enumerate(merge_pairs(self._merges))}
        return self._rank_table

    def _native_encoder(self, vocab: Vocab):
        byte_level = self._byte_encode
        get = self._token_to_id.get
        if byte_level:
            fallback = [get(chr(b), -1) if 0x21 <= b <= 0x7E else -1 for b in range(256)]
        else:
            fallback = [get(f"<0x{b:02X}>", -1) for b in range(256)]
        flags = ((native.BYTE_LEVEL if byte_level else 0)
                 | (native.IGNORE_MERGES if self._ignore_merges else 0)
                 | (native.NEWLINES_WHOLE if self._newline_words_whole else 0))
        splitter = native.splitter_kind(vocab.pre)
        encoder = native.bpe_encoder(
            vocab, merge_pairs(vocab.merges), byte_decode_strict if byte_level else _utf8, fallback,
            BYTE_TO_CHAR if byte_level else None, flags, splitter)
        if splitter != native.SPLIT_NONE:
            self.encode = encoder.encode  # splitting and merging both in C
            self._native_fragments = encoder.encode_fragments
        return encoder

    def encode_fragments(self, fragments: list[str | int], escape_spaces: bool) -> list[int]:
        """Raw text and special token ids to ids (spaces become ▁ when escape_spaces)."""
        if self._native_fragments is not None and not escape_spaces:
            return self._native_fragments(fragments)
        out: list[int] = []
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
            else:
                out += self.encode(fragment.replace(" ", ESCAPED_SPACE) if escape_spaces else fragment)
        return out

    def encode(self, text: str) -> list[int]:
        if self._native is not None:  # Python splits, C merges
            words = split_words(text, self._splitters)
            lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
            return self._native.encode_words(text, lengths)
        return self._words.encode_all(split_words(text, self._splitters))

    def _encode_word(self, word: str) -> list[int]:
        check_pure_length(word)
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
        ranks = self._ranks()
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


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def merge_pairs(merges: list[str]) -> list[tuple[str, str]]:
    """(left, right) of every merge in rank order, the first of duplicates kept.

    "left right": the first space after the first character separates them (a left
    side may be a space itself); an entry without one can never match (llama.cpp
    reads it as an empty pair) and is dropped."""
    if any(m[:1] == " " for m in merges):
        parts = map(tuple, map(_split_after_first, merges))
    else:
        parts = map(tuple, map(_split_at_space, merges))
    return [p for p in dict.fromkeys(parts) if len(p) == 2 and p[0] and p[1]]


_split_at_space = operator.methodcaller("split", " ", 1)


def _split_after_first(merge: str) -> list[str]:
    pos = merge.find(" ", 1)
    return [merge[:pos], merge[pos + 1:]] if pos >= 0 else [merge]
