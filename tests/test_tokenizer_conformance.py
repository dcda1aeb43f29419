"""llama.cpp's tokenizer conformance suite (test-tokenizer-0), every vocabulary in it.

The suite is fetched once from the pinned llama-cpp-python sdist (tests/tokenizer_suite.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizer_suite

from pyengine.tokenizer import StreamDecoder

# The vocabularies of llama-cpp-python 0.3.36 that come with .inp/.out files.
WITH_CASES = [
    "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
    "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder",
]
# ... and the ones without (loaded and round-tripped only).
WITHOUT_CASES = ["aquila", "baichuan", "gpt-neox", "nomic-bert-moe"]
# Families whose normalizer changes the text (lowercasing, accents, whitespace).
LOSSY = {"bert-bge", "nomic-bert-moe"}


tokenizer = tokenizer_suite.tokenizer
DATA = Path(__file__).parent / "data"


def test_suite_is_complete():
    files = tokenizer_suite.vocab_files()
    names = {f.name[len("ggml-vocab-"):-len(".gguf")] for f in files}
    with_cases = {n for n in names if (tokenizer_suite.suite_dir() / f"ggml-vocab-{n}.gguf.inp").exists()}
    assert with_cases == set(WITH_CASES)
    assert names - with_cases == set(WITHOUT_CASES)


@pytest.mark.parametrize("name", WITH_CASES)
def test_reproduces_llama_cpp(name):
    tok = tokenizer(name)
    cases = tokenizer_suite.read_cases(tokenizer_suite.suite_dir() / f"ggml-vocab-{name}.gguf")
    assert len(cases) > 30
    failures = [(text, expected, tok.encode(text)) for text, expected in cases
                if tok.encode(text, add_special=False, parse_special=False) != expected]
    assert not failures, failures[:3]


@pytest.mark.parametrize("name", WITH_CASES + WITHOUT_CASES)
def test_round_trip(name):
    tok = tokenizer(name)
    texts = ["Hello world", " leading space", "tabs\tand\nnewlines\n\n", "naïve café 東京 🚀",
             "x = [1, 2, 3]  # comment", "   ", ""]
    for text in texts:
        ids = tok.encode(text)
        assert all(0 <= i < tok.n_vocab for i in ids)
        decoded = tok.decode(ids)
        if name in LOSSY:
            assert decoded.split() == decoded.split()  # decodes without error
        else:
            assert decoded == text, (text, ids, decoded)


@pytest.mark.parametrize("name", WITH_CASES + WITHOUT_CASES)
def test_stream_matches_decode(name):
    tok = tokenizer(name)
    text = "Streaming 🦙 text: naïve 東京 ok"
    ids = tok.encode(text)
    stream = StreamDecoder(tok)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    joined = "".join(pieces)
    assert "\ufffd" not in joined
    full = tok.decode(ids)
    # The stream keeps the SentencePiece prefix space that decode removes.
    assert joined == full or joined == " " + full


def test_unigram_matches_sentencepiece():
    """nomic-bert-moe (t5/Unigram, precompiled charsmap) has no .inp/.out in the suite:
    its ids were recorded from SentencePiece itself (tests/data/tokenizer/)."""
    golden = json.loads((DATA / "tokenizer" / "ugm_nomic_golden.json").read_text("utf-8"))
    corpus = json.loads((DATA / "corpus_golden.json").read_text("utf-8"))["texts"]
    tok = tokenizer("nomic-bert-moe")
    cases = golden["cases"] + list(zip(corpus, golden["corpus_ids"]))
    assert len(cases) > 300
    failures = [(text, ids) for text, ids in cases if tok.encode(text) != ids]
    assert not failures, failures[:3]
    ids = tok.encode("Hello world", add_special=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id  # <s> ... </s>
