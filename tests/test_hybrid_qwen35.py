"""The synthetic Qwen3.5 and Qwen3.5-MoE (Gated DeltaNet layers beside gated attention,
scripts/make_synth_qwen35.py, make_synth_qwen35moe.py) through the engine: a follow-up turn resumes from the
recurrent state's checkpoint at the end of the first turn and computes only its new
tokens, with the tokens a cold run of the whole conversation gives; four sequences
decoding together give the tokens each gives alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_support import drive, never_eog

from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.runner.engine import Engine
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"


@pytest.fixture(scope="module", params=["qwen35-q8_0", "qwen35moe-q8_0"])
def parts(request):
    gguf = GGUFFile(SYNTH / f"{request.param}.gguf")
    return load_model(gguf), Tokenizer.from_gguf(gguf)


@pytest.fixture
def engine(parts):
    engine = Engine(parts[0], parts[1], Backend(2), n_ctx=512, n_batch=64, n_parallel=4, background=False)
    yield engine
    engine.close()


def tokens(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 500, n)]


def run(engine: Engine, prompt: list[int], max_tokens: int = 8, **kw):
    handle = engine.submit(prompt, never_eog(engine), max_tokens=max_tokens, **kw)
    drive(engine)
    return handle.result()


def test_a_second_turn_computes_only_its_new_tokens_and_equals_a_cold_run(engine):
    first_turn = tokens(1, 90)                    # past two of the delta rule's 32-token chunks
    reply = run(engine, first_turn)
    second_turn = first_turn + reply.tokens + tokens(2, 11)
    before = engine.prompt_tokens_computed
    follow_up = run(engine, second_turn)
    # the reply's last token was never fed, so it comes with the 11 new ones
    assert engine.prompt_tokens_computed - before == 12
    assert follow_up.cached_tokens == len(second_turn) - 12
    cold = run(engine, second_turn, cache_prompt=False)
    assert follow_up.tokens == cold.tokens


def test_four_concurrent_sequences_give_the_tokens_each_gives_alone(engine):
    prompts = [tokens(10 + i, n) for i, n in enumerate((5, 40, 70, 23))]
    alone = [run(engine, p, max_tokens=12, cache_prompt=False).tokens for p in prompts]
    opts = never_eog(engine)
    steps = engine.steps
    handles = [engine.submit(p, opts, max_tokens=12, cache_prompt=False) for p in prompts]
    drive(engine)
    assert engine.steps - steps <= 14     # the four decode side by side (alone: 12+ steps each)
    together = [h.result().tokens for h in handles]
    assert together == alone
