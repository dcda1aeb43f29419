"""Make the synthetic GLM-4 (dense) model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/glm4-q8_0.gguf: `general.architecture = glm4`, 2 layers,
  n_embd 128, 4 heads of 32 over 2 KV heads, n_ff 256, RoPE over 16 of each
  head's 32 values (`rope.dimension_count` is half the head, as the converter
  writes for GLM-4's partial_rotary_factor 0.5), RoPE base 10000, RMS eps 1e-5;
  the layout of the converted GLM-4-0414 models: separate attn_q / attn_k /
  attn_v with biases (the converter never fuses them), an attn_output without
  bias, post_attention_norm and post_ffw_norm besides attn_norm and ffn_norm,
  one ffn_up of 2 x n_ff rows (gate, then up) and no ffn_gate, a separate
  output.weight (GLM-4-9B-0414 does not tie it); the tokenizer of
  llama-bpe-q5_1-tied.gguf (every tokenizer.* key, 512 tokens); seeded random
  weights, 2-D tensors in Q8_0 (gguf's quantizer), norms and biases in F32.
  The block inputs are RMS-normed, so q and k entries come out near
  0.08 * sqrt(128) = 0.9, plus their biases (std 0.3), and the scores
  (q.k / sqrt(32)) spread by about one: attention is far from uniform, and which
  values RoPE turns, in which layout, matters.  The output (std 0.15) makes
  logits that spread by about 1.7.  Of six seeds, SEED gave the smallest
  distance between llama.cpp and the exact result (0.040) and is met exactly by
  pyengine's scalar and avx2 tables as well; a larger output (0.25) or q/k
  biases (0.5) put llama.cpp 0.07-0.12 off the exact result and the scalar
  table up to 0.054 off llama.cpp;
* tests/data/golden/synth/glm4-q8_0.json: llama.cpp's outputs over the prompts
  of llama-bpe-q5_1-tied.json (make_iq_synth's recorder), from llama-cpp-python
  0.3.36's AVX-512 build with its extra buffer types off (AMX and repacked
  weights: on an AMX host that build crashes with them), the build the golden
  files of tests/model_parity.py come from and pyengine's avx512 table follows
  bit for bit.

    python scripts/make_synth_glm4.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "glm4"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
ROPE_DIMS = HEAD_DIM // 2     # partial RoPE: the first half of each head turns
ROPE_BASE, EPS = 10000.0, 1e-5
SEED = 2

# Standard deviations of the random weights (see above); biases on q, k and v only.
STD = {"token_embd": 1.0, "output": 0.15, "attn_q": 0.08, "attn_k": 0.08, "attn_v": 0.1, "attn_output": 0.0884,
       "ffn_up": 0.1, "ffn_down": 0.0625, "bias_q": 0.3, "bias_k": 0.3, "bias_v": 0.1}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order."""
    w = common.RandomWeights(rng, STD)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += common.attention_tensors(w, p, n_embd=N_EMBD, q_dim=q_dim, kv_dim=kv_dim, biases=True)
        out += [(p + "post_attention_norm.weight", w.norm(N_EMBD)),
                (p + "ffn_norm.weight", w.norm(N_EMBD)),
                (p + "ffn_up.weight", w.matrix("ffn_up", 2 * N_FF, N_EMBD)),     # gate rows, then up rows
                (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, N_FF)),
                (p + "post_ffw_norm.weight", w.norm(N_EMBD))]
    return out


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-glm4", n_layer=N_LAYER, n_ctx=4096, n_embd=N_EMBD,
                                n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(ROPE_DIMS)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)))


# AVX-512 build, llama.cpp's extra buffer types off (see above)
record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "glm4-q8_0", write_model, record_golden)
