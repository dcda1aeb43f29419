"""SentencePiece-style BPE (tokenizer.ggml.model = llama).

Starting from single characters, the adjacent pair whose concatenation is the
highest-scoring vocabulary token is merged first (leftmost on ties), until no pair
forms a token; characters that never became a token fall back to their UTF-8 bytes
(<0xNN> tokens). That is llama.cpp's algorithm; it runs on the whole fragment, which
for text without spaces is one long sequence.

Two facts make it fast without changing a single id. A merged symbol is always a
vocabulary token, so a symbol can only span a boundary if some token contains the two
characters on either side of it: the text splits into independent chunks at every
``▁`` whose left neighbour never precedes a ``▁`` inside a token (in practice: at
every word). And chunks repeat, so their ids are cached. The merge loop itself is a
heap over pairs, O(n log n) on a chunk of n characters.
"""

from __future__ import annotations

import heapq

import regex

from pyengine.errors import TokenizerError
from pyengine.tokenizer import native
from pyengine.tokenizer.bpe import check_pure_length
from pyengine.tokenizer.vocab import ESCAPED_SPACE, Vocab
from pyengine.tokenizer.wordcache import WordCache



def byte_token_ids(vocab: Vocab) -> list[int | None]:
    """Token of each byte value: <0xNN>, else the one-character token (llama.cpp's order)."""
    get = vocab.token_to_id.get
    ids: list[int | None] = []
    for b in range(256):
        token_id = get(f"<0x{b:02X}>")
        if token_id is None and b < 0x80:
            token_id = get(chr(b))
        ids.append(token_id)
    return ids


def glued_characters(tokens: list[str]) -> set[str]:
    """Characters some vocabulary token has right before a ▁."""
    return {tok[i - 1] for tok in tokens if ESCAPED_SPACE in tok[1:]
            for i in range(1, len(tok)) if tok[i] == ESCAPED_SPACE}


def chunk_pattern(glued: set[str]) -> regex.Pattern:
    """Where an SPM text can be cut into independent chunks: before each ▁ whose left
    neighbour is never followed by ▁ inside a vocabulary token."""
    if not glued:
        return regex.compile(f"(?={ESCAPED_SPACE})")
    chars = "".join(regex.escape(ch) for ch in sorted(glued))
    return regex.compile(f"(?<![{chars}])(?={ESCAPED_SPACE})")


class SPMEncoder:
    """Encodes one ▁-escaped fragment to ids."""

    def __init__(self, vocab: Vocab) -> None:
        self._token_to_id = vocab.token_to_id
        self._scores = vocab.scores
        self._byte_ids = byte_token_ids(vocab)
        self._unk = vocab.special["unk"]
        glued = glued_characters(vocab.tokens)
        self._chunker = chunk_pattern(glued)
        self._chunks = WordCache(self.segment)
        self._native = native.spm_encoder(vocab, self._byte_ids, glued) if native.available() else None
        if self._native is not None:
            self.encode = self._native.encode  # same ids, the loops in C

    def encode_fragments(self, fragments: list[str | int], space_prefix: bool) -> list[int]:
        """Raw text and special token ids to ids, as llama.cpp's SPM tokenize: spaces
        become ▁, and with space_prefix every text that opens the input or follows a
        special token gets one in front."""
        if self._native is not None:
            return self._native.encode_fragments(fragments, space_prefix)
        out: list[int] = []
        after_special = True
        for fragment in fragments:
            if isinstance(fragment, int):
                out.append(fragment)
                after_special = True
                continue
            if space_prefix and after_special:
                fragment = " " + fragment
            out += self.encode(fragment.replace(" ", ESCAPED_SPACE))
            after_special = False
        return out

    def encode(self, text: str) -> list[int]:
        """Ids of one ▁-escaped text."""
        return self._chunks.encode_all(chunk for chunk in self._chunker.split(text) if chunk)

    def segment(self, text: str) -> list[int]:
        """llama.cpp's SPM merge loop on one chunk."""
        check_pure_length(text)
        n = len(text)
        get, scores = self._token_to_id.get, self._scores
        if n == 1:
            token_id = get(text)
            return [token_id] if token_id is not None else self._bytes_of(text)
        length = [1] * n   # a symbol starts at its index and spans length[i] chars (0: merged)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap = []
        for i in range(n - 1):
            token_id = get(text[i:i + 2])
            if token_id is not None:
                heap.append((-scores[token_id], i, i + 1, 2))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # one side was merged into something else since
            length[left] = size
            length[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            before = prv[left]
            if before >= 0:
                token_id = get(text[before:left + size])
                if token_id is not None:
                    push(heap, (-scores[token_id], before, left, length[before] + size))
            if after >= 0:
                token_id = get(text[left:after + length[after]])
                if token_id is not None:
                    push(heap, (-scores[token_id], left, after, size + length[after]))
        ids = []
        i = 0
        while i >= 0:
            piece = text[i:i + length[i]]
            token_id = get(piece)
            if token_id is not None:
                ids.append(token_id)
            else:
                ids += self._bytes_of(piece)
            i = nxt[i]
        return ids

    def _bytes_of(self, piece: str) -> list[int]:
        ids = []
        for b in piece.encode("utf-8"):
            token_id = self._byte_ids[b]
            if token_id is None:
                token_id = self._unk
                if token_id is None:
                    raise TokenizerError(
                        f"cannot encode {piece!r}: the vocabulary has no token for byte "
                        f"0x{b:02X} and no unknown token")
            ids.append(token_id)
        return ids
