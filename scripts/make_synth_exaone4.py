"""Make the synthetic EXAONE 4 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/exaone4-q8_0.gguf: GGUF architecture `exaone4`, 64 layers
  (llama.cpp makes an exaone4 model hybrid only at that depth, the 32B's: a
  shallower one never slides a window) of n_embd 64, 4 query heads of 16 over
  2 key/value heads, n_ff 128, context 4096, RoPE base 10000, RMS epsilon 1e-5;
  a sliding window of 8 tokens, so the 41- and 301-token prompts reach past it;
  `attention.sliding_window_pattern` as the converter writes it, one bool per
  layer: every layer slides (and ropes) but each third, 2, 5, 8, ... (global,
  no RoPE), a period other than llama.cpp's default 4, so a model that ignored
  the array would fail; a `rope_freqs` tensor of Llama-3 factors (factor 8,
  original context 64), as the converter writes for EXAONE 4's llama3 rope
  scaling; a separate output.weight (the 32B's layout); the tokenizer of
  llama-bpe-q5_1-tied.gguf (every tokenizer.* key, 512 tokens); seeded random
  weights, matrices in Q8_0, norms and rope_freqs in F32: matrices about
  1/sqrt(fan-in), the output 3/sqrt(n_embd) (logits that spread by about 3),
  q/k head norms and the output norm 1 +- 0.1 (scores that spread by about 1).
  64 post-normed layers amplify rounding: with embeddings and layer outputs of
  one size, one flipped quantized activation grew to 0.5 in the logits.  So
  the embeddings are large (std 8) and the post-attention / post-MLP norms
  small (0.1 +- 0.01): the residual stream is mostly the token's embedding,
  each layer adds a little, and the engines' rounding differences stay at a
  few hundredths, while the window, the global layers' missing RoPE and
  rope_freqs still move the logits by 1.6, 1.7 and 0.2;
* with --record, tests/data/golden/synth/exaone4-q8_0.json: llama.cpp's outputs
  over the prompts of llama-bpe-q5_1-tied.json by make_iq_synth's record_case
  (same schema and formatting), on a context made as its load_llama makes one
  plus swa_full=True (a sliding-window cache as large as the context; records
  with and without it were equal), the model loaded with use_extra_bufts=False.
  The golden file comes from llama-cpp-python 0.3.36's AVX-512 build, which
  pyengine's avx512 kernels follow bit for bit; on a CPU with AMX that build's
  AMX matrix product (an extra buffer type, no path pyengine follows) crashes.

    python scripts/make_synth_exaone4.py
    python scripts/make_synth_exaone4.py --record     # with llama-cpp-python importable
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "exaone4"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 64, 64, 4, 2, 128
HEAD_DIM = N_EMBD // N_HEAD
N_CTX, ROPE_BASE, EPS = 4096, 10000.0, 1e-5
WINDOW = 8
SLIDING = [i % 3 != 2 for i in range(N_LAYER)]   # "LLG" repeated
LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 64}
EMBD_STD = 8.0      # the residual stream's bulk (see above)
POST_NORM = 0.1     # scale of the post-attention and post-MLP norm weights
SEED = 20250715


def llama3_rope_factors() -> np.ndarray:
    """What the converter writes as rope_freqs for rope_scaling {"rope_type": "llama3", ...}:
    1 for short wavelengths, `factor` for long ones, a smooth blend between."""
    s = LLAMA3_SCALING
    low_wavelen = s["original_context"] / s["low_freq_factor"]
    high_wavelen = s["original_context"] / s["high_freq_factor"]
    factors = []
    for i in range(HEAD_DIM // 2):
        wavelen = 2 * math.pi * ROPE_BASE ** (2 * i / HEAD_DIM)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(s["factor"])
        else:
            smooth = (s["original_context"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.asarray(factors)


def weights(n_vocab: int) -> dict[str, np.ndarray]:
    """Float32 tensors in numpy order ([out, in]), in the converter's order."""
    rng = np.random.default_rng(SEED)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)

    def norm(n: int) -> np.ndarray:
        return 1.0 + 0.1 * rng.standard_normal(n)

    w = {"token_embd.weight": EMBD_STD * rng.standard_normal((n_vocab, N_EMBD)),
         "output_norm.weight": norm(N_EMBD),
         "output.weight": 3.0 * matrix(n_vocab, N_EMBD),
         "rope_freqs.weight": llama3_rope_factors()}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.update({p + "attn_q.weight": matrix(q_dim, N_EMBD),
                  p + "attn_k.weight": matrix(kv_dim, N_EMBD),
                  p + "attn_v.weight": matrix(kv_dim, N_EMBD),
                  p + "attn_output.weight": matrix(N_EMBD, q_dim),
                  p + "attn_q_norm.weight": norm(HEAD_DIM),
                  p + "attn_k_norm.weight": norm(HEAD_DIM),
                  p + "post_attention_norm.weight": POST_NORM * norm(N_EMBD),
                  p + "ffn_gate.weight": matrix(N_FF, N_EMBD),
                  p + "ffn_down.weight": matrix(N_EMBD, N_FF),
                  p + "ffn_up.weight": matrix(N_FF, N_EMBD),
                  p + "post_ffw_norm.weight": POST_NORM * norm(N_EMBD)})
    return {name: t.astype(np.float32) for name, t in w.items()}


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-exaone4", n_layer=N_LAYER, n_ctx=N_CTX, n_embd=N_EMBD,
                                n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_sliding_window(WINDOW)
    writer.add_sliding_window_pattern(SLIDING)
    common.finish_q8_0_model(writer, tokenizer, weights(common.vocab_size(tokenizer)).items())


# make_iq_synth's recorder on a full-size sliding-window cache (swa_full=True),
# AVX-512 build, llama.cpp's extra buffer types off (see above)
record_golden = functools.partial(common.record_golden, extra_buffer_types=False, swa_full=True)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "exaone4-q8_0", write_model, record_golden, golden_flag="--record")
