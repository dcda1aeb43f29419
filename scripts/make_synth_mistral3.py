"""Make the synthetic Mistral 3 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/mistral3-q8_0.gguf: GGUF architecture `mistral3`, 2 layers of
  n_embd 128, 4 query heads of 32 over 2 key/value heads, n_ff 256, RoPE base
  1e6 over whole heads, RMS epsilon 1e-5; YaRN as Ministral 3 has it, scaled
  down: `rope.scaling.type = yarn`, factor 8 over an original context of 64
  (context_length 512), `rope.scaling.yarn_log_multiplier` 1 (Ministral 3's
  mscale_all_dim: q and k keep their magnitude), and ramp ends other than
  llama.cpp's defaults (beta_fast 4, beta_slow 0.5: the ramp runs over rotary
  pairs 1..4, not 0..3); Llama 4's attention temperature,
  `attention.temperature_scale` 0.3 (Ministral 3 has 0.1), which steps every 64
  positions (the original context): queries at positions 0-63 are unscaled,
  those at 320-333 times 1 + 0.3 ln 6.  Ignoring any of these moves llama.cpp's
  top-10 logits of the 301-token prompt by 0.2 or more (the temperature: 0.22,
  the ramp ends: 0.42, the log multiplier: 0.21); the tokenizer of
  llama-bpe-q5_1-tied.gguf (every tokenizer.* key, 512 tokens); seeded random
  weights, matrices in Q8_0 (gguf's quantizer), norms in F32, a separate
  output.weight;
* with --record, tests/data/golden/synth/mistral3-q8_0.json: llama.cpp's outputs
  over the prompts of llama-bpe-q5_1-tied.json by make_iq_synth's record_case
  (same schema and formatting), on the context make_iq_synth's load_llama makes
  except for yarn_beta_fast / yarn_beta_slow -1, llama.cpp's own default, which
  takes the model's ramp ends (llama-cpp-python passes 32 and 1 unless told),
  the model loaded with use_extra_bufts=False.  The golden file comes from
  llama-cpp-python 0.3.36's AVX-512 build, which pyengine's avx512 kernels
  follow bit for bit; on a CPU with AMX that build's AMX matrix product (an
  extra buffer type, no path pyengine follows) crashes.

    python scripts/make_synth_mistral3.py
    python scripts/make_synth_mistral3.py --record     # with llama-cpp-python importable
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import RopeScalingType

import synth_common as common

ARCH = "mistral3"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
ROPE_BASE, EPS = 1e6, 1e-5
YARN_FACTOR, YARN_ORIG_CTX, CONTEXT_LENGTH = 8.0, 64, 512
YARN_LOG_MUL = 1.0
YARN_BETA_FAST, YARN_BETA_SLOW = 4.0, 0.5
TEMP_BETA = 0.3
SEED = 20250801

# Standard deviations of the random weights, as in make_synth_yarn.py: the token
# embeddings carry the residual stream, attention and the MLP add to it
# moderately (activation-quantization noise stays small), q and k are large
# enough that the scores spread by one or two (attention is far from uniform,
# so every rope angle and the query temperature show), and the logits spread
# by about one.
STD = {"token_embd": 1.0, "output": 0.09, "attn_q": 0.12, "attn_k": 0.12, "attn_v": 0.09, "attn_output": 0.05,
       "ffn_gate": 0.09, "ffn_up": 0.09, "ffn_down": 0.03}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in llama.cpp's usual file order."""
    return common.llama_tensors(common.RandomWeights(rng, STD), n_vocab=n_vocab, n_embd=N_EMBD, n_layer=N_LAYER,
                                q_dim=N_HEAD * HEAD_DIM, kv_dim=N_HEAD_KV * HEAD_DIM, n_ff=N_FF)


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-mistral3", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)   # llama.cpp ropes whole heads in a mistral3 model
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(YARN_FACTOR)
    writer.add_rope_scaling_orig_ctx_len(YARN_ORIG_CTX)
    writer.add_rope_scaling_yarn_log_mul(YARN_LOG_MUL)
    writer.add_rope_scaling_yarn_beta_fast(YARN_BETA_FAST)
    writer.add_rope_scaling_yarn_beta_slow(YARN_BETA_SLOW)
    writer.add_attn_temperature_scale(TEMP_BETA)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)))


# make_iq_synth's recorder with llama.cpp's own YaRN ramp ends, the model's: llama-cpp-python
# passes 32 and 1 unless told otherwise, where llama.cpp's default (-1) reads the file's;
# AVX-512 build, llama.cpp's extra buffer types off (see above)
record_golden = functools.partial(common.record_golden, extra_buffer_types=False,
                                  yarn_beta_fast=-1.0, yarn_beta_slow=-1.0)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "mistral3-q8_0", write_model, record_golden, golden_flag="--record")
