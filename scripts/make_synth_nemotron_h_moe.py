"""Make the synthetic Nemotron-H MoE model (Nemotron 3) and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/nemotron_h_moe-q8_0.gguf: `general.architecture =
  nemotron_h_moe`, 5 layers in the pattern M E * M E (Nemotron's notation):
  Mamba-2 mixers and an unroped attention layer as in
  scripts/make_synth_nemotron_h.py (whose tensors() and start() this script
  calls), and in layers 1 and 4 8 routed
  squared-ReLU experts of 32 (2 used, sigmoid scores with a selection bias,
  renormalised, times 2.5) beside a squared-ReLU shared expert of 64; a
  separate output; the tokenizer of llama-bpe-q5_1-tied.gguf; seeded random
  weights, the matrices and expert stacks in Q8_0 but the routers, the 4-tap
  kernels and the grouped norms in F32;
* tests/data/golden/synth/nemotron_h_moe-q8_0.json: llama.cpp's outputs over
  the prompts of llama-bpe-q5_1-tied.json, from llama-cpp-python 0.3.36's
  AVX-512 build with its extra buffer types off.

    python scripts/make_synth_nemotron_h_moe.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

import make_synth_nemotron_h as dense
import synth_common as common

ARCH = "nemotron_h_moe"
N_EMBD = dense.N_EMBD
N_EXPERT, N_USED, N_FF_EXP, N_FF_SHEXP, EXPERT_SCALE = 8, 2, 32, 64, 2.5
HEAD_COUNT_KV = [0, 0, dense.N_HEAD_KV, 0, 0]
FFN_LENGTHS = [0, N_FF_EXP, 0, 0, N_FF_EXP]   # as the converter writes them: the expert size
SEED = 53

STD = {**dense.STD, "router": 0.5, "probs_b": 0.3, "ffn_up_shexp": 0.2, "ffn_down_shexp": 0.1}


def experts(w: common.RandomWeights, p: str, n_ff: int) -> list[tuple[str, np.ndarray]]:
    return [(p + "attn_norm.weight", w.norm(N_EMBD)),
            (p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, N_EMBD)),
            (p + "exp_probs_b.bias", w.vector("probs_b", N_EXPERT)),
            (p + "ffn_up_exps.weight", common.matrix_stack(w, "ffn_up", N_EXPERT, n_ff, N_EMBD)),
            (p + "ffn_down_exps.weight", common.matrix_stack(w, "ffn_down", N_EXPERT, N_EMBD, n_ff)),
            (p + "ffn_up_shexp.weight", w.matrix("ffn_up_shexp", N_FF_SHEXP, N_EMBD)),
            (p + "ffn_down_shexp.weight", w.matrix("ffn_down_shexp", N_EMBD, N_FF_SHEXP))]


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """Q8_0 matrices and stacks, but the routers (near-tied choices would flip) and Mamba-2's vectors."""
    if name.endswith("ffn_gate_inp.weight"):
        return None
    return common.q8_0_matrices_and_stacks(name, data) if not name.endswith(common.MAMBA2_KEPT_F32) else None


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = dense.start(path, ARCH, head_count_kv=HEAD_COUNT_KV, ffn_lengths=FFN_LENGTHS)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_USED)
    writer.add_expert_feed_forward_length(N_FF_EXP)
    writer.add_expert_shared_feed_forward_length(N_FF_SHEXP)
    writer.add_expert_shared_count(1)
    writer.add_expert_weights_norm(True)
    writer.add_expert_weights_scale(EXPERT_SCALE)
    writer.add_expert_group_count(1)
    layers = dense.tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer), std=STD,
                           head_count_kv=HEAD_COUNT_KV, ffn_lengths=FFN_LENGTHS, mlp=experts)
    common.finish_q8_0_model(writer, tokenizer, layers, quantize_as=quantize_as)


record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "nemotron_h_moe-q8_0", write_model, record_golden)
