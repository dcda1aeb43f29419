"""Make the synthetic Nemotron-H model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/nemotron_h-q8_0.gguf: `general.architecture = nemotron_h`,
  6 layers in the pattern M - M * - M (Nemotron's notation) read from the
  per-layer head_count_kv [0, 0, 0, 2, 0, 0] and feed_forward_length
  [0, 128, 0, 0, 128, 0]: Mamba-2 mixers where both are 0 (d_inner 128 in 8
  heads of 16, state 16 in 2 groups, a 4-tap convolution with a bias, the
  grouped RMS norm), attention without any position encoding in layer 3 (4
  query heads of 16 over 2 KV heads), squared-ReLU MLPs of 128 in layers 1 and
  4; only `attention.layer_norm_epsilon` (no RMS key: llama.cpp falls back to
  it); a separate output; the tokenizer of llama-bpe-q5_1-tied.gguf; seeded
  random weights, ssm_in, ssm_out and the attention and MLP matrices in Q8_0,
  the rest in F32;
* tests/data/golden/synth/nemotron_h-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's AVX-512
  build with its extra buffer types off.

    python scripts/make_synth_nemotron_h.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "nemotron_h"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 2, 16, 128
HEAD_COUNT_KV = [0, 0, 0, N_HEAD_KV, 0, 0]
FFN_LENGTHS = [0, N_FF, 0, 0, N_FF, 0]
SSM = dict(d_inner=128, d_state=16, n_head=8, n_group=2, d_conv=4)
EPS, CONTEXT_LENGTH = 1e-5, 512
SEED = 43

STD = {"token_embd": 0.35, "output": 0.15, "attn_q": 0.15, "attn_k": 0.15, "attn_v": 0.12, "attn_output": 0.1,
       "ssm_in": 0.15, "conv": 0.4, "conv_b": 0.1, "dt_b": 0.5, "ssm_out": 0.1, "ffn_up": 0.2, "ffn_down": 0.1}


def dense_mlp(w: common.RandomWeights, p: str, n_ff: int) -> list[tuple[str, np.ndarray]]:
    return [(p + "attn_norm.weight", w.norm(N_EMBD)),
            (p + "ffn_up.weight", w.matrix("ffn_up", n_ff, N_EMBD)),
            (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, n_ff))]


def tensors(rng: np.random.Generator, n_vocab: int, *, std: dict[str, float] = STD,
            head_count_kv: list[int] = HEAD_COUNT_KV, ffn_lengths: list[int] = FFN_LENGTHS,
            mlp=dense_mlp) -> list[tuple[str, np.ndarray]]:
    """The layers head_count_kv and ffn_lengths say, each MLP layer's tensors from mlp(w, prefix, n_ff)
    (scripts/make_synth_nemotron_h_moe.py: experts)."""
    w = common.RandomWeights(rng, std)
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i, (n_kv, n_ff) in enumerate(zip(head_count_kv, ffn_lengths)):
        p = f"blk.{i}."
        if n_ff:
            out += mlp(w, p, n_ff)
        elif n_kv:
            out += common.attention_tensors(w, p, n_embd=N_EMBD, q_dim=N_HEAD * HEAD_DIM, kv_dim=n_kv * HEAD_DIM)
        else:
            out.append((p + "attn_norm.weight", w.norm(N_EMBD)))
            out += common.mamba2_tensors(w, p, n_embd=N_EMBD, **SSM)
    return out


def start(path: Path, arch: str, *, head_count_kv: list[int] = HEAD_COUNT_KV,
          ffn_lengths: list[int] = FFN_LENGTHS):
    """The writer with the keys up to the SSM's (the MoE script adds its experts' next)."""
    writer = common.start_model(path, arch, name=f"synthetic-{arch}", n_layer=len(head_count_kv),
                                n_ctx=CONTEXT_LENGTH, n_embd=N_EMBD, n_ff=ffn_lengths, n_head=N_HEAD,
                                n_head_kv=head_count_kv)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_eps(EPS)
    common.add_mamba2_keys(writer, **SSM)
    return writer


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    common.finish_q8_0_model(start(path, ARCH), tokenizer,
                             tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=common.q8_0_matrices_but_mamba2_vectors)


record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "nemotron_h-q8_0", write_model, record_golden)
