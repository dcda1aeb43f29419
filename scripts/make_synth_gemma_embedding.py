"""Make the synthetic EmbeddingGemma model and record llama.cpp's embeddings for it.

Writes

* tests/data/synth/encoders/gemma-embedding-q8_0.gguf: GGUF architecture
  `gemma-embedding`, the small WordPiece vocabulary of synth_encoders.py (the
  tokenizer is not what this model tests: Gemma's SentencePiece is tested with
  gemma3), n_embd 64, 4 layers (sliding_window_pattern 3: layers 0, 1 and 3 local,
  2 global), 4 query heads and 2 key/value heads of 16, n_ff 96 (GELU-gated), context
  128, a sliding window of 8 (local layers see 4 tokens either side: the recorded
  texts run to 23 tokens), rope bases 1e6 (global) and 10000 (local), RMS epsilon
  1e-6, mean pooling, and the dense projections dense_2 (64 -> 128) and dense_3
  (128 -> 64) of a model converted with --sentence-transformers-dense-modules; seeded
  random weights (matrices Q8_0, norms F32);
* with --record, tests/data/golden/synth/gemma-embedding-q8_0.json
  (synth_encoders.record, which needs llama-cpp-python):

    python scripts/make_synth_gemma_embedding.py --record
"""

from __future__ import annotations

import sys

from gguf import PoolingType

import synth_encoders as enc

ARCH, STEM = "gemma-embedding", "gemma-embedding-q8_0"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_CTX, EPS = 64, 4, 4, 2, 16, 96, 128, 1e-6
WINDOW, PATTERN, ROPE_BASE, ROPE_BASE_LOCAL, N_DENSE = 8, 3, 1e6, 10000.0, 128
SEED = 20261207


def weights(n_vocab: int) -> dict:
    r = enc.Random(SEED)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    w = {"token_embd.weight": r.embedding(n_vocab, N_EMBD) / 8.0}   # (scaled by sqrt(64) on the way in)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.update({p + "attn_norm.weight": r.norm(N_EMBD),
                  p + "attn_q.weight": r.matrix(q_dim, N_EMBD), p + "attn_k.weight": r.matrix(kv_dim, N_EMBD),
                  p + "attn_v.weight": r.matrix(kv_dim, N_EMBD),
                  p + "attn_q_norm.weight": r.norm(HEAD_DIM), p + "attn_k_norm.weight": r.norm(HEAD_DIM),
                  p + "attn_output.weight": r.matrix(N_EMBD, q_dim),
                  p + "post_attention_norm.weight": r.norm(N_EMBD), p + "ffn_norm.weight": r.norm(N_EMBD),
                  p + "ffn_gate.weight": r.matrix(N_FF, N_EMBD), p + "ffn_up.weight": r.matrix(N_FF, N_EMBD),
                  p + "ffn_down.weight": r.matrix(N_EMBD, N_FF), p + "post_ffw_norm.weight": r.norm(N_EMBD)})
    w.update({"output_norm.weight": r.norm(N_EMBD),
              "dense_2.weight": r.matrix(N_DENSE, N_EMBD), "dense_3.weight": r.matrix(N_EMBD, N_DENSE)})
    return w


def write_model(path) -> None:
    tokens = enc.vocab()
    writer = enc.start_encoder(path, ARCH, name="synthetic-gemma-embedding", n_layer=N_LAYER, n_ctx=N_CTX,
                               n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, eps=EPS, pooling=PoolingType.MEAN)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_sliding_window(WINDOW)
    writer.add_uint32(f"{ARCH}.attention.sliding_window_pattern", PATTERN)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_float32(f"{ARCH}.rope.freq_base_swa", ROPE_BASE_LOCAL)
    for key, value in (("dense_2_feat_in", N_EMBD), ("dense_2_feat_out", N_DENSE), ("dense_3_feat_in", N_DENSE),
                       ("dense_3_feat_out", N_EMBD)):
        writer.add_uint32(f"{ARCH}.{key}", value)
    enc.finish(writer, tokens, weights(len(tokens)).items())


if __name__ == "__main__":
    enc.main(sys.argv[1:], __doc__, STEM, write_model, "mean", rank=False)
