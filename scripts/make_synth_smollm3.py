"""Make the synthetic SmolLM3 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/smollm3-q8_0.gguf: GGUF architecture `smollm3`, 4 layers
  (layer 3 is SmolLM3's NoPE layer: llama.cpp skips RoPE where (il + 1) % 4 == 0),
  n_embd 128, 4 heads of 32, 2 KV heads, n_ff 256, context 4096, RoPE base
  5e6 (SmolLM3-3B's), RMS eps 1e-6; seeded random weights, the matrices
  quantized to Q8_0 by gguf-py, the norms F32 around 1; no output.weight
  (SmolLM3 ties its output to the token embedding); the tokenizer metadata
  (every tokenizer.* key) of llama-bpe-q5_1-tied.gguf, a 512-token BPE vocab;
* tests/data/golden/synth/smollm3-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, recorded by make_iq_synth.py's
  recorder (same schema as every golden file).

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_smollm3.py [--no-record]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "smollm3"

SEED = 20250708
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 128, 4, 4, 2, 256, 4096
HEAD_DIM = N_EMBD // N_HEAD
ROPE_BASE = 5_000_000.0
EPS = 1e-6
STD = 0.1            # q/k/v/o, gate, up, embedding: unit-RMS inputs give O(1) activations and scores
STD_DOWN = 0.0625    # 1 / sqrt(n_ff)
STD_NORM = 0.1       # norm weights: 1 + this * N(0, 1)


def random_weights(n_vocab: int) -> dict[str, np.ndarray]:
    """float32 weights in numpy order ([out, in]), in llama.cpp's tensor order."""
    rng = np.random.default_rng(SEED)

    def mat(rows: int, cols: int, std: float = STD) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm(n: int = N_EMBD) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * STD_NORM).astype(np.float32)

    w = {"token_embd.weight": mat(n_vocab, N_EMBD), "output_norm.weight": norm()}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm()
        w[p + "attn_q.weight"] = mat(N_HEAD * HEAD_DIM, N_EMBD)
        w[p + "attn_k.weight"] = mat(N_HEAD_KV * HEAD_DIM, N_EMBD)
        w[p + "attn_v.weight"] = mat(N_HEAD_KV * HEAD_DIM, N_EMBD)
        w[p + "attn_output.weight"] = mat(N_EMBD, N_HEAD * HEAD_DIM)
        w[p + "ffn_norm.weight"] = norm()
        w[p + "ffn_gate.weight"] = mat(N_FF, N_EMBD)
        w[p + "ffn_up.weight"] = mat(N_FF, N_EMBD)
        w[p + "ffn_down.weight"] = mat(N_EMBD, N_FF, STD_DOWN)
    return w


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-smollm3", n_layer=N_LAYER, n_ctx=N_CTX, n_embd=N_EMBD,
                                n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    common.finish_q8_0_model(writer, tokenizer, random_weights(common.vocab_size(tokenizer)).items())


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "smollm3-q8_0", write_model, common.record_golden, golden_flag="--no-record")
