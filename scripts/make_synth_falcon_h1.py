"""Make the synthetic Falcon-H1 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/falcon-h1-q8_0.gguf: `general.architecture = falcon-h1`,
  3 layers, each with attention (4 query heads of 16 over 2 KV heads, NeoX
  RoPE of base 1e5) and a Mamba-2 mixer (d_inner 128 in 8 heads of 16, state
  16 in 2 groups, a 4-tap convolution with a bias) side by side on the same
  normed input, then a SiLU-gated MLP of 128 (its norm named `blk.N.ffn_norm`,
  without `.weight`, as the converter names it and llama.cpp reads it); the grouped ssm_norm in layers
  0 and 2 only (optional in llama.cpp: layer 1 goes without); a separate
  output; the tokenizer of llama-bpe-q5_1-tied.gguf; seeded random weights,
  ssm_in, ssm_out and the attention and MLP matrices in Q8_0, the rest in F32.
  No multiplier keys: llama.cpp's converter folds Falcon-H1's muP multipliers
  into the weights;
* tests/data/golden/synth/falcon-h1-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's AVX-512
  build with its extra buffer types off.

    python scripts/make_synth_falcon_h1.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "falcon-h1"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 3, 4, 2, 16, 128
SSM = dict(d_inner=128, d_state=16, n_head=8, n_group=2, d_conv=4)
NORMLESS_LAYERS = (1,)   # no ssm_norm
EPS, CONTEXT_LENGTH, ROPE_BASE = 1e-5, 512, 100000.0
SEED = 47

STD = {"token_embd": 0.35, "output": 0.15, "attn_q": 0.15, "attn_k": 0.15, "attn_v": 0.12, "attn_output": 0.08,
       "ssm_in": 0.15, "conv": 0.4, "conv_b": 0.1, "dt_b": 0.5, "ssm_out": 0.08,
       "ffn_gate": 0.15, "ffn_up": 0.15, "ffn_down": 0.08}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    w = common.RandomWeights(rng, STD)
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += common.attention_tensors(w, p, n_embd=N_EMBD, q_dim=N_HEAD * HEAD_DIM, kv_dim=N_HEAD_KV * HEAD_DIM)
        out += common.mamba2_tensors(w, p, n_embd=N_EMBD, norm=i not in NORMLESS_LAYERS, **SSM)
        out += common.gated_mlp_tensors(w, p, n_embd=N_EMBD, n_ff=N_FF, norm="ffn_norm")   # as the converter names it
    return out


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-falcon-h1", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    common.add_head_keys(writer, head_dim=HEAD_DIM, eps=EPS, rope_base=ROPE_BASE)
    common.add_mamba2_keys(writer, **SSM)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=common.q8_0_matrices_but_mamba2_vectors)


record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "falcon-h1-q8_0", write_model, record_golden)
