"""Make the synthetic ERNIE 4.5 (dense) model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/ernie4_5-q8_0.gguf: `general.architecture = ernie4_5`, 2 layers,
  n_embd 128, 4 heads over 2 KV heads with a head size of 64 set by
  `attention.key_length` (so q is 256 wide, twice n_embd, as in ERNIE-4.5-0.3B:
  16 heads of 128 over n_embd 1024), n_ff 256, RoPE base 5e5 and RMS eps 1e-5
  (the 0.3B model's), the tokenizer of llama-bpe-q5_1-tied.gguf (512 tokens);
  seeded random weights: 2-D tensors in Q8_0 (gguf's quantizer), norms in F32
  around 1; no output.weight (the 0.3B model ties its output to the token
  embedding, and llama.cpp then multiplies by token_embd);
* tests/data/golden/synth/ernie4_5-q8_0.json: llama.cpp's logits over the
  prompts of llama-bpe-q5_1-tied.json (the recorder of make_iq_synth.py), from
  llama-cpp-python's AVX-512 build (0.3.36), the build the golden files of
  tests/model_parity.py come from and pyengine's avx512 table follows bit for bit.

The golden file is recorded with llama.cpp's extra buffer types off (AMX and
repacked weights: with them that build crashes on an AMX host).  So recorded,
the Q8_0 and Q6_K golden files made before (qwen2-q8_0, llama-wide-q8_0,
llama-wide-q6_k) come out the same, every logit of them.
An AVX2-only build of llama.cpp sums some products in other lanes: on the
301-token prompt one rounding comes out otherwise at position 64 and the KV
cache carries it on (last-position top-10 0.029 apart; pyengine's avx2 table
follows that build bit for bit instead).

    python scripts/make_synth_ernie4_5.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "ernie4_5"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = 64                 # attention.key_length: not n_embd / n_head (= 32)
ROPE_BASE, EPS = 500000.0, 1e-5
SEED = 3                      # of 8 tried, the widest margins on the tables not bit-exact here (scalar, avx2)

# Standard deviations of the random weights.  The block inputs are RMS-normed, so
# q and k entries come out near 0.1 * sqrt(128) = 1.1 and the scores (q.k / 8 over
# 64 values) spread by about one: attention is far from uniform, and RoPE's layout
# and base matter.  The tied embedding also makes the logits: 0.15 * sqrt(128) = 1.7.
STD = {"token_embd": 0.15, "attn_q": 0.1, "attn_k": 0.1, "attn_v": 0.1, "attn_output": 0.0625,
       "ffn_gate": 0.1, "ffn_up": 0.1, "ffn_down": 0.0625}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in llama.cpp's usual file order."""
    return common.llama_tensors(common.RandomWeights(rng, STD), n_vocab=n_vocab, n_embd=N_EMBD, n_layer=N_LAYER,
                                q_dim=N_HEAD * HEAD_DIM, kv_dim=N_HEAD_KV * HEAD_DIM, n_ff=N_FF, tied=True)


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-ernie4_5", n_layer=N_LAYER, n_ctx=4096, n_embd=N_EMBD,
                                n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)))


# AVX-512 build, llama.cpp's extra buffer types off (see above)
record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "ernie4_5-q8_0", write_model, record_golden)
