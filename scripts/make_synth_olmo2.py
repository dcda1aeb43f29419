"""Make the synthetic OLMo 2 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/olmo2-q8_0.gguf: GGUF architecture `olmo2` with the
  tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens, every tokenizer.* key),
  n_embd 128, 2 layers, 4 query heads over 2 key/value heads (so the key norm,
  over kv_dim = 64 values, is narrower than the query norm over 128), n_ff 256,
  context 4096, rope base 500000 (OLMo 2's), RMS epsilon 1e-6, no
  rope.dimension_count (llama.cpp ropes whole heads), seeded random weights:
  matrices (Q8_0) about 1/sqrt(fan-in), embeddings 0.5, norms 1 +- 0.1 (F32),
  and a separate output.weight (llama.cpp's olmo2 requires one);
* with --record, tests/data/golden/synth/olmo2-q8_0.json: llama.cpp's outputs
  over the prompts of the other synthetic golden files, by make_iq_synth's
  recorder (which needs llama-cpp-python):

    python scripts/make_synth_olmo2.py
    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_olmo2.py --record
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "olmo2"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
N_CTX, ROPE_BASE, EPS = 4096, 500000.0, 1e-6
SEED = 20250201


def weights(n_vocab: int) -> dict[str, np.ndarray]:
    """Float32 tensors in numpy order ([out, in]), in llama.cpp's conversion order."""
    rng = np.random.default_rng(SEED)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)

    def norm(n: int) -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n)

    w = {"token_embd.weight": 0.5 * rng.standard_normal((n_vocab, N_EMBD)),
         "output_norm.weight": norm(N_EMBD),
         "output.weight": 1.1 * matrix(n_vocab, N_EMBD)}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.update({p + "attn_q.weight": matrix(q_dim, N_EMBD),
                  p + "attn_k.weight": matrix(kv_dim, N_EMBD),
                  p + "attn_v.weight": matrix(kv_dim, N_EMBD),
                  p + "attn_output.weight": matrix(N_EMBD, q_dim),
                  p + "post_attention_norm.weight": norm(N_EMBD),
                  p + "attn_q_norm.weight": norm(q_dim),
                  p + "attn_k_norm.weight": norm(kv_dim),
                  p + "post_ffw_norm.weight": norm(N_EMBD),
                  p + "ffn_gate.weight": matrix(N_FF, N_EMBD),
                  p + "ffn_down.weight": matrix(N_EMBD, N_FF),
                  p + "ffn_up.weight": matrix(N_FF, N_EMBD)})
    return {name: t.astype(np.float32) for name, t in w.items()}


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-olmo2", n_layer=N_LAYER, n_ctx=N_CTX, n_embd=N_EMBD,
                                n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    common.finish_q8_0_model(writer, tokenizer, weights(common.vocab_size(tokenizer)).items())


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "olmo2-q8_0", write_model, common.record_golden, golden_flag="--record")
