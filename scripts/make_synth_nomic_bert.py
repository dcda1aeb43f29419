"""Make the synthetic nomic-bert model and record llama.cpp's embeddings for it.

Writes

* tests/data/synth/encoders/nomic-bert-q8_0.gguf: GGUF architecture `nomic-bert`,
  the small WordPiece vocabulary of synth_encoders.py, n_embd 64, 2 layers, 4 heads
  (head size 16, roped whole, NeoX style, base 1000: nomic-embed-text's), n_ff 96,
  context 128, LayerNorm epsilon 1e-12, mean pooling, a fused q/k/v projection and
  a SwiGLU MLP without biases, seeded random weights (matrices Q8_0, the rest F32);
* with --record, tests/data/golden/synth/nomic-bert-q8_0.json (synth_encoders.record,
  which needs llama-cpp-python):

    python scripts/make_synth_nomic_bert.py --record
"""

from __future__ import annotations

import sys

from gguf import PoolingType

import synth_encoders as enc

ARCH, STEM = "nomic-bert", "nomic-bert-q8_0"
N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX, EPS, ROPE_BASE = 64, 2, 4, 96, 128, 1e-12, 1000.0
SEED = 20261203


def weights(n_vocab: int) -> dict:
    r = enc.Random(SEED)
    w = enc.bert_embeddings(r, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.update({p + "attn_qkv.weight": enc.fused_qkv(r, N_EMBD),
                  p + "attn_output.weight": r.matrix(N_EMBD, N_EMBD),
                  p + "attn_output_norm.weight": r.norm(N_EMBD), p + "attn_output_norm.bias": r.bias(N_EMBD),
                  p + "ffn_up.weight": r.matrix(N_FF, N_EMBD),
                  p + "ffn_gate.weight": r.matrix(N_FF, N_EMBD),
                  p + "ffn_down.weight": r.matrix(N_EMBD, N_FF),
                  p + "layer_output_norm.weight": r.norm(N_EMBD), p + "layer_output_norm.bias": r.bias(N_EMBD)})
    return w


def write_model(path) -> None:
    tokens = enc.vocab()
    writer = enc.start_encoder(path, ARCH, name="synthetic-nomic-bert", n_layer=N_LAYER, n_ctx=N_CTX, n_embd=N_EMBD,
                               n_ff=N_FF, n_head=N_HEAD, eps=EPS, pooling=PoolingType.MEAN)
    writer.add_rope_freq_base(ROPE_BASE)
    enc.finish(writer, tokens, weights(len(tokens)).items())


if __name__ == "__main__":
    enc.main(sys.argv[1:], __doc__, STEM, write_model, "mean", rank=False)
