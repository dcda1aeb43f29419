"""Make the synthetic ModernBERT cross-encoder (reranker) and record llama.cpp's
embeddings and scores for it.

Writes

* tests/data/synth/encoders/modern-bert-rank-q8_0.gguf: make_synth_modern_bert.py's
  model (same shapes, other seeded weights) with rank pooling and ModernBERT's
  classification head as llama.cpp names it: `cls` (no bias), `cls.norm` (a bias-free
  LayerNorm) and `cls.output` (one label, biased), F32 as converters keep such small
  tensors; no classifier.pooling_type key, so the head reads the mean of the rows (as
  llama.cpp reads gte-reranker-modernbert);
* with --record, tests/data/golden/synth/modern-bert-rank-q8_0.json
  (synth_encoders.record: the mean-pooled vectors, each text's rank score, and the
  scores of synth_encoders.RERANK_QUERY against its eight documents; needs
  llama-cpp-python):

    python scripts/make_synth_modern_bert_rank.py --record
"""

from __future__ import annotations

import sys

from gguf import PoolingType

import make_synth_modern_bert as base
import synth_encoders as enc

STEM = "modern-bert-rank-q8_0"
SEED = 20261206
HEAD_F32 = frozenset({"cls.weight", "cls.output.weight"})
# cls.norm gives the head's input unit variance whatever the body's rounding, so a
# score moves with the rounding in proportion to cls.output's size: this one keeps
# the scores within about +-0.6, where the body's Q8_0 rounding moves them by < 0.01
OUTPUT_GAIN = 0.3


def weights(n_vocab: int) -> dict:
    w = base.weights(n_vocab, seed=SEED)
    r = enc.Random(SEED + 1)
    n = base.N_EMBD
    w.update({"cls.weight": r.matrix(n, n), "cls.norm.weight": r.norm(n),
              "cls.output.weight": r.matrix(1, n, OUTPUT_GAIN), "cls.output.bias": r.bias(1)})
    return w


def write_model(path) -> None:
    tokens = enc.vocab()
    writer = base.start(path, name="synthetic-modern-bert-rank", pooling=PoolingType.RANK)
    enc.finish(writer, tokens, weights(len(tokens)).items(), f32=HEAD_F32)


if __name__ == "__main__":
    enc.main(sys.argv[1:], __doc__, STEM, write_model, "mean", rank=True)
