"""The two real models' vocabularies (SmolLM2: BPE `smollm`; Gemma 3: SPM, 262k tokens)
against ids recorded from llama.cpp (tests/data/corpus_golden.json and the golden runs)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from pyengine import store
from pyengine.tokenizer import StreamDecoder, Tokenizer

DATA = Path(__file__).parent / "data"
CORPUS = json.loads((DATA / "corpus_golden.json").read_text(encoding="utf-8"))
MODELS = {  # store name -> (corpus key, golden file)
    "smollm2-135m": ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.json"),
    "gemma3-270m": ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m-q4_k_m.json"),
}


@functools.lru_cache(maxsize=None)
def tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_gguf(store.resolve_model(name, progress=False))


@pytest.mark.parametrize("mode", ["plain", "special"])
@pytest.mark.parametrize("name", list(MODELS))
def test_corpus_matches_llama_cpp(name, mode):
    tok = tokenizer(name)
    expected_all = CORPUS["vocabs"][MODELS[name][0]][mode]
    assert len(expected_all) == len(CORPUS["texts"]) == 200
    failures = []
    for text, expected in zip(CORPUS["texts"], expected_all):
        got = tok.encode(text, add_special=False, parse_special=(mode == "special"))
        if got != expected:
            failures.append((text, expected, got))
    assert not failures, failures[:2]


@pytest.mark.parametrize("name", list(MODELS))
def test_golden_prompts_and_greedy_text(name):
    tok = tokenizer(name)
    golden = json.loads((DATA / "golden" / "real" / MODELS[name][1]).read_text(encoding="utf-8"))
    cases = golden["cases"] if isinstance(golden, dict) and "cases" in golden else golden
    assert cases
    for case in cases:
        prompt = case.get("prompt")
        if prompt is not None:
            assert tok.encode(prompt, add_special=True, parse_special=True) == case["ids"]
        assert tok.decode(case["greedy"]) == case["greedy_text"]


@pytest.mark.parametrize("name", list(MODELS))
def test_corpus_round_trips(name):
    tok = tokenizer(name)
    for text in CORPUS["texts"]:
        for parse_special in (False, True):
            assert tok.decode(tok.encode(text, parse_special=parse_special)) == text


@pytest.mark.parametrize("name", list(MODELS))
def test_every_token_round_trips(name):
    """decode then encode gives the id back wherever the vocabulary allows it.

    Not allowed: tokens whose bytes another token also has (<0x0A> and "\\n") or that
    are no text on their own (byte tokens). A few tokens the merges can never build
    (Gemma's " YYYY") encode to several tokens; those must still decode to the text.
    """
    tok = tokenizer(name)
    pieces = tok.piece_table(special=True)
    counts: dict[bytes, int] = {}
    for piece in pieces:
        counts[piece] = counts.get(piece, 0) + 1
    checked, unreachable = 0, []
    for token_id in range(tok.n_vocab):
        if counts[pieces[token_id]] > 1:
            continue
        try:
            text = pieces[token_id].decode("utf-8")
        except UnicodeDecodeError:
            continue
        ids = tok.encode(text, parse_special=True)
        checked += 1
        if ids != [token_id]:
            assert tok.decode(ids) == text, (token_id, text, ids)
            unreachable.append(token_id)
    assert checked > tok.n_vocab * 0.99
    assert len(unreachable) <= tok.n_vocab // 10_000, [tok.token_text(i) for i in unreachable]


def test_special_ids_and_end_of_generation():
    smol = tokenizer("smollm2-135m")
    assert (smol.bos_id, smol.eos_id, smol.add_bos) == (1, 2, False)
    assert smol.token_text(2) == "<|im_end|>" and smol.is_eog(2) and smol.is_control(2)
    assert smol.eot_id == 2
    assert smol.eog_ids == {0, 2, 4}  # <|endoftext|>, <|im_end|>, <reponame> (FIM repo)
    gemma = tokenizer("gemma3-270m")
    assert (gemma.bos_id, gemma.eos_id, gemma.add_bos, gemma.n_vocab) == (2, 1, True, 262144)
    assert gemma.token_text(106) == "<end_of_turn>" and gemma.eot_id == 106
    assert gemma.eog_ids == {1, 106, 212}  # <eos>, <end_of_turn>, </s>
    assert gemma.encode("Hi", add_special=True)[0] == 2


@pytest.mark.parametrize("name", list(MODELS))
def test_stream_decoder_holds_back_partial_characters(name):
    tok = tokenizer(name)
    text = "emoji 👨‍👩‍👧‍👦 and 中文字符 and ünïcödé"
    ids = tok.encode(text)
    stream = StreamDecoder(tok)
    outputs = [stream.push(i) for i in ids]
    outputs.append(stream.flush())
    assert "".join(outputs) in (text, " " + text)
    assert all("\ufffd" not in piece for piece in outputs)
