"""Pre-tokenizers for byte-level BPE vocabularies, keyed by ``tokenizer.ggml.pre``.

A pre-tokenizer is a list of splitters applied in order, as llama.cpp does it: the
first splits the text into pieces; each following one splits every piece again.
A regex splitter keeps both its matches and the unmatched text between them (a
gap becomes a piece of its own). The patterns are llama.cpp's, which it runs with
std::regex over a text where every non-ASCII code point is collapsed to its
Unicode category; the `regex` package's ``\\p{..}`` classes and ``\\s`` give the same
answers on the original text (``\\s`` is the White_Space set in both), so the
patterns are llama.cpp's, except that ``$`` is written ``\\Z`` (ECMAScript has no
"before a final newline"), ``\\d`` is written ``[0-9]`` (ASCII in std::regex), groups
are non-capturing, and ``\\p{Lu}``-style classes are read as ``\\p{L}`` (the collapsed
text cannot tell letter cases apart). Splitters llama.cpp hand-codes are functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import regex

from pyengine.errors import TokenizerError

Splitter = Callable[[str], list[str]]

# --------------------------------------------------------------------------------------
# Patterns (llama.cpp's, see the module docstring)
# --------------------------------------------------------------------------------------

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
JAIS2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)"
         r"|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}")
_UPPER_THEN_LOWER = r"(?:(?=[\p{L}])[^a-z])*(?:(?=[\p{L}])[^A-Z])+"
_UPPER_RUN = r"(?:(?=[\p{L}])[^a-z])+(?:(?=[\p{L}])[^A-Z])*"
TEKKEN = (r"[^\r\n\p{L}\p{N}]?" + _UPPER_THEN_LOWER + r"|[^\r\n\p{L}\p{N}]?" + _UPPER_RUN
          + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (r"[^\r\n\p{L}\p{N}]?" + _UPPER_THEN_LOWER + _CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?"
         + _UPPER_RUN + _CONTRACTIONS + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
GRANITE_EMB_MULTI = GPT4O.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])")
_CASED_WORDS = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                + _CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
                r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
TINY_AYA = _CASED_WORDS + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
YOUTU = _CASED_WORDS + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
YOUTU_CJK = ("[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a"
             "\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+"
             "|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+")
DEEPSEEK3 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"
             r"[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPARK2_5 = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"
            r"[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+")
CJK_KANA = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
DEEPSEEK_LLM_LETTERS = (
    r"\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    r"\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    r"\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    r"\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    r"\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    r"\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    r"\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    r"\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    r"\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    r"\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    r"\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    r"\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    r"\U000118a0-\U000118df\U0001e900-\U0001e943]+")
DEEPSEEK_LLM_PUNCT = r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
AFMOE_CJK = ("[\u4e00-\u9fff\u3400-\u4dbf\u8c48-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f"
             "\u2f00-\u2fdf\u0e40-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f"
             "\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+")
BLOOM = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
CHAMELEON = ("<sentinel:[0-9]+>", "IMGIMG(?:A|B|C|D|E|F|G|H|I){1,4}Z", r"(?:[\t\n]|    |  )",
             r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2)
EXAONE_MOE = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+")
MINICPM5 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BAILINGMOE = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")

# Single patterns that split exactly as a stage list does, so that one findall does the
# work (tests/test_tokenizer_pretok.py checks each against its stages).
# GPT-2's pattern leaves gaps only of one whitespace character before a non-space (a
# longer run would match \s+(?!\S) up to its last character), so "|\s" closes them.
GPT2_FUSED = GPT2 + r"|\s"
# Digits first split off one by one, then GPT-2's pattern inside the rest: the same as
# GPT-2's pattern with digits alone and a digit ending a run of spaces like the end of text.
DIGITS_GPT2_FUSED = (r"\p{N}|'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+"
                     r"|\s+(?![^\s\p{N}])|\s")


# --------------------------------------------------------------------------------------
# Splitters
# --------------------------------------------------------------------------------------


def _llama_regex(pattern: str) -> str:
    """llama.cpp matches \\p{Lu} & co. on a text collapsed to categories: any letter."""
    return regex.sub(r"\\p\{L[ultmo]\}", r"\\p{L}", pattern)


def regex_splitter(pattern: str) -> Splitter:
    """Split one piece into matches and the gaps between them, in order."""
    compiled = regex.compile(_llama_regex(pattern))
    if compiled.groups:  # findall would return groups instead of matches
        raise ValueError(f"pre-tokenizer pattern has capturing groups: {pattern!r}")
    findall, finditer = compiled.findall, compiled.finditer

    def split(piece: str) -> list[str]:
        words = findall(piece)
        if not words:
            return [piece]  # no match: the whole piece is one gap
        if sum(map(len, words)) == len(piece) and "" not in words:
            return words  # the matches tile the piece: no gaps (the common case)
        pieces, last = [], 0
        for match in finditer(piece):
            start, end = match.span()
            if start > last:
                pieces.append(piece[last:start])
            if end > start:
                pieces.append(piece[start:end])
            last = max(last, end)
        if last < len(piece):
            pieces.append(piece[last:])
        return pieces

    split.pattern = compiled.pattern  # type: ignore[attr-defined]
    if pattern in _JOINABLE:
        joined = compiled.pattern.replace(r"\Z", rf"(?={_SEPARATOR}|\Z)")
        split.joined = regex.compile(f"({joined})")  # type: ignore[attr-defined]
    return split


# Pieces can be split all at once, joined by a separator, with the patterns below: they
# are made of character classes none of which holds U+FFFF (a non-character: no letter,
# number, punctuation, symbol or space), so no match can cross or touch a separator,
# and they look neither ahead nor behind (their \Z, the end of a piece, becomes "before
# a separator or the end"). Texts that hold U+FFFF themselves are split piece by piece.
_SEPARATOR = "\uffff"


def split_digit_groups(piece: str) -> list[str]:
    """llama.cpp's AFMoE / tiny-aya digit splitter: runs of digits in groups of three,
    the odd one or two first; the text before a run stays glued to its first group."""
    pieces: list[str] = []
    prev = pos = 0
    n = len(piece)
    while pos < n:
        if not _is_number(piece[pos]):
            pos += 1
            continue
        start = pos
        while pos < n and _is_number(piece[pos]):
            pos += 1
        count = pos - start
        cut = start + count % 3
        if cut > start:
            pieces.append(piece[prev:cut])
            prev = cut
        while cut < pos:
            cut += 3
            pieces.append(piece[prev:cut])
            prev = cut
    if prev < n:
        pieces.append(piece[prev:])
    return pieces


_NUMBER = regex.compile(r"\p{N}")


def _is_number(ch: str) -> bool:
    return _NUMBER.match(ch) is not None


def split_newline_runs(piece: str) -> list[str]:
    """Runs of newlines and runs of everything else (llama.cpp's ``[^\\n]+|[\\n]+``)."""
    return [m.group() for m in _NEWLINE_RUNS.finditer(piece)]


_NEWLINE_RUNS = regex.compile(r"[^\n]+|\n+")


_JOINABLE = frozenset({
    "[\r\n]", DEEPSEEK_LLM_LETTERS, DEEPSEEK_LLM_PUNCT, r"\s+\Z", CJK_HANGUL, CJK_KANA, AFMOE_CJK,
    YOUTU_CJK, r"\p{N}+", r"\p{N}", r"\p{N}{1,3}", r"\s?\p{L}+", r"\s?\p{P}+", "[0-9][0-9][0-9]",
    r"[\p{P}\$\+<=>\^~\|]+", r"[\p{P}\$\+<=>\^~\|`]+",
})


def _split_joined(pieces: list[str], joined: regex.Pattern) -> list[str]:
    """One split over all pieces at once (see _JOINABLE): matches, and the gaps between
    them cut at the separators."""
    parts = joined.split(_SEPARATOR.join(pieces))
    out: list[str] = []
    for i, part in enumerate(parts):
        if i & 1:
            out.append(part)
        elif _SEPARATOR in part:
            out += [gap for gap in part.split(_SEPARATOR) if gap]
        elif part:
            out.append(part)
    return out


# --------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp pre-tokenizes (and flags) one family of BPE vocabularies."""

    name: str
    patterns: tuple[str | Splitter, ...]
    clean_spaces: bool = True        # clean_up_tokenization_spaces on decode (llama.cpp)
    ignore_merges: bool = False      # a word that is a token is taken whole
    add_bos: bool = False            # llama.cpp turns add_bos on (metadata may turn it off)
    add_sep: bool = False
    no_bos: bool = False             # the vocabulary's BOS id is dropped
    byte_encode: bool = True         # GPT-2 byte-to-unicode mapping of every word
    escape_whitespaces: bool = False  # spaces become ▁ before splitting (SPM-style BPE)
    lowercase: bool = True
    fused: str | None = None         # one pattern equivalent to all of `patterns`

    def splitters(self, fused: bool = True) -> list[Splitter]:
        if fused and self.fused is not None:
            return [regex_splitter(self.fused)]
        return [p if callable(p) else regex_splitter(p) for p in self.patterns]


def _pre(name: str, *patterns: str | Splitter, fused: str | None = None,
         **flags: bool) -> PreTokenizer:
    return PreTokenizer(name, tuple(patterns), fused=fused, **flags)


_NO_CLEAN = {"clean_spaces": False}

# Canonical types (llama.cpp's LLAMA_VOCAB_PRE_TYPE_*) ...
_TYPES: dict[str, PreTokenizer] = {
    "default": _pre("default", *DEFAULT),
    "llama3": _pre("llama3", LLAMA3, ignore_merges=True, add_bos=True),
    "dbrx": _pre("dbrx", LLAMA3),
    "jais-2": _pre("jais-2", JAIS2),
    "deepseek-llm": _pre("deepseek-llm", "[\r\n]", DEEPSEEK_LLM_LETTERS, DEEPSEEK_LLM_PUNCT,
                         r"\s+\Z", CJK_HANGUL, r"\p{N}+", **_NO_CLEAN),
    "deepseek-v3": _pre("deepseek-v3", r"\p{N}{1,3}", CJK_KANA, DEEPSEEK3, **_NO_CLEAN),
    "spark2_5": _pre("spark2_5", r"\p{N}{1,3}", CJK_KANA, SPARK2_5, r"\p{N}", **_NO_CLEAN),
    "youtu": _pre("youtu", YOUTU_CJK, YOUTU, ignore_merges=True, **_NO_CLEAN),
    "deepseek-coder": _pre("deepseek-coder", "[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", CJK_HANGUL,
                           r"\p{N}", **_NO_CLEAN),
    "falcon": _pre("falcon", r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"),
    "starcoder": _pre("starcoder", r"\p{N}", GPT2, fused=DIGITS_GPT2_FUSED),
    "gpt-2": _pre("gpt-2", GPT2, fused=GPT2_FUSED),
    "qwen2": _pre("qwen2", QWEN2, **_NO_CLEAN),
    "qwen35": _pre("qwen35", QWEN35, **_NO_CLEAN),
    "bloom": _pre("bloom", BLOOM),
    "viking": _pre("viking", BLOOM, r"\p{N}", **_NO_CLEAN),
    "chatglm-bpe": _pre("chatglm-bpe", LLAMA3, no_bos=True),
    "tekken": _pre("tekken", TEKKEN, ignore_merges=True, add_bos=True, **_NO_CLEAN),
    "chameleon": _pre("chameleon", *CHAMELEON, add_bos=True, **_NO_CLEAN),
    "gpt-4o": _pre("gpt-4o", GPT4O, **_NO_CLEAN),
    "granite-embed-multi-97m": _pre("granite-embed-multi-97m", GRANITE_EMB_MULTI,
                                    ignore_merges=True, **_NO_CLEAN),
    "tiny_aya": _pre("tiny_aya", split_digit_groups, TINY_AYA, **_NO_CLEAN),
    "superbpe": _pre("superbpe", r"\p{N}+", r"(?=(?:[0-9]{3})+(?![0-9]))", **_NO_CLEAN),
    "bailingmoe": _pre("bailingmoe", BAILINGMOE, **_NO_CLEAN),
    "seed-coder": _pre("seed-coder", SEED_CODER, **_NO_CLEAN),
    "ufakzeka": _pre("ufakzeka", UFAKZEKA, **_NO_CLEAN),
    "afmoe": _pre("afmoe", split_digit_groups, AFMOE_CJK, DEEPSEEK3, **_NO_CLEAN),
    "laguna": _pre("laguna", split_newline_runs, QWEN2, **_NO_CLEAN),
    "exaone-moe": _pre("exaone-moe", EXAONE_MOE),
    "gemma4": _pre("gemma4", split_newline_runs, byte_encode=False, escape_whitespaces=True),
    "sarvam-moe": _pre("sarvam-moe", split_newline_runs, byte_encode=False,
                       escape_whitespaces=True, **_NO_CLEAN),
    "minicpm5": _pre("minicpm5", r"\p{N}{1,3}", MINICPM5, ignore_merges=True),
}


def _variant(base: str, name: str, **flags: bool) -> PreTokenizer:
    """`base`'s splitting under another name, with its own flags."""
    spec = _TYPES[base]
    fields = {**{k: getattr(spec, k) for k in ("clean_spaces", "ignore_merges", "add_bos",
                                                "add_sep", "no_bos", "byte_encode",
                                                "escape_whitespaces", "lowercase", "fused")},
              **flags}
    return PreTokenizer(name, spec.patterns, **fields)


# ... and every tokenizer.ggml.pre value llama.cpp accepts, mapped onto them.
_ALIASES: dict[str, PreTokenizer] = {
    **{name: _TYPES["llama3"] for name in ("llama3", "llama-v3", "llama-bpe", "falcon3",
                                             "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                                             "jina-v5-nano")},
    "smaug-bpe": _TYPES["dbrx"],
    **{name: _TYPES["gpt-2"] for name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat",
                                            "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
                                            "modern-bert", "exaone4", "mpt", "olmo", "jais")},
    **{name: _variant("gpt-2", name, add_sep=True)
       for name in ("jina-v1-en", "jina-v2-code", "roberta-bpe")},
    **{name: _variant("gpt-2", name, clean_spaces=False)
       for name in ("trillion", "granite-docling")},
    **{name: _variant("starcoder", name) for name in ("refact", "codeshell", "exaone",
                                                       "minerva-7b", "mellum2")},
    **{name: _variant("starcoder", name, clean_spaces=False) for name in ("command-r", "smollm")},
    **{name: _TYPES["qwen2"] for name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2",
                                            "hunyuan", "solar-open", "grok-2")},
    **{name: _variant("qwen2", name, clean_spaces=True) for name in ("megrez", "stablelm2")},
    **{name: _TYPES["deepseek-v3"] for name in ("deepseek-v3", "hunyuan-dense", "joyai-llm",
                                                  "hy_v4")},
    "poro-chat": _variant("bloom", "poro-chat", clean_spaces=False),
    "gpt3-finnish": _TYPES["bloom"],
    "glm4": _variant("chatglm-bpe", "glm4", ignore_merges=True),
    "glm5": _variant("chatglm-bpe", "glm5", ignore_merges=True),
    **{name: _TYPES["gpt-4o"] for name in ("gpt-4o", "llama4", "kanana2", "talkie",
                                             "minimax-m2")},
    "cohere2moe": _TYPES["tiny_aya"],
    "bailingmoe2": _TYPES["bailingmoe"],
    "llada-moe": _TYPES["bailingmoe"],
    "granite-embed-multi-311m": _TYPES["gemma4"],
}

PRE_TOKENIZERS: dict[str, PreTokenizer] = {**_TYPES, **_ALIASES}


def pre_tokenizer_for(name: str) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value; TokenizerError when unknown."""
    spec = PRE_TOKENIZERS.get(name)
    if spec is None:
        raise TokenizerError(
            f"unknown tokenizer.ggml.pre {name!r}: this BPE vocabulary's pre-tokenizer is not "
            f"supported (known: {', '.join(sorted(PRE_TOKENIZERS))})")
    return spec


def split_words(text: str, splitters: Sequence[Splitter], join: bool = True) -> list[str]:
    """Apply the splitters in order; each splits every piece the previous one made
    (join=False: one call per piece even where all pieces could go at once)."""
    pieces = [text]
    can_join = join and _SEPARATOR not in text
    for split in splitters:
        joined = getattr(split, "joined", None)
        if joined is not None and can_join and len(pieces) > 1:
            pieces = _split_joined(pieces, joined)
            continue
        out: list[str] = []
        for piece in pieces:
            if len(piece) == 1:
                out.append(piece)  # one character splits into itself, whatever the pattern
            else:
                out += split(piece)
        pieces = out
    return pieces
