"""Broken models fail at load with a pyengine error that says what is wrong.

Each case copies a synthetic model (tests/data/synth) with gguf.GGUFWriter,
changing one thing: a hyper-parameter that contradicts the tensors' shapes, a
missing tensor, an absurd or inconsistent hyper-parameter, a key of the
wrong type.  Loading must raise ModelError / UnsupportedError / GGUFError
whose message names the culprit, never crash, hang or allocate per layer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType

from model_parity import DROP, rewrite
from pyengine.errors import GGUFError, ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.models import load_model

U32, I32, F32, STR = GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32, GGUFValueType.STRING


def load(path: Path):
    return load_model(GGUFFile(path))


def test_an_unchanged_copy_loads(tmp_path):
    model = load(rewrite(tmp_path, "qwen3moe-q8_0"))
    assert model.cfg.n_expert == 4 and model.cfg.n_expert_used == 2


def test_head_counts_written_per_layer(tmp_path):
    """Granite 4's converter writes head counts once per layer: equal ones are the
    model's count, unequal ones are refused naming the key."""
    from gguf import GGUFValueType

    same = rewrite(tmp_path, "llama-spm-q4_0", meta={"llama.attention.head_count_kv": ([2, 2], GGUFValueType.ARRAY),
                                                     "llama.attention.head_count": ([4, 4], GGUFValueType.ARRAY)})
    assert load(same).cfg == load(Path(__file__).parent / "data" / "synth" / "llama-spm-q4_0.gguf").cfg
    mixed = rewrite(tmp_path, "llama-spm-q4_0", meta={"llama.attention.head_count_kv": ([2, 1], GGUFValueType.ARRAY)})
    with pytest.raises(UnsupportedError, match=r"head_count_kv differs between layers \(\[1, 2\]\)"):
        load(mixed)


def test_a_block_type_without_kernels(tmp_path):
    """TQ2_0 (ternary) rows take IQ2_XXS's 66 bytes per 256 weights: the same file
    but for that type, which pyengine has no kernels for, fails naming both."""
    from gguf import GGMLQuantizationType

    path = rewrite(tmp_path, "llama-wide-iq2_xxs", retype={"blk.1.ffn_up.weight": GGMLQuantizationType.TQ2_0})
    with pytest.raises(UnsupportedError, match="'blk.1.ffn_up.weight' has block type TQ2_0"):
        load(path)


# ---- shapes that contradict the metadata ------------------------------------

@pytest.mark.parametrize("model, changes, culprit", [
    ("qwen2-q8_0", {"embedding_length": 128}, "token_embd.weight"),
    ("qwen3-q4_1", {"attention.key_length": 16, "attention.value_length": 16, "rope.dimension_count": 16},
     "blk.0.attn_"),
    ("qwen3moe-q8_0", {"expert_count": 8}, "blk.0.ffn_gate_inp.weight"),
    ("qwen3moe-q8_0", {"expert_feed_forward_length": 32}, "blk.0.ffn_gate_exps.weight"),
    ("gemma2-q8_0", {"feed_forward_length": 96}, "blk.0.ffn_gate.weight"),
    ("phi3-q5_0", {"feed_forward_length": 96}, "blk.0.ffn_up.weight"),
    ("phi3-q5_0", {"attention.head_count_kv": 2}, "blk.0.attn_qkv.weight"),
])
def test_shape_contradicting_metadata(tmp_path, model, changes, culprit):
    arch = model.split("-")[0]
    path = rewrite(tmp_path, model, meta={f"{arch}.{k}": (v, U32) for k, v in changes.items()})
    with pytest.raises(ModelError, match="shape") as err:
        load(path)
    assert culprit in str(err.value)


# ---- missing tensors ----------------------------------------------------------

@pytest.mark.parametrize("model, tensor", [
    ("qwen2-q8_0", "blk.1.attn_v.weight"),
    ("qwen3-q4_1", "blk.1.attn_k_norm.weight"),
    ("qwen3moe-q8_0", "blk.1.ffn_down_exps.weight"),
    ("qwen3moe-q8_0", "blk.0.ffn_gate_inp.weight"),
    ("gpt-oss-q8_0", "blk.1.attn_sinks.weight"),
    ("gpt-oss-q8_0", "blk.2.ffn_up_exps.weight"),
    ("gemma2-q8_0", "blk.2.post_ffw_norm.weight"),
    ("gemma2-q8_0", "blk.0.post_attention_norm.weight"),
    ("phi3-q5_0", "blk.0.attn_qkv.weight"),
    ("phi3-q5_0", "output_norm.weight"),
])
def test_missing_tensor(tmp_path, model, tensor):
    path = rewrite(tmp_path, model, drop=(tensor,))
    with pytest.raises(ModelError, match="missing tensor") as err:
        load(path)
    assert tensor in str(err.value)


def test_gemma3_needs_its_window(tmp_path):
    """Gemma 3 has no default window (llama.cpp requires the key too)."""
    path = rewrite(tmp_path, "gemma2-q8_0", arch="gemma3", meta={"gemma3.attention.sliding_window": DROP})
    with pytest.raises(ModelError, match="gemma3.attention.sliding_window"):
        load(path)


def test_gemma3_needs_qk_norms(tmp_path):
    """A Gemma 2 file relabelled Gemma 3 lacks the per-head q/k norms."""
    path = rewrite(tmp_path, "gemma2-q8_0", arch="gemma3")
    with pytest.raises(ModelError, match="blk.0.attn_q_norm.weight"):
        load(path)


# ---- absurd or inconsistent hyper-parameters -----------------------------------

@pytest.mark.parametrize("model, key, value, vtype, words", [
    ("qwen2-q8_0", "qwen2.attention.head_count", 0, U32, "head_count"),
    ("qwen2-q8_0", "qwen2.attention.head_count", 3, U32, "head"),            # 64 % 3: no head size
    ("qwen3-q4_1", "qwen3.attention.head_count", 3, U32, "multiple"),       # 3 heads over 2 kv heads
    ("qwen3-q4_1", "qwen3.attention.head_count_kv", 0, U32, "head_count_kv"),
    ("qwen3-q4_1", "qwen3.attention.key_length", 0, U32, "key_length"),
    ("qwen3-q4_1", "qwen3.block_count", 2 ** 31, U32, "block_count"),
    ("gemma2-q8_0", "gemma2.block_count", 0, U32, "block_count"),
    ("gemma2-q8_0", "gemma2.attention.sliding_window", 0, U32, "sliding_window"),
    ("gemma2-q8_0", "gemma2.attn_logit_softcapping", -1.0, F32, "soft"),
    ("gemma2-q8_0", "gemma2.final_logit_softcapping", float("inf"), F32, "final_logit_softcapping"),
    ("gemma2-q8_0", "gemma2.rope.freq_base", 0.0, F32, "freq_base"),
    ("gemma2-q8_0", "gemma2.attention.layer_norm_rms_epsilon", float("nan"), F32, "epsilon"),
    ("qwen3moe-q8_0", "qwen3moe.expert_used_count", 0, U32, "expert_used_count"),
    ("qwen3moe-q8_0", "qwen3moe.expert_used_count", 5, U32, "expert_used_count"),
    ("qwen3moe-q8_0", "qwen3moe.expert_count", 0, U32, "expert_count"),
    ("qwen3moe-q8_0", "qwen3moe.expert_count", 1 << 30, U32, "expert_count"),
    ("qwen3vlmoe-q8_0", "qwen3vlmoe.n_deepstack_layers", 3, U32, "n_deepstack_layers"),   # 2 layers
    ("qwen3vlmoe-q8_0", "qwen3vlmoe.rope.dimension_sections", [4, 2, 2, 9], GGUFValueType.ARRAY, "dimension_sections"),
    ("gpt-oss-q8_0", "gpt-oss.expert_used_count", 5, U32, "expert_used_count"),
    ("phi3-q5_0", "phi3.rope.dimension_count", 17, U32, "dimension_count"),
    ("phi3-q5_0", "phi3.rope.scaling.attn_factor", -1.0, F32, "attn_factor"),
    ("phi3-q5_0", "phi3.context_length", 0, U32, "context_length"),
])
def test_absurd_hyper_parameter(tmp_path, model, key, value, vtype, words):
    path = rewrite(tmp_path, model, meta={key: (value, vtype)})
    with pytest.raises(ModelError, match=words):
        load(path)


def test_negative_head_count(tmp_path):
    path = rewrite(tmp_path, "qwen2-q8_0", meta={"qwen2.attention.head_count": (-4, I32)})
    with pytest.raises(ModelError, match="head_count"):
        load(path)


def test_value_head_size_unlike_key_head_size(tmp_path):
    path = rewrite(tmp_path, "qwen3-q4_1", meta={"qwen3.attention.value_length": (16, U32)})
    with pytest.raises(UnsupportedError, match="value head size"):
        load(path)


@pytest.mark.parametrize("model, key", [
    ("qwen3moe-q8_0", "qwen3moe.expert_used_count"),
    ("qwen3vlmoe-q8_0", "qwen3vlmoe.rope.dimension_sections"),
    ("qwen2-q8_0", "qwen2.block_count"),
])
def test_key_of_the_wrong_type(tmp_path, model, key):
    path = rewrite(tmp_path, model, meta={key: ("two", STR)})
    with pytest.raises(GGUFError, match=key.replace(".", r"\.")):
        load(path)


@pytest.mark.parametrize("model, key", [
    ("qwen2-q8_0", "qwen2.block_count"),
    ("qwen3moe-q8_0", "qwen3moe.expert_count"),
    ("qwen3moe-q8_0", "qwen3moe.expert_used_count"),
    ("gpt-oss-q8_0", "gpt-oss.attention.sliding_window"),
    ("gpt-oss-q8_0", "gpt-oss.attention.layer_norm_rms_epsilon"),
])
def test_missing_required_key(tmp_path, model, key):
    path = rewrite(tmp_path, model, meta={key: DROP})
    with pytest.raises((ModelError, GGUFError), match=key.split(".", 1)[1]):
        load(path)
