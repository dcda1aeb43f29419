"""Make the synthetic Mamba-2 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/mamba2-q8_0.gguf: `general.architecture = mamba2`, 3
  layers of Mamba-2 mixers: n_embd 64, d_inner 128 in 8 heads of 16, a state
  of 16 per head in 2 groups (B and C shared by 4 heads each), a convolution of
  4 taps with a bias over x, B and C; A = -exp(A_log) with A_log in [0, 1.6)
  (decays from near 1 to near 0 over a token), dt biases around 0, D around 1,
  the grouped RMS norm; the output tied to the token embedding; the tokenizer
  of llama-bpe-q5_1-tied.gguf; seeded random weights, ssm_in and ssm_out in
  Q8_0, the rest (the 4-tap kernels, A, D, norms, biases) in F32;
* tests/data/golden/synth/mamba2-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's AVX-512
  build with its extra buffer types off.

    python scripts/make_synth_mamba2.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

import synth_common as common

ARCH = "mamba2"
N_EMBD, N_LAYER, D_INNER, D_STATE, N_HEAD, N_GROUP, D_CONV = 64, 3, 128, 16, 8, 2, 4
EPS, CONTEXT_LENGTH = 1e-5, 512
SEED = 37

STD = {"token_embd": 0.35, "ssm_in": 0.15, "conv": 0.4, "conv_b": 0.1, "dt_b": 0.5, "ssm_out": 0.1}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    w = common.RandomWeights(rng, STD)
    out = [("token_embd.weight", w.matrix("token_embd", n_vocab, N_EMBD)),
           ("output_norm.weight", w.norm(N_EMBD))]
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", w.norm(N_EMBD)))
        out += common.mamba2_tensors(w, p, n_embd=N_EMBD, d_inner=D_INNER, d_state=D_STATE, n_head=N_HEAD,
                                     n_group=N_GROUP, d_conv=D_CONV)
    return out


QUANTIZED = ("ssm_in.weight", "ssm_out.weight", "token_embd.weight")


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    return GGMLQuantizationType.Q8_0 if name.endswith(QUANTIZED) else None


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-mamba2", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=0, n_head=0, n_head_kv=0)
    writer.add_layer_norm_rms_eps(EPS)
    common.add_mamba2_keys(writer, d_inner=D_INNER, d_state=D_STATE, n_head=N_HEAD, n_group=N_GROUP, d_conv=D_CONV)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=quantize_as)


record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "mamba2-q8_0", write_model, record_golden)
