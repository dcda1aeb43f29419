"""The native inner loops (csrc/tok via pyengine._core) against the pure-Python ones,
which the conformance suites pin to llama.cpp; and inputs only native code can take."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import tokenizer_suite
from tokenizer_vocabs import bpe_metadata, spm_metadata

from pyengine import store
from pyengine.errors import TokenizerError
from pyengine.tokenizer import Tokenizer, native
from pyengine.tokenizer.bpe import PURE_MAX_WORD
from pyengine.tokenizer.pretokenizers import regex_splitter

# Pieces random texts are made of: every class the splitters look at, and their edges.
ATOMS = [
    "the", "The", "HELLO", "naïve", "straße", "Ωμέγα", "кошка", "東京都", "ひらがな", "カタカナ",
    "한국어", "ไทย", "العربية", "e\u0301", "\u0301", "a\u0300\u0301b", "ǅ", "ʰ", "x²", "٣٤",
    "Ⅻ", "12", "1234567", "3.14", "'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'M", "'t",
    "'", "''", " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n ", "\x0b", "\x0c",
    "\x85", "\xa0", "\u2003", "\u2028", "\u3000", "\u200b", "!", "?!", "...", "-", "--", "_",
    "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "@", "#", "$", "%", "^", "&", "*",
    "+", "=", "|", "~", "`", ",", ";", ":", "\"", "▁", "😀", "👨\u200d👩\u200d👧", "🇫🇷",
    "\0", "\x01", "\x7f", "\ufffd", "\U000e0001", "\uf8ff", "\u0378",
]


def fuzz_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 24))) for _ in range(count)]


def test_native_core_has_the_tokenizer_loops():
    from pyengine import _core  # the package's compiled core

    assert hasattr(_core, "TokSPM") and hasattr(_core, "TokBPE"), \
        "pyengine/_core.pyx must `include \"_tok.pxi\"`"
    assert hasattr(_core, "TokUGM") and hasattr(_core, "TokWPM")
    assert native.available()


@pytest.fixture
def pure(monkeypatch):
    """Build tokenizers with the pure-Python loops inside this block."""
    monkeypatch.setenv("PYENGINE_PURE_TOKENIZER", "1")
    assert not native.available()
    return monkeypatch


def both(build) -> tuple[Tokenizer, Tokenizer]:
    """(native, pure) tokenizers from the same builder."""
    assert native.available()
    fast = build()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYENGINE_PURE_TOKENIZER", "1")
        slow = build()
    return fast, slow


@pytest.mark.parametrize("pre", ["gpt-2", "starcoder", "llama-bpe", "qwen2", "qwen35"])
def test_c_splitters_match_the_regexes(pre):
    fast, _ = both(lambda: Tokenizer.from_metadata(bpe_metadata(pre=pre)))
    encoder = fast._encoder._native
    spec = fast.vocab.pre
    split = regex_splitter(spec.fused or spec.patterns[0])
    for text in fuzz_texts(hash(pre) % 1000, 400):
        assert encoder.split(text) == [len(w) for w in split(text)], repr(text)


def suite_pair(name: str) -> tuple[Tokenizer, Tokenizer]:
    """(native, pure): the native one shared with the conformance tests."""
    assert native.available()
    fast = tokenizer_suite.tokenizer(name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYENGINE_PURE_TOKENIZER", "1")
        slow = Tokenizer.from_gguf(tokenizer_suite.suite_dir() / f"ggml-vocab-{name}.gguf")
    return fast, slow


@pytest.mark.parametrize("name", ["gpt-2", "llama-bpe", "qwen35", "gemma-4", "deepseek-llm",
                                  "starcoder", "llama-spm", "phi-3", "nomic-bert-moe", "bert-bge"])
def test_native_matches_pure(name):
    fast, slow = suite_pair(name)
    for parse_special in (False, True):
        for text in fuzz_texts(len(name), 150):
            assert fast.encode(text, parse_special=parse_special) == \
                slow.encode(text, parse_special=parse_special), repr(text)


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_native_matches_pure_on_real_vocabularies(name):
    path = store.resolve_model(name, progress=False)
    fast, slow = both(lambda: Tokenizer.from_gguf(path))
    for text in fuzz_texts(7, 300):
        assert fast.encode(text) == slow.encode(text), repr(text)


@pytest.mark.parametrize("name, char", [("smollm2-135m", "a"), ("gemma3-270m", "a"),
                                        ("smollm2-135m", "中"), ("gemma3-270m", " ")])
def test_ten_megabytes_of_one_character(name, char):
    tok = Tokenizer.from_gguf(store.resolve_model(name, progress=False))
    size = 10_000_000 if char == "a" else 2_000_000
    text = char * size
    start = time.perf_counter()
    ids = tok.encode(text)
    assert time.perf_counter() - start < 60
    assert tok.decode(ids) == text
    assert len(set(ids[: len(ids) // 2])) <= 3  # a run tokenizes into a few repeating ids


def test_pure_python_refuses_giant_words(pure):
    tok = Tokenizer.from_metadata(bpe_metadata())
    start = time.perf_counter()
    with pytest.raises(TokenizerError, match="native core"):
        tok.encode("a" * (PURE_MAX_WORD + 1))
    spm = Tokenizer.from_metadata(spm_metadata())
    with pytest.raises(TokenizerError, match="native core"):
        spm.encode("b" * (PURE_MAX_WORD + 1))
    assert time.perf_counter() - start < 10
    assert spm.decode(spm.encode("ab" * 1000)) == "ab" * 1000  # long, but not giant


def wpm_metadata(with_unknown: bool = True) -> dict:
    """A WordPiece vocabulary: [PAD] [UNK] [CLS] [SEP], word starts (▁) and pieces, with
    multi-byte ones so that cuts must fall on code point boundaries."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁un", "▁unbe", "believ", "able", "▁é", "té", "t",
              "▁中", "文", "▁ab", "c", "▁a", "b", "▁.", "▁!"]
    meta = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": np.array([3, 2, 3, 3] + [1] * (len(tokens) - 4), dtype=np.int32),
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.seperator_token_id": 3,
            "tokenizer.ggml.padding_token_id": 0}
    if with_unknown:
        meta["tokenizer.ggml.unknown_token_id"] = 1
    return meta


def test_native_wordpiece_cuts_as_pure_python():
    """Longest pieces first, on code point boundaries; a word not cut whole is [UNK]."""
    fast, slow = both(lambda: Tokenizer.from_metadata(wpm_metadata()))
    assert fast._encoder._native is not None and slow._encoder._native is None
    texts = ["unbelievable", "unbeable", "Été", "ÉTÉ!", "中文 中", "abc ab a b", "unbelievablex", "x",
             "a.b!c", "", "   ", "中中文"] + fuzz_texts(29, 200)
    for text in texts:
        assert fast.encode(text, add_special=True) == slow.encode(text, add_special=True), repr(text)
    # longest first: "▁unbe" leaves "lievable", which no piece starts, so the word is [UNK]
    # (each CJK character is a word of its own: "▁文" is no token)
    assert fast.encode("unbeable 中文 abc unbelievable") == [5, 7, 11, 1, 13, 14, 1]


def test_native_wordpiece_without_an_unknown_token_refuses_an_unknown_word():
    fast, slow = both(lambda: Tokenizer.from_metadata(wpm_metadata(with_unknown=False)))
    assert fast.encode("ab a") == slow.encode("ab a") == [13, 15]
    for tok in (fast, slow):
        with pytest.raises(TokenizerError):
            tok.encode("zzz")
