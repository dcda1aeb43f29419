"""Make the synthetic Granite 4 hybrid with experts (Granite-4.0-H-Tiny / Small's
layout) and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/granitehybrid-moe-q8_0.gguf: `general.architecture =
  granitehybrid`, the layers and multipliers of the synthetic Granite 4 hybrid
  (scripts/make_synth_granitehybrid.py: three Mamba-2 layers, attention in
  layer 1) with, in place of every layer's MLP, 4 experts of 64
  (feed_forward_length, which is an expert's width here; 2 used per token, the
  router's softmax renormalised over the chosen) and an ungated shared expert
  of 64 (expert_shared_feed_forward_length); seeded random weights, the
  matrices and the expert stacks in Q8_0, the rest in F32;
* tests/data/golden/synth/granitehybrid-moe-q8_0.json: llama.cpp's outputs over
  the prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's
  AVX-512 build with its extra buffer types off.

    python scripts/make_synth_granitehybrid_moe.py [--no-golden]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

import make_synth_granitehybrid as dense
import synth_common as common

N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP = 4, 2, 64, 64
SEED = 44

STD = {**dense.STD, "router": 0.2, "exp": 0.25, "exp_down": 0.2}


def experts(w: common.RandomWeights, p: str) -> list[tuple[str, np.ndarray]]:
    """The router, the expert stacks and the shared expert, as the converter orders them."""
    return [(p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, dense.N_EMBD)),
            (p + "ffn_gate_exps.weight", common.matrix_stack(w, "exp", N_EXPERT, N_FF_EXP, dense.N_EMBD)),
            (p + "ffn_up_exps.weight", common.matrix_stack(w, "exp", N_EXPERT, N_FF_EXP, dense.N_EMBD)),
            (p + "ffn_down_exps.weight", common.matrix_stack(w, "exp_down", N_EXPERT, dense.N_EMBD, N_FF_EXP)),
            (p + "ffn_gate_shexp.weight", w.matrix("ffn_gate", N_FF_SHEXP, dense.N_EMBD)),
            (p + "ffn_up_shexp.weight", w.matrix("ffn_up", N_FF_SHEXP, dense.N_EMBD)),
            (p + "ffn_down_shexp.weight", w.matrix("ffn_down", dense.N_EMBD, N_FF_SHEXP))]


def add_keys(writer: GGUFWriter) -> None:
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_expert_shared_feed_forward_length(N_FF_SHEXP)


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """The dense script's rule, with the 3-D expert stacks in Q8_0 too."""
    return common.q8_0_matrices_and_stacks(name, data) if not name.endswith(dense.KEPT_F32) else None


def write_model(path: Path) -> None:
    dense.write_model(path, name="synthetic-granitehybrid-moe", seed=SEED, n_ff=N_FF_EXP, mlp=experts, std=STD,
                      add_keys=add_keys, quantize=quantize_as)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "granitehybrid-moe-q8_0", write_model, dense.record_golden)
