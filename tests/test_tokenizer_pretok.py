"""Pre-tokenizers: fused single patterns split exactly like llama.cpp's stage lists, and
the hand-coded splitters do what llama.cpp's do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_tokenizer_native import fuzz_texts

from pyengine.tokenizer.pretokenizers import (PRE_TOKENIZERS, regex_splitter, split_digit_groups,
                                              split_newline_runs, split_words)

CORPUS = json.loads((Path(__file__).parent / "data" / "corpus_golden.json").read_text("utf-8"))


@pytest.mark.parametrize("name", sorted({n for n, p in PRE_TOKENIZERS.items() if p.fused}))
def test_fused_pattern_equals_its_stages(name):
    spec = PRE_TOKENIZERS[name]
    fused = spec.splitters(fused=True)
    staged = spec.splitters(fused=False)
    assert len(fused) == 1 and len(staged) >= 1
    for text in fuzz_texts(3, 500) + CORPUS["texts"]:
        assert split_words(text, fused) == split_words(text, staged), repr(text)


@pytest.mark.parametrize("name", sorted(PRE_TOKENIZERS))
def test_every_pre_tokenizer_tiles_the_text(name):
    splitters = PRE_TOKENIZERS[name].splitters()
    for text in fuzz_texts(11, 60):
        words = split_words(text, splitters)
        assert "".join(words) == text and all(words)


@pytest.mark.parametrize("name", ["deepseek-llm", "deepseek-coder", "deepseek-v3", "falcon",
                                  "default", "afmoe", "youtu", "viking", "spark2_5"])
def test_joined_stages_split_like_piece_by_piece(name):
    splitters = PRE_TOKENIZERS[name].splitters()
    assert any(getattr(s, "joined", None) for s in splitters)
    for text in fuzz_texts(17, 300) + CORPUS["texts"]:
        assert split_words(text, splitters) == split_words(text, splitters, join=False), repr(text)
    text = "a\uffffb 12\n"  # holds the separator: split piece by piece
    assert split_words(text, splitters) == split_words(text, splitters, join=False)


def test_gaps_between_matches_are_words():
    split = regex_splitter(r"\p{N}+")
    assert split("ab12cd3") == ["ab", "12", "cd", "3"]
    assert regex_splitter(r"\s+\Z")("x  \n") == ["x", "  \n"]  # llama.cpp's "$": end of piece
    assert regex_splitter(r"(?=(?:[0-9]{3})+(?![0-9]))")("1234567") == ["1", "234", "567"]


def test_digit_groups_like_llama_cpp():
    # the text before a run of digits stays glued to its first group
    assert split_digit_groups("ab12345 x 1234") == ["ab12", "345", " x 1", "234"]
    assert split_digit_groups("123456") == ["123", "456"]
    assert split_digit_groups("no digits") == ["no digits"]
    assert split_newline_runs("a\n\nb c\n") == ["a", "\n\n", "b c", "\n"]


def test_contractions_and_whitespace_runs():
    gpt2 = PRE_TOKENIZERS["gpt-2"].splitters()
    assert split_words("I'll  go\n\nnow ", gpt2) == ["I", "'ll", " ", " go", "\n", "\n", "now", " "]
    llama3 = PRE_TOKENIZERS["llama3"].splitters()
    assert split_words("I'LL  go\n\n 12345", llama3) == ["I", "'LL", " ", " go", "\n\n", " ", "123", "45"]
