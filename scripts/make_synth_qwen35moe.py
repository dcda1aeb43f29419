"""Make the synthetic Qwen3.5-MoE model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/qwen35moe-q8_0.gguf: `general.architecture = qwen35moe`, the
  layers of the synthetic Qwen3.5 (scripts/make_synth_qwen35.py: three Gated
  DeltaNet layers, then gated attention) with, in place of the dense MLP, 4
  experts of 64 (2 used per token, softmax over the router, renormalised over the
  chosen) and a shared expert of 64 gated by sigmoid(ffn_gate_inp_shexp . x);
  2-D matrices and the expert stacks in Q8_0, the conv kernel, norms and vectors
  (the shared gate among them) in F32;
* tests/data/golden/synth/qwen35moe-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's AVX-512
  build with its extra buffer types off.

    PYTHONPATH=<a folder holding only gguf> <python with llama-cpp-python 0.3.36> scripts/make_synth_qwen35moe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

import make_synth_qwen35 as dense
import synth_common as common

ARCH = "qwen35moe"
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 4, 2, 64, 64
SEED = 353

STD = {**dense.STD, "router": 0.3, "exp": 0.15, "exp_down": 0.1, "shexp_gate": 0.2}


def experts(w: common.RandomWeights, kind: str, n_out: int, n_in: int) -> np.ndarray:
    return np.stack([w.matrix(kind, n_out, n_in) for _ in range(N_EXPERT)])


def tensors(rng: np.random.Generator, n_vocab: int, linear_layer=dense.linear_layer) -> list[tuple[str, np.ndarray]]:
    """linear_layer(w, prefix): a Gated DeltaNet layer's tensors (Qwen3-Next lays them out otherwise)."""
    w = common.RandomWeights(rng, STD)
    out = [("token_embd.weight", w.matrix("token_embd", n_vocab, dense.N_EMBD)),
           ("output_norm.weight", w.norm(dense.N_EMBD)),
           ("output.weight", w.matrix("output", n_vocab, dense.N_EMBD))]
    for i in range(dense.N_LAYER):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", w.norm(dense.N_EMBD)))
        out += linear_layer(w, p) if dense.is_recurrent(i) else dense.attention_layer(w, p)
        out += [(p + "post_attention_norm.weight", w.norm(dense.N_EMBD)),
                (p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, dense.N_EMBD)),
                (p + "ffn_gate_exps.weight", experts(w, "exp", N_FF_EXP, dense.N_EMBD)),
                (p + "ffn_up_exps.weight", experts(w, "exp", N_FF_EXP, dense.N_EMBD)),
                (p + "ffn_down_exps.weight", experts(w, "exp_down", dense.N_EMBD, N_FF_EXP)),
                (p + "ffn_gate_inp_shexp.weight", w.vector("shexp_gate", dense.N_EMBD)),
                (p + "ffn_gate_shexp.weight", w.matrix("ffn_gate", N_FF_SHEXP, dense.N_EMBD)),
                (p + "ffn_up_shexp.weight", w.matrix("ffn_up", N_FF_SHEXP, dense.N_EMBD)),
                (p + "ffn_down_shexp.weight", w.matrix("ffn_down", dense.N_EMBD, N_FF_SHEXP))]
    return out


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """Matrices and expert stacks in Q8_0, except the conv kernel (4 taps a row, under Q8_0's block of 32)."""
    return common.q8_0_matrices_and_stacks(name, data) if "ssm_conv1d" not in name else None


def write_model(path: Path, arch: str = ARCH, *, seed: int = SEED, linear_layer=dense.linear_layer,
                rope_sections: bool = True) -> None:
    """The model as `arch` (Qwen3-Next's script passes its own), its weights from `seed`."""
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, arch, name=f"synthetic-{arch}", n_layer=dense.N_LAYER,
                                n_ctx=dense.CONTEXT_LENGTH, n_embd=dense.N_EMBD, n_ff=N_FF_EXP,
                                n_head=dense.N_HEAD, n_head_kv=dense.N_HEAD_KV)
    writer.add_key_length(dense.HEAD_DIM)
    writer.add_value_length(dense.HEAD_DIM)
    writer.add_layer_norm_rms_eps(dense.EPS)
    writer.add_rope_freq_base(dense.ROPE_BASE)
    writer.add_rope_dimension_count(dense.ROPE_DIMS)
    if rope_sections:
        writer.add_rope_dimension_sections(dense.ROPE_SECTIONS)
    writer.add_uint32(f"{arch}.full_attention_interval", dense.FULL_ATTENTION_INTERVAL)
    writer.add_ssm_conv_kernel(dense.CONV_KERNEL)
    writer.add_ssm_inner_size(dense.D_INNER)
    writer.add_ssm_state_size(dense.HEAD_K_DIM)
    writer.add_ssm_time_step_rank(dense.N_V_HEADS)
    writer.add_ssm_group_count(dense.N_K_HEADS)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_expert_feed_forward_length(N_FF_EXP)
    writer.add_expert_shared_feed_forward_length(N_FF_SHEXP)
    weights = tensors(np.random.default_rng(seed), common.vocab_size(tokenizer), linear_layer)
    common.finish_q8_0_model(writer, tokenizer, weights, quantize_as=quantize_as)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "qwen35moe-q8_0", write_model, dense.record_golden)
