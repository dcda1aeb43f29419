"""Make the synthetic Granite 4 hybrid model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/granitehybrid-q8_0.gguf: `general.architecture =
  granitehybrid`, 4 layers whose head_count_kv [0, 2, 0, 0] makes layer 1
  attention (4 query heads of 16 over 2 KV heads, interleaved RoPE) and the
  others Mamba-2 mixers (d_inner 128 in 8 heads of 16, state 16 in 2 groups,
  a 4-tap convolution with a bias, the grouped RMS norm), every layer with a
  SiLU-gated MLP of 128; Granite's multipliers: embeddings x 2, residual
  x 0.5, scores x 0.1, logits / 4; a separate output (tied, the token's own
  embedding dominated every argmax); the
  tokenizer of llama-bpe-q5_1-tied.gguf; seeded random weights, ssm_in,
  ssm_out and the attention and MLP matrices in Q8_0, the rest in F32;
* tests/data/golden/synth/granitehybrid-q8_0.json: llama.cpp's outputs over
  the prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's
  AVX-512 build with its extra buffer types off.

    python scripts/make_synth_granitehybrid.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

import synth_common as common

ARCH = "granitehybrid"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 2, 16, 128
HEAD_COUNT_KV = [0, N_HEAD_KV, 0, 0]
N_LAYER = len(HEAD_COUNT_KV)
D_INNER, D_STATE, N_SSM_HEAD, N_GROUP, D_CONV = 128, 16, 8, 2, 4
N_CONV = D_INNER + 2 * N_GROUP * D_STATE
EPS, CONTEXT_LENGTH, ROPE_BASE = 1e-5, 512, 10000.0
SCALES = {"embedding_scale": 2.0, "residual_scale": 0.5, "attention.scale": 0.1, "logit_scale": 4.0}
SEED = 41

STD = {"token_embd": 0.35, "output": 0.3, "attn_q": 0.15, "attn_k": 0.15, "attn_v": 0.12, "attn_output": 0.1,
       "ssm_in": 0.15, "conv": 0.4, "conv_b": 0.1, "dt_b": 0.5, "ssm_out": 0.1,
       "ffn_gate": 0.15, "ffn_up": 0.15, "ffn_down": 0.08}


def mixer(w: common.RandomWeights, rng: np.random.Generator, p: str) -> list[tuple[str, np.ndarray]]:
    return [(p + "ssm_in.weight", w.matrix("ssm_in", D_INNER + N_CONV + N_SSM_HEAD, N_EMBD)),
            (p + "ssm_conv1d.weight", w.matrix("conv", N_CONV, D_CONV)),
            (p + "ssm_conv1d.bias", w.vector("conv_b", N_CONV)),
            (p + "ssm_dt.bias", w.vector("dt_b", N_SSM_HEAD)),
            (p + "ssm_a", -np.exp(rng.uniform(0.0, 1.6, (N_SSM_HEAD, 1))).astype(np.float32)),
            (p + "ssm_d", (1.0 + 0.3 * rng.standard_normal((N_SSM_HEAD, 1))).astype(np.float32)),
            (p + "ssm_norm.weight", w.norm(D_INNER).reshape(N_GROUP, D_INNER // N_GROUP)),
            (p + "ssm_out.weight", w.matrix("ssm_out", N_EMBD, D_INNER))]


def dense_mlp(w: common.RandomWeights, p: str) -> list[tuple[str, np.ndarray]]:
    """A layer's SiLU-gated MLP (after its ffn_norm)."""
    return [(p + "ffn_gate.weight", w.matrix("ffn_gate", N_FF, N_EMBD)),
            (p + "ffn_up.weight", w.matrix("ffn_up", N_FF, N_EMBD)),
            (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, N_FF))]


def tensors(rng: np.random.Generator, n_vocab: int, mlp=dense_mlp, std=None) -> list[tuple[str, np.ndarray]]:
    """mlp(w, prefix): a layer's feed-forward tensors (the MoE variant's script passes its experts)."""
    w = common.RandomWeights(rng, std or STD)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out = [("token_embd.weight", w.matrix("token_embd", n_vocab, N_EMBD)),
           ("output_norm.weight", w.norm(N_EMBD)),
           ("output.weight", w.matrix("output", n_vocab, N_EMBD))]
    for i, n_kv in enumerate(HEAD_COUNT_KV):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", w.norm(N_EMBD)))
        if n_kv:
            out += [(p + "attn_q.weight", w.matrix("attn_q", q_dim, N_EMBD)),
                    (p + "attn_k.weight", w.matrix("attn_k", kv_dim, N_EMBD)),
                    (p + "attn_v.weight", w.matrix("attn_v", kv_dim, N_EMBD)),
                    (p + "attn_output.weight", w.matrix("attn_output", N_EMBD, q_dim))]
        else:
            out += mixer(w, rng, p)
        out.append((p + "ffn_norm.weight", w.norm(N_EMBD)))
        out += mlp(w, p)
    return out


# 2-D tensors kept in F32: the 4-tap kernels and the grouped norms (rows Q8_0 cannot block)
KEPT_F32 = ("ssm_conv1d.weight", "ssm_norm.weight", "ssm_a", "ssm_d")


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    return common.q8_0_matrices(name, data) if not name.endswith(KEPT_F32) else None


def write_model(path: Path, *, name: str = "synthetic-granitehybrid", seed: int = SEED, n_ff: int = N_FF,
                mlp=dense_mlp, std=None, add_keys=None, quantize=quantize_as) -> None:
    """The model, weights from `seed`, each layer's MLP from mlp(w, prefix); add_keys(writer):
    keys of a variant (the MoE variant's experts)."""
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name=name, n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=n_ff, n_head=N_HEAD, n_head_kv=HEAD_COUNT_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_bool(f"{ARCH}.rope.scaling.finetuned", True)
    writer.add_ssm_conv_kernel(D_CONV)
    writer.add_ssm_inner_size(D_INNER)
    writer.add_ssm_state_size(D_STATE)
    writer.add_ssm_time_step_rank(N_SSM_HEAD)
    writer.add_ssm_group_count(N_GROUP)
    writer.add_embedding_scale(SCALES["embedding_scale"])
    writer.add_residual_scale(SCALES["residual_scale"])
    writer.add_attention_scale(SCALES["attention.scale"])
    writer.add_logit_scale(SCALES["logit_scale"])
    if add_keys is not None:
        add_keys(writer)
    weights = tensors(np.random.default_rng(seed), common.vocab_size(tokenizer), mlp, std)
    common.finish_q8_0_model(writer, tokenizer, weights, quantize_as=quantize)


record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "granitehybrid-q8_0", write_model, record_golden)
