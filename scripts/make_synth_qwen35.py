"""Make the synthetic Qwen3.5 (dense) model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/qwen35-q8_0.gguf: `general.architecture = qwen35`, 4 layers
  with a full_attention_interval of 4 (layers 0-2 Gated DeltaNet, layer 3
  gated attention), n_embd 64; attention: 4 query heads of 32 over 2 KV heads,
  each query head followed by its gate in attn_q, per-head q/k RMS norms,
  NeoX RoPE over 16 of the 32 dims (partial, as Qwen3.5's 64 of 256), base
  10000, rope sections 3/3/2/0 (M-RoPE's, one position for text); linear
  layers: 2 q/k heads of 16 (ssm.group_count, ssm.state_size), 4 value heads
  of 16 (ssm.time_step_rank, ssm.inner_size 64: two value heads per q/k head,
  as Qwen3.5's 32 over 16), a conv kernel of 4, ssm_a = -exp(A_log) with
  A_log around 0 (decays exp(g) of 0.3-0.9 a token, so that leaving the
  decay out shows), dt biases, ssm_norm; a SwiGLU MLP of 128; the tokenizer of
  llama-bpe-q5_1-tied.gguf; seeded random weights, 2-D matrices in Q8_0
  (gguf's quantizer), the conv kernel (4 taps a row), norms and vectors in F32;
* tests/data/golden/synth/qwen35-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (make_iq_synth's recorder), from
  llama-cpp-python 0.3.36's AVX-512 build with its extra buffer types off.

    PYTHONPATH=<a folder holding only gguf> <python with llama-cpp-python 0.3.36> scripts/make_synth_qwen35.py
    python scripts/make_synth_qwen35.py --no-golden      (the model alone)
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

import synth_common as common

ARCH = "qwen35"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 4, 2, 32, 128
ROPE_DIMS, ROPE_SECTIONS, ROPE_BASE, EPS = 16, [3, 3, 2, 0], 10000.0, 1e-6
FULL_ATTENTION_INTERVAL = 4
CONV_KERNEL, HEAD_K_DIM, N_K_HEADS, N_V_HEADS = 4, 16, 2, 4
D_INNER = N_V_HEADS * HEAD_K_DIM
CONV_CHANNELS = 2 * N_K_HEADS * HEAD_K_DIM + D_INNER
CONTEXT_LENGTH = 512
SEED = 35

STD = {"token_embd": 1.0, "output": 0.12, "attn_q": 0.1, "attn_k": 0.1, "attn_v": 0.1, "attn_output": 0.08,
       "attn_qkv": 0.15, "attn_gate": 0.15, "conv1d": 0.4, "ssm_beta": 0.15, "ssm_alpha": 0.15, "dt_bias": 0.3,
       "a_log": 0.3, "ssm_out": 0.1, "ffn_gate": 0.1, "ffn_up": 0.1, "ffn_down": 0.08}


def is_recurrent(layer: int) -> bool:
    return (layer + 1) % FULL_ATTENTION_INTERVAL != 0


def linear_layer(w: common.RandomWeights, p: str) -> list[tuple[str, np.ndarray]]:
    a_log = w.vector("a_log", N_V_HEADS)
    return [(p + "attn_qkv.weight", w.matrix("attn_qkv", CONV_CHANNELS, N_EMBD)),
            (p + "attn_gate.weight", w.matrix("attn_gate", D_INNER, N_EMBD)),
            (p + "ssm_conv1d.weight", w.matrix("conv1d", CONV_CHANNELS, CONV_KERNEL)),
            (p + "ssm_dt.bias", w.vector("dt_bias", N_V_HEADS)),
            (p + "ssm_a", -np.exp(a_log).astype(np.float32)),
            (p + "ssm_beta.weight", w.matrix("ssm_beta", N_V_HEADS, N_EMBD)),
            (p + "ssm_alpha.weight", w.matrix("ssm_alpha", N_V_HEADS, N_EMBD)),
            (p + "ssm_norm.weight", w.norm(HEAD_K_DIM)),
            (p + "ssm_out.weight", w.matrix("ssm_out", N_EMBD, D_INNER))]


def attention_layer(w: common.RandomWeights, p: str) -> list[tuple[str, np.ndarray]]:
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    return [(p + "attn_q.weight", w.matrix("attn_q", 2 * q_dim, N_EMBD)),
            (p + "attn_k.weight", w.matrix("attn_k", kv_dim, N_EMBD)),
            (p + "attn_v.weight", w.matrix("attn_v", kv_dim, N_EMBD)),
            (p + "attn_output.weight", w.matrix("attn_output", N_EMBD, q_dim)),
            (p + "attn_q_norm.weight", w.norm(HEAD_DIM)),
            (p + "attn_k_norm.weight", w.norm(HEAD_DIM))]


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order."""
    w = common.RandomWeights(rng, STD)
    out = [("token_embd.weight", w.matrix("token_embd", n_vocab, N_EMBD)),
           ("output_norm.weight", w.norm(N_EMBD)),
           ("output.weight", w.matrix("output", n_vocab, N_EMBD))]
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", w.norm(N_EMBD)))
        out += linear_layer(w, p) if is_recurrent(i) else attention_layer(w, p)
        out += [(p + "post_attention_norm.weight", w.norm(N_EMBD)),
                (p + "ffn_gate.weight", w.matrix("ffn_gate", N_FF, N_EMBD)),
                (p + "ffn_up.weight", w.matrix("ffn_up", N_FF, N_EMBD)),
                (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, N_FF))]
    return out


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """Matrices in Q8_0, except the conv kernel (4 taps a row, under Q8_0's block of 32)."""
    return common.q8_0_matrices(name, data) if "ssm_conv1d" not in name else None


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-qwen35", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(ROPE_DIMS)
    writer.add_rope_dimension_sections(ROPE_SECTIONS)
    writer.add_uint32(f"{ARCH}.full_attention_interval", FULL_ATTENTION_INTERVAL)
    writer.add_ssm_conv_kernel(CONV_KERNEL)
    writer.add_ssm_inner_size(D_INNER)
    writer.add_ssm_state_size(HEAD_K_DIM)
    writer.add_ssm_time_step_rank(N_V_HEADS)
    writer.add_ssm_group_count(N_K_HEADS)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=quantize_as)


# AVX-512 build, llama.cpp's extra buffer types off
record_golden = functools.partial(common.record_golden, extra_buffer_types=False)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "qwen35-q8_0", write_model, record_golden)
