"""Recurrent and hybrid models (recurrent layers, alone or beside attention) through the engine: a chat's
second turn resumes from the state checkpoint its first turn left and computes only
its new tokens, yet equals a cold run bit for bit; sequences decoding together get
the tokens each gets alone.  The synthetic LFM2 (scripts/make_synth_lfm2.py: short
convolutions beside attention; make_synth_lfm2moe.py: the same with experts) stands
for the hybrids, the synthetic Mamba-2 (scripts/make_synth_mamba2.py) for models
whose every layer scans, the synthetic Granite 4 hybrids (dense, and with experts:
make_synth_granitehybrid_moe.py) and Nemotron-H (dense and MoE) for Mamba-2 layers
beside attention (Nemotron-H's MLP-only layers keep nothing), the synthetic Falcon-H1
for layers that keep both an attention K/V and a Mamba-2 state."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_support import drive, never_eog, random_prompt

from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.runner.engine import Engine
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"
HYBRIDS = ("lfm2-q8_0", "lfm2moe-q8_0", "mamba2-q8_0", "granitehybrid-q8_0", "granitehybrid-moe-q8_0",
           "nemotron_h-q8_0", "nemotron_h_moe-q8_0", "falcon-h1-q8_0")


@pytest.fixture(scope="module", params=HYBRIDS)
def parts(request):
    gguf = GGUFFile(SYNTH / f"{request.param}.gguf")
    return load_model(gguf), Tokenizer.from_gguf(gguf), Backend(2)


def engine(parts, **kw) -> Engine:
    model, tok, backend = parts
    return Engine(model, tok, backend, **{"n_ctx": 256, "n_batch": 32, "n_parallel": 4, "background": False, **kw})


def run(eng: Engine, prompt: list[int], max_tokens: int = 8, **kw):
    handle = eng.submit(prompt, never_eog(eng), max_tokens=max_tokens, **kw)
    drive(eng)
    return handle.result()


def test_a_second_turn_computes_only_its_new_tokens_and_equals_a_cold_run(parts):
    """Turn 1: a 45-token prompt (two chunks of the 32-token batch) and 8 greedy tokens.
    Turn 2 repeats it all and adds 11 new tokens: the engine resumes from a state it
    kept (a checkpoint at or past turn 1's prompt) and feeds the model only the tokens
    past it, and its tokens and logits are those of a cold run, which computes every
    token from the empty state (the sampled tokens' log-probabilities equal)."""
    eng = engine(parts)
    try:
        first_prompt = random_prompt(1, 45)
        first = run(eng, first_prompt)
        follow_up = first_prompt + first.tokens + random_prompt(2, 11)
        before = eng.prompt_tokens_computed
        second = run(eng, follow_up, logprobs=True, top_logprobs=5)
        resumed_from = second.cached_tokens
        assert resumed_from >= len(first_prompt)            # a checkpoint at or past turn 1's prompt
        assert eng.prompt_tokens_computed - before == len(follow_up) - resumed_from
        before = eng.prompt_tokens_computed
        cold = run(eng, follow_up, cache_prompt=False, logprobs=True, top_logprobs=5)
        assert eng.prompt_tokens_computed - before == len(follow_up)
        assert second.tokens == cold.tokens
        assert second.logprobs == cold.logprobs             # the same bits: each a float from the same row
    finally:
        eng.close()


def test_four_sequences_decoding_together_get_the_tokens_each_gets_alone(parts):
    """Four prompts of 9-50 tokens submitted at once (prefilled and decoded in the same
    batches, each with its own state rows) give the greedy tokens of each run alone."""
    prompts = [random_prompt(10 + n, n) for n in (9, 23, 37, 50)]
    eng = engine(parts)
    try:
        alone = [run(eng, p, cache_prompt=False).tokens for p in prompts]
        handles = [eng.submit(p, never_eog(eng), max_tokens=8, cache_prompt=False) for p in prompts]
        steps = eng.steps
        drive(eng)
        together = [h.result().tokens for h in handles]
        assert eng.steps - steps < sum(len(p) for p in prompts) // 32 + 4 * 8   # they did share batches
    finally:
        eng.close()
    assert together == alone
