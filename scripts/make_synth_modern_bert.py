"""Make the synthetic ModernBERT model and record llama.cpp's embeddings for it.

Writes

* tests/data/synth/encoders/modern-bert-q8_0.gguf: GGUF architecture `modern-bert`,
  the small WordPiece vocabulary of synth_encoders.py, n_embd 64, 4 layers (global,
  local, local, global: sliding_window_pattern 3), 4 heads, n_ff 96 (GEGLU, ffn_up
  2 x 96 rows), context 128, a sliding window of 8 (local layers see 4 tokens
  either side: the recorded texts run to 23 tokens, so the window matters), rope
  bases 160000 (global) and 10000 (local), LayerNorm epsilon 1e-5, no biases, mean
  pooling, seeded random weights (matrices Q8_0, norms F32);
* with --record, tests/data/golden/synth/modern-bert-q8_0.json (synth_encoders.record,
  which needs llama-cpp-python):

    python scripts/make_synth_modern_bert.py --record
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import PoolingType

import synth_encoders as enc

ARCH, STEM = "modern-bert", "modern-bert-q8_0"
N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX, EPS = 64, 4, 4, 96, 128, 1e-5
WINDOW, PERIOD, ROPE_BASE, ROPE_BASE_LOCAL = 8, 3, 160000.0, 10000.0
SEED = 20261204


def weights(n_vocab: int, seed: int = SEED) -> dict:
    r = enc.Random(seed)
    w = {"token_embd.weight": r.embedding(n_vocab, N_EMBD), "token_embd_norm.weight": r.norm(N_EMBD)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        if i:   # the first layer's attention reads the normed embeddings as they are
            w[p + "attn_norm.weight"] = r.norm(N_EMBD)
        w.update({p + "attn_qkv.weight": np.concatenate([r.matrix(N_EMBD, N_EMBD), r.matrix(N_EMBD, N_EMBD),
                                                         r.matrix(N_EMBD, N_EMBD)]),
                  p + "attn_output.weight": r.matrix(N_EMBD, N_EMBD),
                  p + "ffn_norm.weight": r.norm(N_EMBD),
                  p + "ffn_up.weight": r.matrix(2 * N_FF, N_EMBD),
                  p + "ffn_down.weight": r.matrix(N_EMBD, N_FF)})
    w["output_norm.weight"] = r.norm(N_EMBD)
    return w


def start(path, name: str, pooling: PoolingType):
    """The writer with this model's hyper-parameters (the reranker's script shares them)."""
    writer = enc.start_encoder(path, ARCH, name=name, n_layer=N_LAYER, n_ctx=N_CTX, n_embd=N_EMBD,
                               n_ff=N_FF, n_head=N_HEAD, eps=EPS, pooling=pooling)
    writer.add_sliding_window(WINDOW)
    writer.add_uint32(f"{ARCH}.attention.sliding_window_pattern", PERIOD)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_float32(f"{ARCH}.rope.freq_base_swa", ROPE_BASE_LOCAL)
    return writer


def write_model(path) -> None:
    tokens = enc.vocab()
    writer = start(path, "synthetic-modern-bert", PoolingType.MEAN)
    enc.finish(writer, tokens, weights(len(tokens)).items())


if __name__ == "__main__":
    enc.main(sys.argv[1:], __doc__, STEM, write_model, "mean", rank=False)
