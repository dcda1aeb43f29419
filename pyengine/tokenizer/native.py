"""Bridges to the native inner loops (pyengine._core's TokSPM / TokBPE, csrc/tok).

Everything a native encoder needs is computed here from the Vocab, so the C side only
runs loops. Without the native core (or with PYENGINE_PURE_TOKENIZER=1) the encoders
stay pure Python: same ids, lower speed.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import regex

from pyengine.tokenizer.pretokenizers import (DIGITS_GPT2_FUSED, GPT2_FUSED, LLAMA3, QWEN2,
                                              QWEN35, PreTokenizer)
from pyengine.tokenizer.vocab import Vocab


def _core_module():
    try:
        from pyengine import _core
    except ImportError:
        return None
    return _core if all(hasattr(_core, name) for name in ("TokSPM", "TokBPE", "TokUGM", "TokWPM")) else None


def available() -> bool:
    """True when the native loops are built and not switched off."""
    return os.environ.get("PYENGINE_PURE_TOKENIZER", "") in ("", "0") and _core_module() is not None


# ---- code point classes -----------------------------------------------------------------

N_CODEPOINTS = 0x110000
CP_LETTER, CP_NUMBER, CP_SPACE, CP_MARK = 1, 2, 4, 8


@functools.lru_cache(maxsize=1)
def codepoint_classes() -> np.ndarray:
    """\\p{L}, \\p{N}, \\s, \\p{M} of every code point, by the same `regex` module the
    Python pre-tokenizers use (so both paths agree on every character)."""
    codepoints = np.arange(N_CODEPOINTS, dtype="<u4")
    codepoints[0xD800:0xE000] = 0   # surrogates are no text; classed 0 below
    # decoded from an array: a join over chr() would hold a million small strings at once
    chars = codepoints.tobytes().decode("utf-32-le")
    classes = np.zeros(N_CODEPOINTS, dtype=np.uint8)
    for bit, pattern in ((CP_LETTER, r"\p{L}+"), (CP_NUMBER, r"\p{N}+"), (CP_SPACE, r"\s+"),
                         (CP_MARK, r"\p{M}+")):
        for match in regex.finditer(pattern, chars):
            classes[match.start():match.end()] |= bit
    classes[0xD800:0xE000] = 0
    classes.flags.writeable = False
    return classes


# ---- SentencePiece ----------------------------------------------------------------------


def token_blob(texts: list[str]) -> tuple[bytes, np.ndarray]:
    """The UTF-8 of all texts back to back, and the offsets (len + 1) into it."""
    encoded = [t.encode("utf-8", "surrogateescape") for t in texts]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return b"".join(encoded), offsets


def spm_encoder(vocab: Vocab, byte_ids: list[int | None], glued: set[str]):
    core = _core_module()
    blob, offsets = token_blob(vocab.tokens)
    scores = np.asarray(vocab.scores, dtype=np.float32)
    bytes_ = np.array([-1 if i is None else i for i in byte_ids], dtype=np.int32)
    glued_cps = np.array(sorted(ord(c) for c in glued), dtype=np.uint32)
    unk = vocab.special["unk"]
    return core.TokSPM(blob, offsets, scores, bytes_, -1 if unk is None else unk, glued_cps)


def wpm_encoder(vocab: Vocab):
    """WordPiece's cutting of normalized words (the normalizer stays in wpm.py)."""
    blob, offsets = token_blob(vocab.tokens)
    unk = vocab.special["unk"]
    return _core_module().TokWPM(blob, offsets, -1 if unk is None else unk)


# ---- BPE ----------------------------------------------------------------------------------

SPLIT_NONE, SPLIT_GPT2, SPLIT_DIGITS_GPT2, SPLIT_LLAMA3, SPLIT_QWEN2, SPLIT_QWEN35 = range(6)
BYTE_LEVEL, IGNORE_MERGES, NEWLINES_WHOLE = 1, 2, 4


def splitter_kind(pre: PreTokenizer) -> int:
    """The built-in C splitter equivalent to this pre-tokenizer, or SPLIT_NONE."""
    single = pre.fused if pre.fused is not None else (
        pre.patterns[0] if len(pre.patterns) == 1 and isinstance(pre.patterns[0], str) else None)
    return {GPT2_FUSED: SPLIT_GPT2, DIGITS_GPT2_FUSED: SPLIT_DIGITS_GPT2, LLAMA3: SPLIT_LLAMA3,
            QWEN2: SPLIT_QWEN2, QWEN35: SPLIT_QWEN35}.get(single, SPLIT_NONE)


def bpe_encoder(vocab: Vocab, pairs: list[tuple[str, str]], to_raw, byte_fallback: list[int],
                byte_symbol_text: list[str] | None, flags: int, splitter: int):
    """A TokBPE over symbol ids: the tokens, then strings that exist only inside merges.

    pairs: the merges in rank order; to_raw(text) -> bytes | None: the bytes a symbol
    text stands for (None: unknown).
    """
    core = _core_module()
    token_to_id = vocab.token_to_id
    n_vocab = vocab.n_vocab
    virtual: dict[str, int] = {}

    def symbols(texts: list[str]) -> list[int]:
        ids = list(map(token_to_id.get, texts))
        for i in [i for i, found in enumerate(ids) if found is None]:  # few, if any
            ids[i] = virtual.setdefault(texts[i], n_vocab + len(virtual))
        return ids

    lefts = [a for a, _ in pairs]
    rights = [b for _, b in pairs]
    merges = np.array([symbols(lefts), symbols(rights), symbols([a + b for a, b in pairs])],
                      dtype=np.int32).T.copy() if pairs else np.zeros((0, 3), dtype=np.int32)
    byte_symbols = np.array([token_to_id.get(t, virtual.get(t, -1)) for t in byte_symbol_text]
                            if byte_symbol_text else [-1] * 256, dtype=np.int32)
    texts = vocab.tokens + list(virtual)
    raw = [to_raw(t) or b"" for t in texts]
    offsets = np.zeros(len(raw) + 1, dtype=np.int64)
    np.cumsum(list(map(len, raw)), out=offsets[1:])
    classes = codepoint_classes() if splitter != SPLIT_NONE else None
    return core.TokBPE(n_vocab, b"".join(raw), offsets, merges, byte_symbols,
                       np.array(byte_fallback, dtype=np.int32), flags, splitter, classes)


# ---- Unigram ------------------------------------------------------------------------------

UGM_ESCAPE_SPACES, UGM_PREPEND_SPACE, UGM_APPEND_SPACE, UGM_MERGE_SPACES = 1, 2, 4, 8
UGM_NONE, UGM_NORMAL, UGM_USER_DEFINED = 0, 1, 2


def ugm_encoder(vocab: Vocab, kinds: list[int], unknown_score: float, flags: int):
    core = _core_module()
    blob, offsets = token_blob(vocab.tokens)
    unk = vocab.special["unk"]
    return core.TokUGM(blob, offsets, np.asarray(vocab.scores, dtype=np.float32),
                       np.array(kinds, dtype=np.uint8), -1 if unk is None else unk,
                       unknown_score, vocab.precompiled_charsmap, flags)
