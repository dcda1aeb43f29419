"""Make the synthetic GLM-4.5 (glm4moe) model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/glm4moe-q8_0.gguf: `general.architecture = glm4moe`, 4
  blocks of which the last is a multi-token-prediction (NextN) block
  (`nextn_predict_layers` 1: its tensors are in the file, llama.cpp never runs
  it), so 3 layers run; layer 0 is dense (`leading_dense_block_count` 1, a
  SiLU-gated MLP of 96), layers 1 and 2 route over 8 experts of hidden size
  32, 2 used per token, with one shared expert (32); n_embd 64, 4 query heads
  of 32 over 2 KV heads, q/k/v biases, q and k heads RMS-normed, NeoX RoPE
  over the first 16 of each head's 32 values (partial RoPE, base 10000);
  sigmoid routing with a selection bias `exp_probs_b` (std 0.3, about the
  spread of the sigmoid scores, so it changes choices), weights renormalised
  (`expert_weights_norm`) and scaled by 2.5 (`expert_weights_scale`, as in the
  released models); the tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens);
  seeded random weights, the matrices and expert stacks in Q8_0 (gguf's
  quantizer), norms and biases in F32;
* tests/data/golden/synth/glm4moe-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (make_iq_synth's recorder), from
  llama-cpp-python 0.3.36's AVX-512 build with its extra buffer types off.

    python scripts/make_synth_glm4moe.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import ExpertGatingFuncType

import synth_common as common

ARCH = "glm4moe"
N_EMBD, N_BLOCKS, N_NEXTN, N_HEAD, N_HEAD_KV, HEAD_DIM, ROPE_DIMS = 64, 4, 1, 4, 2, 32, 16
N_FF, N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_SHARED, N_DENSE_LEAD = 96, 8, 2, 32, 1, 1
ROUTED_SCALE = 2.5
ROPE_BASE, EPS, CONTEXT_LENGTH = 10000.0, 1e-5, 512
SEED = 4545

STD = {"token_embd": 1.0, "output": 0.12, "attn_q": 0.12, "attn_k": 0.12, "attn_v": 0.12, "attn_output": 0.08,
       "bias_q": 0.2, "bias_k": 0.2, "bias_v": 0.1, "ffn_gate": 0.12, "ffn_up": 0.12, "ffn_down": 0.1,
       "router": 0.2, "probs_b": 0.3, "exp_gate": 0.15, "exp_up": 0.15, "exp_down": 0.1,
       "shexp_gate": 0.15, "shexp_up": 0.15, "shexp_down": 0.1, "eh_proj": 0.1}


def block(w: common.RandomWeights, i: int) -> list[tuple[str, np.ndarray]]:
    p = f"blk.{i}."
    q_dim, kv_dim, n_shexp = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM, N_FF_EXP * N_SHARED
    out = common.attention_tensors(w, p, n_embd=N_EMBD, q_dim=q_dim, kv_dim=kv_dim, biases=True)
    out += [(p + "attn_q_norm.weight", w.norm(HEAD_DIM)),
            (p + "attn_k_norm.weight", w.norm(HEAD_DIM)),
            (p + "post_attention_norm.weight", w.norm(N_EMBD))]
    if i < N_DENSE_LEAD:
        return out + [(p + "ffn_gate.weight", w.matrix("ffn_gate", N_FF, N_EMBD)),
                      (p + "ffn_up.weight", w.matrix("ffn_up", N_FF, N_EMBD)),
                      (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, N_FF))]
    out += [(p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, N_EMBD)),
            (p + "exp_probs_b.bias", w.vector("probs_b", N_EXPERT)),
            (p + "ffn_gate_exps.weight", common.matrix_stack(w, "exp_gate", N_EXPERT, N_FF_EXP, N_EMBD)),
            (p + "ffn_up_exps.weight", common.matrix_stack(w, "exp_up", N_EXPERT, N_FF_EXP, N_EMBD)),
            (p + "ffn_down_exps.weight", common.matrix_stack(w, "exp_down", N_EXPERT, N_EMBD, N_FF_EXP)),
            (p + "ffn_gate_shexp.weight", w.matrix("shexp_gate", n_shexp, N_EMBD)),
            (p + "ffn_up_shexp.weight", w.matrix("shexp_up", n_shexp, N_EMBD)),
            (p + "ffn_down_shexp.weight", w.matrix("shexp_down", N_EMBD, n_shexp))]
    if i >= N_BLOCKS - N_NEXTN:   # the NextN block's own tensors (never run)
        out += [(p + "nextn.eh_proj.weight", w.matrix("eh_proj", N_EMBD, 2 * N_EMBD)),
                (p + "nextn.enorm.weight", w.norm(N_EMBD)),
                (p + "nextn.hnorm.weight", w.norm(N_EMBD)),
                (p + "nextn.shared_head_norm.weight", w.norm(N_EMBD))]
    return out


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order."""
    w = common.RandomWeights(rng, STD)
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i in range(N_BLOCKS):
        out += block(w, i)
    return out


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-glm4moe", n_layer=N_BLOCKS, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(ROPE_DIMS)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_expert_feed_forward_length(N_FF_EXP)
    writer.add_expert_shared_count(N_SHARED)
    writer.add_leading_dense_block_count(N_DENSE_LEAD)
    writer.add_expert_weights_scale(ROUTED_SCALE)
    writer.add_expert_weights_norm(True)
    writer.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    writer.add_nextn_predict_layers(N_NEXTN)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=common.q8_0_matrices_and_stacks)


# AVX-512 build, llama.cpp's extra buffer types off
record_golden = functools.partial(common.record_golden, extra_buffer_types=False)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "glm4moe-q8_0", write_model, record_golden)
