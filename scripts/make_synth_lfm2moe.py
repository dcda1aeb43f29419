"""Make the synthetic LFM2-MoE model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/lfm2moe-q8_0.gguf: `general.architecture = lfm2moe`, the
  layers of the synthetic LFM2 (scripts/make_synth_lfm2.py: short convolutions
  over a window of 3 in layers 0, 1, 3 and 5, attention in 2 and 4), the first
  two (leading_dense_block_count) with the dense SiLU-gated MLP of 128, the
  other four with 4 experts of 64 (2 used per token) routed by sigmoid scores
  plus a selection bias `exp_probs_b` (std 0.3, about the spread of the scores,
  so it changes which experts run), weighted by the unbiased scores
  renormalised over the chosen; expert_gating_func sigmoid, as the converter
  writes it; seeded random weights, 2-D matrices and the expert stacks in Q8_0,
  the convolution kernels, norms and the bias in F32;
* tests/data/golden/synth/lfm2moe-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's AVX-512
  build with its extra buffer types off.

    python scripts/make_synth_lfm2moe.py [--no-golden]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

import make_synth_lfm2 as lfm2
import synth_common as common

ARCH = "lfm2moe"
N_DENSE_LEAD, N_EXPERT, N_EXPERT_USED, N_FF_EXP = 2, 4, 2, 64
GATING_SIGMOID = 2
SEED = 82

STD = {**lfm2.STD, "router": 0.3, "probs_b": 0.3, "exp": 0.15, "exp_down": 0.1}


def mlp(w: common.RandomWeights, p: str, layer: int) -> list[tuple[str, np.ndarray]]:
    """The dense MLP in the leading layers, the experts and their router in the others."""
    if layer < N_DENSE_LEAD:
        return lfm2.dense_mlp(w, p, layer)
    return [(p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, lfm2.N_EMBD)),
            (p + "ffn_gate_exps.weight", common.matrix_stack(w, "exp", N_EXPERT, N_FF_EXP, lfm2.N_EMBD)),
            (p + "ffn_down_exps.weight", common.matrix_stack(w, "exp_down", N_EXPERT, lfm2.N_EMBD, N_FF_EXP)),
            (p + "ffn_up_exps.weight", common.matrix_stack(w, "exp", N_EXPERT, N_FF_EXP, lfm2.N_EMBD)),
            (p + "exp_probs_b.bias", w.vector("probs_b", N_EXPERT))]


def add_keys(writer: GGUFWriter) -> None:
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_expert_feed_forward_length(N_FF_EXP)
    writer.add_leading_dense_block_count(N_DENSE_LEAD)
    writer.add_uint32(f"{ARCH}.expert_gating_func", GATING_SIGMOID)


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """Matrices and expert stacks in Q8_0, except the convolution kernels (3 taps a row)."""
    return common.q8_0_matrices_and_stacks(name, data) if not name.endswith("shortconv.conv.weight") else None


def write_model(path: Path) -> None:
    lfm2.write_model(path, ARCH, seed=SEED, mlp=mlp, std=STD, add_keys=add_keys, quantize=quantize_as)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "lfm2moe-q8_0", write_model, lfm2.record_golden)
