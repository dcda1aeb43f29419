"""Make the synthetic Llama model with YaRN RoPE scaling and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/llama-yarn-q8_0.gguf: `general.architecture = llama`, 2 layers,
  n_embd 128, 4 heads over 2 KV heads (head size 32, all of it roped), n_ff 256,
  the tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens), `rope.scaling.type =
  yarn` with factor 4 over an original context of 64 (context_length 256, so the
  301-token prompt runs far past the original context), seeded random weights:
  2-D tensors in Q8_0 (gguf's quantizer), norms in F32, a separate output.weight;
* tests/data/golden/synth/llama-yarn-q8_0.json: llama.cpp's logits over the
  prompts of llama-bpe-q5_1-tied.json (the recorder of make_iq_synth.py).

With an original context of 64, ggml's YaRN ramp (beta_fast 32, beta_slow 1)
spans rotary pairs 0..5 of 16: the first pair keeps its extrapolated angle,
pairs 1-4 mix, the rest are interpolated (positions / 4); q and k are scaled by
1 + 0.1 ln 4.  An engine that ignores the scaling is off at every position.

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_yarn.py [--no-golden]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import RopeScalingType

import synth_common as common

ARCH = "llama"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
SEED = 12

YARN_FACTOR = 4.0
YARN_ORIG_CTX = 64
CONTEXT_LENGTH = 256          # the original context times the factor, as YaRN models declare it

# Standard deviations of the random weights.  The token embeddings carry the
# residual stream (as Granite's embedding scale makes them do) and attention and
# the MLP add to it moderately, so activation-quantization noise stays small.
# q and k are large enough that the scores (q.k / sqrt(32), times (1 + 0.1 ln 4)^2
# from YaRN) spread by one or two: attention is far from uniform and every rope
# angle shows (ignoring the scaling moves the top logits by 0.18 to 0.44).  The
# output is such that the logits spread by about one.
STD = {"token_embd": 1.0, "output": 0.09, "attn_q": 0.1, "attn_k": 0.1, "attn_v": 0.09, "attn_output": 0.05,
       "ffn_gate": 0.09, "ffn_up": 0.09, "ffn_down": 0.03}


def tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in llama.cpp's usual file order."""
    return common.llama_tensors(common.RandomWeights(rng, STD), n_vocab=512, n_embd=N_EMBD, n_layer=N_LAYER,
                                q_dim=N_EMBD, kv_dim=N_HEAD_KV * HEAD_DIM, n_ff=N_FF)


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-llama-yarn", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HEAD_DIM)   # llama.cpp ropes whole heads in a llama model
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(YARN_FACTOR)
    writer.add_rope_scaling_orig_ctx_len(YARN_ORIG_CTX)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED)))


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "llama-yarn-q8_0", write_model, common.record_golden)
