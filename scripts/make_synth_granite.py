"""Make the synthetic Granite model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/granite-q8_0.gguf: `general.architecture = granite`, 2 layers,
  n_embd 128, 4 heads over 2 KV heads (head size 32), n_ff 256, the tokenizer of
  llama-bpe-q5_1-tied.gguf (512 tokens), Granite's four multipliers set to
  values a mistake in any of them shows, seeded random weights: 2-D tensors in
  Q8_0 (gguf's quantizer), norms in F32, a separate output.weight;
* tests/data/golden/synth/granite-q8_0.json: llama.cpp's logits over the
  prompts of llama-bpe-q5_1-tied.json (the recorder of make_iq_synth.py).

    PYTHONPATH=/path/to/llama_cpp_python python scripts/make_synth_granite.py [--no-golden]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "granite"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF = 128, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
SEED = 20250311

# Granite 3.x's values are of this kind (embedding 12, residual 0.22, attention 1/64 = 0.015625,
# logits 8).  With a head size of 32, 1/64 is far from 1/sqrt(32) = 0.177.
SCALES = {"embedding_scale": 12.0, "residual_scale": 0.22, "attention.scale": 0.015625, "logit_scale": 8.0}

# Standard deviations of the random weights.  q and k are large enough that the
# scores (q.k / 64) spread by about one, so the attention scale and RoPE matter;
# the output is large enough that the logits (divided by 8) spread by about one.
STD = {"token_embd": 0.1, "output": 0.7, "attn_q": 0.3, "attn_k": 0.3, "attn_v": 0.09, "attn_output": 0.09,
       "ffn_gate": 0.09, "ffn_up": 0.09, "ffn_down": 0.0625}


def tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in llama.cpp's usual file order."""
    return common.llama_tensors(common.RandomWeights(rng, STD), n_vocab=512, n_embd=N_EMBD, n_layer=N_LAYER,
                                q_dim=N_EMBD, kv_dim=N_HEAD_KV * HEAD_DIM, n_ff=N_FF)


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-granite", n_layer=N_LAYER, n_ctx=4096, n_embd=N_EMBD,
                                n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(common.vocab_size(tokenizer))     # before the scales, as the file has always had it
    writer.add_embedding_scale(SCALES["embedding_scale"])
    writer.add_residual_scale(SCALES["residual_scale"])
    writer.add_attention_scale(SCALES["attention.scale"])
    writer.add_logit_scale(SCALES["logit_scale"])
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED)), with_vocab_size=False)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "granite-q8_0", write_model, common.record_golden)
