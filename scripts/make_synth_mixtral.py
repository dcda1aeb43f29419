"""Make the synthetic Mixtral model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/mixtral-q8_0.gguf: `general.architecture = llama` with
  experts, as Mixtral's files are: 4 layers, n_embd 64, 4 query heads of 16
  over 2 KV heads, interleaved RoPE base 10000; in every layer a router
  (ffn_gate_inp) over 4 experts of hidden size 64 (`feed_forward_length`,
  which sizes llama.cpp's llama experts), 2 used per token, each a SiLU-gated
  MLP (ffn_{gate,up,down}_exps stacks); the tokenizer of
  llama-bpe-q5_1-tied.gguf (512 tokens); seeded random weights, the matrices
  and expert stacks in Q8_0 (gguf's quantizer), norms in F32.  The router's
  logits spread by about 1.2 (0.15 * sqrt(64)), so the two chosen experts'
  weights differ (renormalising them, or not, moves the result) and the
  second and third choices are seldom near-tied;
* tests/data/golden/synth/mixtral-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (make_iq_synth's recorder), from
  llama-cpp-python 0.3.36's AVX-512 build with its extra buffer types off.

    python scripts/make_synth_mixtral.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "llama"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 4, 4, 2, 16
N_EXPERT, N_EXPERT_USED, N_FF = 4, 2, 64
ROPE_BASE, EPS, CONTEXT_LENGTH = 10000.0, 1e-5, 512
SEED = 8722

STD = {"token_embd": 1.0, "output": 0.12, "attn_q": 0.12, "attn_k": 0.12, "attn_v": 0.12, "attn_output": 0.12,
       "router": 0.15, "exp_gate": 0.15, "exp_up": 0.15, "exp_down": 0.12}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order."""
    w = common.RandomWeights(rng, STD)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += common.attention_tensors(w, p, n_embd=N_EMBD, q_dim=q_dim, kv_dim=kv_dim)
        out += [(p + "ffn_norm.weight", w.norm(N_EMBD)),
                (p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, N_EMBD)),
                (p + "ffn_gate_exps.weight", common.matrix_stack(w, "exp_gate", N_EXPERT, N_FF, N_EMBD)),
                (p + "ffn_up_exps.weight", common.matrix_stack(w, "exp_up", N_EXPERT, N_FF, N_EMBD)),
                (p + "ffn_down_exps.weight", common.matrix_stack(w, "exp_down", N_EXPERT, N_EMBD, N_FF))]
    return out


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-mixtral", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=common.q8_0_matrices_and_stacks)


# AVX-512 build, llama.cpp's extra buffer types off
record_golden = functools.partial(common.record_golden, extra_buffer_types=False)


if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "mixtral-q8_0", write_model, record_golden)
