"""Make the synthetic DeepSeek-V3-style model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/deepseek2-q8_0.gguf: `general.architecture = deepseek2`,
  4 layers (layer 0 dense, 1-3 mixtures of experts), n_embd 64, 4 heads;
  Multi-head Latent Attention as current converters write it: a q LoRA of
  rank 32 (attn_q_a, attn_q_a_norm, attn_q_b) to 4 query heads of 32 values
  without position + 32 roped ones, attn_kv_a_mqa to a latent of 64 values
  (attn_kv_a_norm) + 32 roped key values shared by the heads, the split
  attn_k_b [32, 64, 4] and attn_v_b [64, 32, 4] (value heads of 32), so
  key_length 96 / value_length 64 (the absorbed single KV head) and
  key_length_mla 64 / value_length_mla 32; normal (GPT-J) RoPE, base 10000,
  YaRN x4 over an original context of 64 with yarn_log_multiplier 0.0707
  (DeepSeek's 0.1 * mscale_all_dim 0.707), so kq_scale carries mscale^2;
  experts: 8 of hidden size 32 in 4 groups of which 2 are kept, 2 used per
  token, sigmoid gating with an exp_probs_b selection bias, weights
  normalised and scaled by 2.5, one shared expert; the dense layer's MLP has
  hidden size 64; the tokenizer of llama-bpe-q5_1-tied.gguf; seeded random
  weights, 2-D and 3-D matrices (attn_k_b, attn_v_b, the expert stacks) in
  Q8_0 (gguf's quantizer), norms and the bias in F32;
* tests/data/golden/synth/deepseek2-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (make_iq_synth's recorder), from
  llama-cpp-python 0.3.36's AVX-512 build with its extra buffer types off.

llama.cpp decides that a file has no q LoRA (V2-Lite) by its layer count
(26 or 27), so a small V2-Lite-style file cannot be run by it; this one has
the q LoRA.

    python scripts/make_synth_deepseek2.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import ExpertGatingFuncType, RopeScalingType

import synth_common as common

ARCH = "deepseek2"
N_EMBD, N_LAYER, N_HEAD = 64, 4, 4
Q_LORA, KV_LORA, N_NOPE, N_ROPE, V_HEAD = 32, 64, 32, 32, 32
N_FF_DENSE, N_DENSE_LEAD = 64, 1
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_SHARED = 8, 2, 32, 1
N_GROUP, N_GROUP_USED = 4, 2
EXPERT_WEIGHTS_SCALE = 2.5
ROPE_BASE, EPS = 10000.0, 1e-6
YARN_FACTOR, YARN_ORIG_CTX, YARN_LOG_MUL, CONTEXT_LENGTH = 4.0, 64, 0.0707, 512
SEED = 282

STD = {"token_embd": 1.0, "output": 0.12, "q_a": 0.15, "q_b": 0.15, "kv_a": 0.15, "k_b": 0.2, "v_b": 0.15,
       "attn_output": 0.08, "ffn_gate": 0.15, "ffn_up": 0.15, "ffn_down": 0.1,
       "router": 0.3, "exp_bias": 0.3, "exp_gate": 0.2, "exp_up": 0.2, "exp_down": 0.12,
       "sh_gate": 0.15, "sh_up": 0.15, "sh_down": 0.1}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order), in the converter's order."""
    w = common.RandomWeights(rng, STD)
    q_out, o_in = N_HEAD * (N_NOPE + N_ROPE), N_HEAD * V_HEAD
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", w.norm(N_EMBD)),
                (p + "attn_q_a.weight", w.matrix("q_a", Q_LORA, N_EMBD)),
                (p + "attn_q_a_norm.weight", w.norm(Q_LORA)),
                (p + "attn_q_b.weight", w.matrix("q_b", q_out, Q_LORA)),
                (p + "attn_kv_a_mqa.weight", w.matrix("kv_a", KV_LORA + N_ROPE, N_EMBD)),
                (p + "attn_kv_a_norm.weight", w.norm(KV_LORA)),
                (p + "attn_k_b.weight", common.matrix_stack(w, "k_b", N_HEAD, KV_LORA, N_NOPE)),
                (p + "attn_v_b.weight", common.matrix_stack(w, "v_b", N_HEAD, V_HEAD, KV_LORA)),
                (p + "attn_output.weight", w.matrix("attn_output", N_EMBD, o_in)),
                (p + "ffn_norm.weight", w.norm(N_EMBD))]
        if i < N_DENSE_LEAD:
            out += [(p + "ffn_gate.weight", w.matrix("ffn_gate", N_FF_DENSE, N_EMBD)),
                    (p + "ffn_up.weight", w.matrix("ffn_up", N_FF_DENSE, N_EMBD)),
                    (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, N_FF_DENSE))]
            continue
        n_sh = N_FF_EXP * N_SHARED
        out += [(p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, N_EMBD)),
                (p + "exp_probs_b.bias", w.vector("exp_bias", N_EXPERT)),
                (p + "ffn_gate_exps.weight", common.matrix_stack(w, "exp_gate", N_EXPERT, N_FF_EXP, N_EMBD)),
                (p + "ffn_up_exps.weight", common.matrix_stack(w, "exp_up", N_EXPERT, N_FF_EXP, N_EMBD)),
                (p + "ffn_down_exps.weight", common.matrix_stack(w, "exp_down", N_EXPERT, N_EMBD, N_FF_EXP)),
                (p + "ffn_gate_shexp.weight", w.matrix("sh_gate", n_sh, N_EMBD)),
                (p + "ffn_up_shexp.weight", w.matrix("sh_up", n_sh, N_EMBD)),
                (p + "ffn_down_shexp.weight", w.matrix("sh_down", N_EMBD, n_sh))]
    return out


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-deepseek2", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF_DENSE, n_head=N_HEAD, n_head_kv=1)
    writer.add_key_length(KV_LORA + N_ROPE)          # the absorbed form's single KV head
    writer.add_value_length(KV_LORA)
    writer.add_key_length_mla(N_NOPE + N_ROPE)       # the per-head sizes
    writer.add_value_length_mla(V_HEAD)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(N_ROPE)
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(YARN_FACTOR)
    writer.add_rope_scaling_orig_ctx_len(YARN_ORIG_CTX)
    writer.add_rope_scaling_yarn_log_mul(YARN_LOG_MUL)
    writer.add_q_lora_rank(Q_LORA)
    writer.add_kv_lora_rank(KV_LORA)
    writer.add_leading_dense_block_count(N_DENSE_LEAD)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_expert_feed_forward_length(N_FF_EXP)
    writer.add_expert_shared_count(N_SHARED)
    writer.add_expert_weights_scale(EXPERT_WEIGHTS_SCALE)
    writer.add_expert_weights_norm(True)
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    writer.add_expert_group_count(N_GROUP)
    writer.add_expert_group_used_count(N_GROUP_USED)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=common.q8_0_matrices_and_stacks)


# AVX-512 build, llama.cpp's extra buffer types off
record_golden = functools.partial(common.record_golden, extra_buffer_types=False)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "deepseek2-q8_0", write_model, record_golden)
