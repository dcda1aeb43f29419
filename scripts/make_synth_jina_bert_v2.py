"""Make the synthetic Jina BERT v2 model and record llama.cpp's embeddings for it.

Writes

* tests/data/synth/encoders/jina-bert-v2-q8_0.gguf: GGUF architecture
  `jina-bert-v2`, the small WordPiece vocabulary of synth_encoders.py, n_embd 64,
  2 layers, 4 heads (ALiBi: no position embeddings), n_ff 96 with a separate
  ffn_gate (GELU-gated), q and k LayerNorms and attn_norm_2 on every layer,
  context 128, LayerNorm epsilon 1e-12, mean pooling, every projection with its
  bias (ffn_gate has none, as llama.cpp reads none), seeded random weights
  (matrices Q8_0, the rest F32);
* with --record, tests/data/golden/synth/jina-bert-v2-q8_0.json
  (synth_encoders.record, which needs llama-cpp-python):

    python scripts/make_synth_jina_bert_v2.py --record
"""

from __future__ import annotations

import sys

from gguf import PoolingType

import synth_encoders as enc

ARCH, STEM = "jina-bert-v2", "jina-bert-v2-q8_0"
N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX, EPS = 64, 2, 4, 96, 128, 1e-12
SEED = 20261205


def weights(n_vocab: int) -> dict:
    r = enc.Random(SEED)
    w = enc.bert_embeddings(r, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        for proj in ("attn_q", "attn_k", "attn_v"):
            w[p + proj + ".weight"] = r.matrix(N_EMBD, N_EMBD)
            w[p + proj + ".bias"] = r.bias(N_EMBD)
        w.update({p + "attn_q_norm.weight": r.norm(N_EMBD), p + "attn_q_norm.bias": r.bias(N_EMBD),
                  p + "attn_k_norm.weight": r.norm(N_EMBD), p + "attn_k_norm.bias": r.bias(N_EMBD),
                  p + "attn_output.weight": r.matrix(N_EMBD, N_EMBD), p + "attn_output.bias": r.bias(N_EMBD),
                  p + "attn_output_norm.weight": r.norm(N_EMBD), p + "attn_output_norm.bias": r.bias(N_EMBD),
                  p + "attn_norm_2.weight": r.norm(N_EMBD), p + "attn_norm_2.bias": r.bias(N_EMBD),
                  p + "ffn_up.weight": r.matrix(N_FF, N_EMBD), p + "ffn_up.bias": r.bias(N_FF),
                  p + "ffn_gate.weight": r.matrix(N_FF, N_EMBD),
                  p + "ffn_down.weight": r.matrix(N_EMBD, N_FF), p + "ffn_down.bias": r.bias(N_EMBD),
                  p + "layer_output_norm.weight": r.norm(N_EMBD), p + "layer_output_norm.bias": r.bias(N_EMBD)})
    return w


def write_model(path) -> None:
    tokens = enc.vocab()
    writer = enc.start_encoder(path, ARCH, name="synthetic-jina-bert-v2", n_layer=N_LAYER, n_ctx=N_CTX,
                               n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, eps=EPS, pooling=PoolingType.MEAN)
    enc.finish(writer, tokens, weights(len(tokens)).items())


if __name__ == "__main__":
    enc.main(sys.argv[1:], __doc__, STEM, write_model, "mean", rank=False)
