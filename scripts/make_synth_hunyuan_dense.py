"""Make the synthetic Hunyuan dense model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/hunyuan-dense-q8_0.gguf: `general.architecture = hunyuan-dense`,
  2 layers, n_embd 128, 4 heads over 2 KV heads (head size 32), n_ff 256, RMS
  epsilon 1e-5, RoPE base 10000 with `rope.scaling.type` none and factor 1
  (what the converter writes once it has folded Hunyuan's NTK alpha into the
  base), the tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens, every
  tokenizer.* key, its `smollm` pre-tokenizer included), seeded random weights:
  2-D tensors in Q8_0 (gguf's quantizer), norms in F32, and no output.weight
  (the output is tied to the token embedding, as in the 0.5B-4B models).  The
  per-head q/k norm weights spread widely (0.5 to 2), as trained ones do, so
  that normalizing before RoPE instead of after it changes the result;
* tests/data/golden/synth/hunyuan-dense-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (the recorder of make_iq_synth.py).

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_hunyuan_dense.py [--no-golden]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import RopeScalingType

import synth_common as common

ARCH = "hunyuan-dense"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_VOCAB = 128, 2, 4, 2, 256, 512
HEAD_DIM = N_EMBD // N_HEAD
N_CTX, ROPE_BASE, EPS = 4096, 10000.0, 1e-5
# Of the seeds 20250812-19 only this one gives a model on which llama.cpp's AVX2
# and AVX-512 builds agree to the bit (so do this engine's tables, which follow
# each build): on the others one rounding difference in the 301-token prompt flips
# a Q8_0 activation and moves later logits by 0.02-0.08.  With it the golden file
# is the same whichever build records it, and every SIMD table is checked bit for
# bit against it.
SEED = 20250814

# Standard deviations of the random matrices.  The q/k norms fix each head's
# size, so the score spread comes from their weights (below); the tied
# embedding is large enough that the logits spread by a few units.
STD = {"token_embd": 0.1, "attn_q": 0.09, "attn_k": 0.09, "attn_v": 0.09, "attn_output": 0.09,
       "ffn_gate": 0.09, "ffn_up": 0.09, "ffn_down": 0.0625}


def tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order."""
    def head_norms(prefix: str) -> list[tuple[str, np.ndarray]]:
        return [(prefix + f"attn_{x}_norm.weight", rng.uniform(0.5, 2.0, HEAD_DIM).astype(np.float32)) for x in "qk"]

    return common.llama_tensors(common.RandomWeights(rng, STD), n_vocab=N_VOCAB, n_embd=N_EMBD, n_layer=N_LAYER,
                                q_dim=N_EMBD, kv_dim=N_HEAD_KV * HEAD_DIM, n_ff=N_FF, tied=True,
                                after_attention=head_norms)


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    assert common.vocab_size(tokenizer) == N_VOCAB
    writer = common.start_model(path, ARCH, name="synthetic-hunyuan-dense", n_layer=N_LAYER, n_ctx=N_CTX,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    common.add_head_keys(writer, head_dim=HEAD_DIM, eps=EPS, rope_base=ROPE_BASE)
    writer.add_rope_scaling_type(RopeScalingType.NONE)
    writer.add_rope_scaling_factor(1.0)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED)))


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "hunyuan-dense-q8_0", write_model, common.record_golden)
