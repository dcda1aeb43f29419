"""WordPiece (tokenizer.ggml.model = bert), as llama.cpp runs it.

The text is normalized the BERT way (optional lowercasing and accent stripping,
control characters dropped, punctuation and CJK characters split off as words of
their own), then every word, prefixed with ▁ (GGUF vocabularies mark word starts that
way instead of continuation pieces with ##), is cut greedily into the longest
vocabulary tokens; a word that cannot be cut completely becomes the unknown token.
"""

from __future__ import annotations

import functools
import unicodedata

from pyengine.errors import TokenizerError
from pyengine.tokenizer import native
from pyengine.tokenizer.vocab import ESCAPED_SPACE, Vocab
from pyengine.tokenizer.wordcache import WordCache

WHITESPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                       "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def is_chinese_char(cp: int) -> bool:
    """BERT's CJK ideograph ranges (with the upstream's 0x2B920 lower bound)."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F
            or 0x2B920 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


@functools.lru_cache(maxsize=1 << 16)
def nfd_first(ch: str) -> str:
    """llama.cpp's NFD: a code point becomes the first code point of its decomposition."""
    return unicodedata.normalize("NFD", ch)[0]


@functools.lru_cache(maxsize=1 << 16)
def simple_lower(ch: str) -> str:
    """The one-code-point lowercase mapping of UnicodeData.txt."""
    lower = ch.lower()
    if len(lower) == 1:
        return lower
    return "i" if ch == "\u0130" else ch


@functools.lru_cache(maxsize=1 << 16)
def _char_class(ch: str) -> str:
    """' ' whitespace, 'x' dropped, 'm' accent mark, 'p' split off alone, 'w' word char."""
    if ch in WHITESPACE:
        return " "
    category = unicodedata.category(ch)
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD or category in ("Cc", "Cf", "Co", "Cs"):
        return "x"
    if category[0] == "M":
        return "m"
    if category[0] == "P" or (cp < 0x7F and category[0] == "S") or is_chinese_char(cp):
        return "p"
    return "w"


class _Normalizer(dict):
    """str.translate table of BERT's character rules, filled in as characters appear:
    whitespace -> " ", dropped characters -> None, punctuation / CJK -> " c ",
    anything else -> itself (lowercased and reduced to its NFD base when asked)."""

    def __init__(self, lowercase: bool, strip_accents: bool) -> None:
        super().__init__()
        self._lowercase = lowercase
        self._strip_accents = strip_accents

    def __missing__(self, code: int) -> str | None:
        ch = chr(code)
        if self._strip_accents:
            ch = nfd_first(ch)
        kind = _char_class(ch)
        if kind == " ":
            out = " "
        elif kind == "x" or (kind == "m" and self._strip_accents):
            out = None
        else:
            if self._lowercase:
                ch = simple_lower(ch)
            out = f" {ch} " if kind == "p" else ch
        self[code] = out
        return out



class WPMEncoder:
    def __init__(self, vocab: Vocab) -> None:
        self._token_to_id = vocab.token_to_id
        self._max_len = max(map(len, vocab.tokens)) + 1
        self._unk = vocab.special["unk"]
        self._normalizer = _Normalizer(vocab.flags.lowercase, vocab.flags.strip_accents)
        self._words = WordCache(self._word_or_unk)
        self._native = native.wpm_encoder(vocab) if native.available() else None

    def encode(self, text: str) -> list[int]:
        if self._native is not None:   # same ids, the cutting in C
            return self._native.encode(" ".join(self.words(text)))
        return self._words.encode_all(self.words(text))

    def _word_or_unk(self, word: str) -> list[int]:
        ids = self._word_ids(ESCAPED_SPACE + word)
        if ids is None:
            if self._unk is None:
                raise TokenizerError(f"cannot encode {word!r}: no unknown token")
            ids = [self._unk]
        return ids

    def words(self, text: str) -> list[str]:
        """BERT's basic tokenization: normalized words and single punctuation marks.

        Every whitespace character became " " and every other character str.split()
        would split on (\\x1c-\\x1f) is a control character that was dropped."""
        return text.translate(self._normalizer).split()

    def _word_ids(self, word: str) -> list[int] | None:
        """Longest-first greedy cut; None when some position starts no token."""
        get = self._token_to_id.get
        ids = []
        n = len(word)
        i = 0
        while i < n:
            for j in range(min(n, i + self._max_len), i, -1):
                token_id = get(word[i:j])
                if token_id is not None:
                    ids.append(token_id)
                    i = j
                    break
            else:
                return None
        return ids
