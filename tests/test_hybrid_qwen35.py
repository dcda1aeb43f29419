"""The synthetic Qwen3.5, Qwen3.5-MoE and Qwen3-Next (Gated DeltaNet layers beside gated attention,
scripts/make_synth_qwen35.py, make_synth_qwen35moe.py, make_synth_qwen3next.py) through the engine: a
follow-up turn resumes from the recurrent state's checkpoint at the end of the first turn and computes only
its new tokens, with the tokens a cold run of the whole conversation gives; four sequences decoding
together give the tokens each gives alone.  Qwen3-Next's file layouts: the converter's first one (a
fused ssm_in) equals the split one, trailing multi-token-prediction blocks are left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_support import drive, never_eog
from gguf import GGUFReader, GGUFValueType
from model_parity import load, rewrite, run_case

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


def fused_ssm_in(path: Path) -> dict[str, tuple[np.ndarray, object]]:
    """The first converter's ssm_in of each linear layer of the Qwen3-Next file `path`: its
    attn_qkv and attn_gate rows (Q8_0, each row its own blocks) regrouped per q/k head as
    q, k, v, z."""
    reader = GGUFReader(path)
    rows = {t.name: t for t in reader.tensors}
    dk, n_k, n_v = 16, 2, 4                                     # make_synth_qwen35's linear layers
    group_v = dk * n_v // n_k
    fused = {}
    for i in range(3):
        qkv, gate = rows[f"blk.{i}.attn_qkv.weight"], rows[f"blk.{i}.attn_gate.weight"]
        q, k, v = qkv.data[:n_k * dk], qkv.data[n_k * dk:2 * n_k * dk], qkv.data[2 * n_k * dk:]
        groups = [np.concatenate([q[g * dk:(g + 1) * dk], k[g * dk:(g + 1) * dk], v[g * group_v:(g + 1) * group_v],
                                  gate.data[g * group_v:(g + 1) * group_v]]) for g in range(n_k)]
        fused[f"blk.{i}.ssm_in.weight"] = (np.concatenate(groups), qkv.tensor_type)
    return fused


def test_qwen3next_with_the_fused_ssm_in_equals_the_split_layout(tmp_path):
    """The converter's first Qwen3-Next layout (q, k, v and z in one ssm_in per linear
    layer, grouped per q/k head) gives the bits of the same weights in attn_qkv and
    attn_gate."""
    split = SYNTH / "qwen3next-q8_0.gguf"
    drop = tuple(f"blk.{i}.attn_{n}.weight" for i in range(3) for n in ("qkv", "gate"))
    fused = load(rewrite(tmp_path, "qwen3next-q8_0", drop=drop, add=fused_ssm_in(split)))
    assert fused.layers[0].linear.ssm_in is not None and fused.layers[0].linear.attn_qkv is None
    ids = tokens(5, 45)
    want = run_case(load(split), Backend(2), ids, 1).logits
    assert np.array_equal(run_case(fused, Backend(2), ids, 1).logits, want)


def test_qwen3next_leaves_the_nextn_blocks_out(tmp_path):
    """nextn_predict_layers 1: the last block is the multi-token-prediction head, bound
    by no layer and in no cache row."""
    path = rewrite(tmp_path, "qwen3next-q8_0", meta={"qwen3next.nextn_predict_layers": (1, GGUFValueType.UINT32)})
    model = load(path)
    assert (model.cfg.n_layer, model.cfg.n_nextn, len(model.layers)) == (3, 1, 3)
    assert len(model.cache_layout()) == 3
