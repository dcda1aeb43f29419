"""Unigram (tokenizer.ggml.model = t5), as llama.cpp runs it.

The text is first normalized with SentencePiece's precompiled character map (a
double-array trie of byte sequences and their replacements), spaces become ▁ (and
runs of them one ▁ when remove_extra_whitespaces is set); then a Viterbi pass picks
the segmentation whose token scores sum highest, code points that start no token
taking the unknown token at a penalty. Everything works on UTF-8 bytes, as in
llama.cpp, so odd inputs fall apart the same way.
"""

from __future__ import annotations

import re

import numpy as np

from pyengine.errors import TokenizerError
from pyengine.tokenizer import native
from pyengine.tokenizer.vocab import Attr, Vocab

_SPACE = 0x20
_UTF8_LEN = bytes([1] * 12 + [2, 2, 3, 4])  # by the lead byte's high nibble
_UNKNOWN_PENALTY = 10.0


class CharsMap:
    """SentencePiece's precompiled_charsmap: XOR-compressed double array + replacements."""

    def __init__(self, blob: bytes) -> None:
        size = int.from_bytes(blob[:4], "little")
        self._nodes = np.frombuffer(blob, dtype="<u4", count=size // 4, offset=4).tolist()
        self._replacements = blob[4 + size:]

    def first_bytes(self) -> set[int]:
        """Bytes some mapped sequence starts with (the root's children)."""
        if not self._nodes:
            return set()
        root = self._nodes[0]
        base = (root >> 10) << ((root & (1 << 9)) >> 6)
        found = set()
        for c in range(1, 256):
            index = base ^ c
            if index < len(self._nodes) and self._nodes[index] & ((1 << 31) | 0xFF) == c:
                found.add(c)
        return found

    def _node(self, index: int) -> int:
        if index >= len(self._nodes):
            raise TokenizerError("corrupt precompiled_charsmap: index past the double array")
        return self._nodes[index]

    def longest_match(self, data: bytes, start: int) -> tuple[int, bytes]:
        """(length of the longest mapped prefix of data[start:], its replacement)."""
        node = self._node(0)
        index = (node >> 10) << ((node & (1 << 9)) >> 6)
        best_len, best_offset = 0, 0
        for pos in range(start, len(data)):
            c = data[pos]
            if c == 0:
                break
            index ^= c
            node = self._node(index)
            if node & ((1 << 31) | 0xFF) != c:
                break
            is_leaf = (node >> 8) & 1
            index ^= (node >> 10) << ((node & (1 << 9)) >> 6)
            if is_leaf:
                best_len = pos - start + 1
                best_offset = self._node(index) & ((1 << 31) - 1)
        if best_len == 0:
            return 0, b""
        return best_len, self._replacement(best_offset)

    def _replacement(self, offset: int) -> bytes:
        table = self._replacements
        if offset >= len(table):
            raise TokenizerError("corrupt precompiled_charsmap: replacement offset out of range")
        end = table.find(b"\0", offset)
        if end < 0:
            raise TokenizerError("corrupt precompiled_charsmap: unterminated replacement")
        return table[offset:end]


class _ByteTrie:
    """llama.cpp's naive_trie for user-defined tokens: its longest *walk*, which may
    stop inside a token (the normalizer then passes those bytes through unchanged)."""

    def __init__(self, keys: list[bytes]) -> None:
        self._root: dict = {}
        for key in keys:
            node = self._root
            for b in key:
                node = node.setdefault(b, {})

    def longest_walk(self, data: bytes, start: int) -> int:
        node, pos = self._root, start
        while pos < len(data):
            node = node.get(data[pos])
            if node is None:
                break
            pos += 1
        return pos - start


class UGMEncoder:
    def __init__(self, vocab: Vocab) -> None:
        attrs = vocab.attrs
        matchable = Attr.NORMAL | Attr.USER_DEFINED | Attr.UNUSED
        self._ids = {tok.encode("utf-8", "surrogateescape"): i
                     for i, tok in enumerate(vocab.tokens) if attrs[i] & matchable}
        # Token lengths by their first 4 bytes: the candidates at a position, instead of
        # every length up to the longest token (a trie's job, done with dicts).
        lengths: dict[bytes, set[int]] = {}
        for key in self._ids:
            if len(key) > 3:
                lengths.setdefault(key[:4], set()).add(len(key))
        self._long_lengths = {k: tuple(sorted(v)) for k, v in lengths.items()}
        normal_scores = [s for s, a in zip(vocab.scores, attrs) if a & Attr.NORMAL]
        min_score = min(normal_scores) if normal_scores else float(np.finfo(np.float32).max)
        self._unknown_score = float(np.float32(min_score - _UNKNOWN_PENALTY))
        self._scores = [0.0 if a & Attr.USER_DEFINED else s for s, a in zip(vocab.scores, attrs)]
        self._unk = vocab.special["unk"]
        user = [vocab.tokens[i].encode("utf-8", "surrogateescape")
                for i, a in enumerate(attrs) if a & Attr.USER_DEFINED]
        self._user_trie = _ByteTrie(user)
        self._charsmap = CharsMap(vocab.precompiled_charsmap) if vocab.precompiled_charsmap else None
        special_first = {u[0] for u in user if u}
        if self._charsmap is not None:
            special_first |= self._charsmap.first_bytes()
        self._unchanged = _unchanged_run_pattern(special_first)
        flags = vocab.flags
        self._space = "\u2581".encode() if flags.escape_whitespaces else b" "
        self._prepend = flags.add_space_prefix and not flags.treat_whitespace_as_suffix
        self._append = flags.add_space_prefix and flags.treat_whitespace_as_suffix
        self._merge_spaces = flags.remove_extra_whitespaces
        if native.available():
            kinds = [native.UGM_USER_DEFINED if a & Attr.USER_DEFINED else
                     native.UGM_NORMAL if a & (Attr.NORMAL | Attr.UNUSED) else native.UGM_NONE
                     for a in attrs]
            switches = ((native.UGM_ESCAPE_SPACES if flags.escape_whitespaces else 0)
                        | (native.UGM_PREPEND_SPACE if self._prepend else 0)
                        | (native.UGM_APPEND_SPACE if self._append else 0)
                        | (native.UGM_MERGE_SPACES if self._merge_spaces else 0))
            self.encode = native.ugm_encoder(vocab, kinds, self._unknown_score, switches).encode

    def encode(self, text: str) -> list[int]:
        normalized = self.normalize(text.encode("utf-8"))
        return self._viterbi(normalized) if normalized else []

    # -- normalization ------------------------------------------------------------------

    def normalize(self, data: bytes) -> bytes:
        """The character map applied, then spaces escaped (llama.cpp's normalize)."""
        pieces = []
        unchanged = self._unchanged.match
        pos = 0
        while pos < len(data):
            run = unchanged(data, pos)  # characters no mapping or user token starts with
            if run is not None:
                pieces.append(run.group())
                pos = run.end()
                continue
            piece, consumed = self._normalize_prefix(data, pos)
            pieces.append(piece)
            pos += consumed
        return self._place_spaces(b"".join(pieces))

    def _place_spaces(self, raw: bytes) -> bytes:
        """Spaces become ▁ (or runs of them one ▁ before each word when merging); the
        first word gets one more in front when a space prefix is asked for."""
        space = self._space
        if self._merge_spaces:
            out = b"".join(space + word for word in raw.split(b" ") if word)
        else:
            out = raw.replace(b" ", space)
            lead = len(raw) - len(raw.lstrip(b" "))
            if self._prepend and lead < len(raw):
                cut = lead * len(space)
                out = out[:cut] + space + out[cut:]
        return out + space if self._append else out

    def _normalize_prefix(self, data: bytes, pos: int) -> tuple[bytes, int]:
        walked = self._user_trie.longest_walk(data, pos)
        if walked:
            return data[pos:pos + walked], walked
        if self._charsmap is not None:
            length, replacement = self._charsmap.longest_match(data, pos)
            if length:
                return replacement, length
        n = _utf8_char_len(data, pos)
        if n:
            return data[pos:pos + n], n
        return "\ufffd".encode(), 1

    # -- segmentation -------------------------------------------------------------------

    def _viterbi(self, data: bytes) -> list[int]:
        n = len(data)
        unk = self._unk
        best_score = [float("-inf")] * (n + 1)
        best_score[0] = 0.0
        best_id = [unk] * (n + 1)
        best_from = [0] * (n + 1)
        get, scores, long_lengths = self._ids.get, self._scores, self._long_lengths.get
        pos = 0
        while pos < n:
            char_len = min(_UTF8_LEN[data[pos] >> 4], n - pos)
            here = best_score[pos]
            whole_char = False
            for length in (1, 2, 3, *long_lengths(data[pos:pos + 4], ())):
                if length > n - pos:
                    break
                token_id = get(data[pos:pos + length])
                if token_id is None:
                    continue
                whole_char = whole_char or length == char_len
                score = here + scores[token_id]
                end = pos + length
                if score > best_score[end]:
                    best_score[end], best_id[end], best_from[end] = score, token_id, pos
            if not whole_char:
                if unk is None:
                    raise TokenizerError("this Unigram vocabulary has no unknown token")
                score = here + self._unknown_score
                end = pos + char_len
                if score > best_score[end]:
                    best_score[end], best_id[end], best_from[end] = score, unk, pos
            pos += char_len
        ids = []
        prev_unknown = False
        pos = n
        while True:  # backwards; runs of unknown tokens collapse into one
            token_id = best_id[pos]
            is_unknown = token_id == unk
            if not (prev_unknown and is_unknown):
                ids.append(token_id)
            if best_from[pos] == 0:
                break
            prev_unknown = is_unknown
            pos = best_from[pos]
        ids.reverse()
        return ids


def _unchanged_run_pattern(special_first: set[int]) -> re.Pattern:
    """Runs of whole UTF-8 characters whose first byte starts no mapping and no user
    token: the normalizer copies them as they are."""
    def byte_class(bytes_: range) -> bytes:
        return b"".join(re.escape(bytes([b])) for b in bytes_ if b not in special_first)

    ascii_ = byte_class(range(0x00, 0x80))
    two, three, four = byte_class(range(0xC2, 0xE0)), byte_class(range(0xE0, 0xF0)), \
        byte_class(range(0xF0, 0xF5))
    tail = rb"[\x80-\xbf]"
    alternatives = [rb"[" + cls + rb"]" + tail * k for cls, k in
                    ((ascii_, 0), (two, 1), (three, 2), (four, 3)) if cls]
    if not alternatives:
        return re.compile(rb"(?!)")
    return re.compile(rb"(?:" + rb"|".join(alternatives) + rb")+")


def _utf8_char_len(data: bytes, pos: int) -> int:
    """Length of the valid UTF-8 character at pos (llama.cpp's lenient check), else 0."""
    lead = data[pos]
    if lead < 0x80:
        return 1
    if lead & 0x40 == 0:
        return 0
    need = 2 if lead & 0x20 == 0 else 3 if lead & 0x10 == 0 else 4 if lead & 0x08 == 0 else 0
    if need == 0 or pos + need > len(data):
        return 0
    if any(data[pos + k] & 0xC0 != 0x80 for k in range(1, need)):
        return 0
    return need
