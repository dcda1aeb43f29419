"""Make the synthetic BERT model and record llama.cpp's embeddings for it.

Writes

* tests/data/synth/encoders/bert-q8_0.gguf: GGUF architecture `bert`, the small
  WordPiece vocabulary of synth_encoders.py, n_embd 64, 2 layers, 4 heads, n_ff
  128, context 128 (the rows of the position embeddings), LayerNorm epsilon 1e-12,
  CLS pooling (bge's), a classification head (cls, cls.output: a reranker's; F32), every
  projection with its bias, seeded random weights (matrices Q8_0, the rest F32);
* with --record, tests/data/golden/synth/bert-q8_0.json (synth_encoders.record,
  which needs llama-cpp-python):

    python scripts/make_synth_bert.py --record
"""

from __future__ import annotations

import sys

from gguf import PoolingType

import synth_encoders as enc

ARCH, STEM = "bert", "bert-q8_0"
N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX, EPS = 64, 2, 4, 128, 128, 1e-12
SEED = 20261202
# the head stays F32 (as converters keep small tensors): its scores then carry only the
# hidden states' rounding, not a Q8_0 product's as well
HEAD_F32 = frozenset({"token_types.weight", "cls.weight", "cls.output.weight"})


def weights(n_vocab: int) -> dict:
    r = enc.Random(SEED)
    w = {"token_embd.weight": r.embedding(n_vocab, N_EMBD),
         "token_types.weight": r.embedding(2, N_EMBD),
         "position_embd.weight": r.embedding(N_CTX, N_EMBD),
         "token_embd_norm.weight": r.norm(N_EMBD), "token_embd_norm.bias": r.bias(N_EMBD)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w[p + proj + ".weight"] = r.matrix(N_EMBD, N_EMBD)
            w[p + proj + ".bias"] = r.bias(N_EMBD)
        w.update({p + "attn_output_norm.weight": r.norm(N_EMBD), p + "attn_output_norm.bias": r.bias(N_EMBD),
                  p + "ffn_up.weight": r.matrix(N_FF, N_EMBD), p + "ffn_up.bias": r.bias(N_FF),
                  p + "ffn_down.weight": r.matrix(N_EMBD, N_FF), p + "ffn_down.bias": r.bias(N_EMBD),
                  p + "layer_output_norm.weight": r.norm(N_EMBD), p + "layer_output_norm.bias": r.bias(N_EMBD)})
    w.update({"cls.weight": r.matrix(N_EMBD, N_EMBD), "cls.bias": r.bias(N_EMBD),
              "cls.output.weight": r.matrix(1, N_EMBD), "cls.output.bias": r.bias(1)})
    return w


def write_model(path) -> None:
    tokens = enc.vocab()
    writer = enc.start_encoder(path, ARCH, name="synthetic-bert", n_layer=N_LAYER, n_ctx=N_CTX, n_embd=N_EMBD,
                               n_ff=N_FF, n_head=N_HEAD, eps=EPS, pooling=PoolingType.CLS)
    enc.finish(writer, tokens, weights(len(tokens)).items(), f32=HEAD_F32)


if __name__ == "__main__":
    enc.main(sys.argv[1:], __doc__, STEM, write_model, "cls", rank=True)
