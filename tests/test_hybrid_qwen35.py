"""The synthetic Qwen3.5, Qwen3.5-MoE and Qwen3-Next (Gated DeltaNet layers beside gated attention,
scripts/make_synth_qwen35.py, make_synth_qwen35moe.py, make_synth_qwen3next.py) through the engine: a
follow-up turn resumes from the recurrent state's checkpoint at the end of the first turn and computes only
its new tokens, with the tokens a cold run of the whole conversation gives; four sequences decoding
together give the tokens each gives alone.  Qwen3-Next's file layouts: the converter's first one is
refused by name, trailing multi-token-prediction blocks are left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_support import drive, never_eog
from gguf import GGUFValueType
from model_parity import load, rewrite

from pyengine.errors import UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Backend
from pyengine.models import load_model
from pyengine.runner.engine import Engine
from pyengine.tokenizer import Tokenizer

SYNTH = Path(__file__).parent / "data" / "synth"


@pytest.fixture(scope="module", params=["qwen35-q8_0", "qwen35moe-q8_0", "qwen3next-q8_0"])
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


def test_qwen3next_with_the_fused_ssm_in_is_refused_by_name(tmp_path):
    """The converter's first Qwen3-Next layout (q, k, v and z in one ssm_in per linear
    layer) is refused with what to do, not with a missing-tensor error."""
    drop = tuple(f"blk.{i}.attn_{n}.weight" for i in range(3) for n in ("qkv", "gate"))
    fused = {f"blk.{i}.ssm_in.weight": np.zeros((2 * 32 + 2 * 64, 64), np.float32) for i in range(3)}
    with pytest.raises(UnsupportedError, match="convert it again"):
        load(rewrite(tmp_path, "qwen3next-q8_0", drop=drop, add=fused))


def test_qwen3next_leaves_the_nextn_blocks_out(tmp_path):
    """nextn_predict_layers 1: the last block is the multi-token-prediction head, bound
    by no layer and in no cache row."""
    path = rewrite(tmp_path, "qwen3next-q8_0", meta={"qwen3next.nextn_predict_layers": (1, GGUFValueType.UINT32)})
    model = load(path)
    assert (model.cfg.n_layer, model.cfg.n_nextn, len(model.layers)) == (3, 1, 3)
    assert len(model.cache_layout()) == 3
