"""Make the synthetic Qwen3-Next model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/qwen3next-q8_0.gguf: `general.architecture = qwen3next`, the
  shapes of the synthetic Qwen3.5-MoE (scripts/make_synth_qwen35moe.py: three
  Gated DeltaNet layers, then gated attention; 4 experts of 64, 2 used, and a
  shared expert of 64 behind its sigmoid gate) laid out as Qwen3-Next's converter
  writes them: beta and alpha in one `ssm_ba` [2 x value heads, n_embd] whose
  rows go per q/k head (its two value heads' betas, then their alphas), and the
  q/k heads read by the value heads next to one another (h // 2, where Qwen3.5
  tiles them); no rope sections (plain NeoX RoPE over 16 of 32 dims); seeded
  random weights, 2-D matrices and the expert stacks in Q8_0, the conv kernel,
  norms and vectors in F32;
* tests/data/golden/synth/qwen3next-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's AVX-512
  build with its extra buffer types off.

    PYTHONPATH=<a folder holding only gguf> <python with llama-cpp-python 0.3.36> scripts/make_synth_qwen3next.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import make_synth_qwen35 as dense
import make_synth_qwen35moe as moe
import synth_common as common

ARCH = "qwen3next"
SEED = 3082
HEADS_PER_KEY = dense.N_V_HEADS // dense.N_K_HEADS


def beta_alpha(w: common.RandomWeights) -> np.ndarray:
    """ssm_ba [2*Hv, n_embd]: per q/k head, its value heads' beta rows, then their alpha rows."""
    beta = w.matrix("ssm_beta", dense.N_V_HEADS, dense.N_EMBD).reshape(dense.N_K_HEADS, HEADS_PER_KEY, -1)
    alpha = w.matrix("ssm_alpha", dense.N_V_HEADS, dense.N_EMBD).reshape(dense.N_K_HEADS, HEADS_PER_KEY, -1)
    return np.concatenate([beta, alpha], axis=1).reshape(2 * dense.N_V_HEADS, dense.N_EMBD)


def linear_layer(w: common.RandomWeights, p: str) -> list[tuple[str, np.ndarray]]:
    """Qwen3.5's linear layer with ssm_beta and ssm_alpha fused into ssm_ba."""
    out = [(name, data) for name, data in dense.linear_layer(w, p)
           if not name.startswith((p + "ssm_beta", p + "ssm_alpha"))]
    return out + [(p + "ssm_ba.weight", beta_alpha(w))]


def write_model(path: Path) -> None:
    moe.write_model(path, ARCH, seed=SEED, linear_layer=linear_layer, rope_sections=False)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "qwen3next-q8_0", write_model, dense.record_golden)
