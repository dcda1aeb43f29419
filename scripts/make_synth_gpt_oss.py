"""Make the synthetic gpt-oss model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/gpt-oss-q8_0.gguf: `general.architecture = gpt-oss`, 4
  layers (layers 0 and 2 slide a window of 16 tokens, 1 and 3 see everything,
  as llama.cpp's set_swa_pattern(2) has it), n_embd 64, 4 query heads of 32
  over 2 KV heads (so q is 128 wide, twice n_embd, as gpt-oss's 64 x 64 over
  2880 is wider than its stream), biases on q, k, v and the output, one sink
  logit per head; NeoX RoPE, base 150000, YaRN x8 over an original context of
  64 (gpt-oss: x32 over 4096); a post-attention RMS norm, then 4 experts of
  hidden size 64, 2 used per token, a router with a bias, expert gate / up /
  down stacks with a bias per expert; the tokenizer of llama-bpe-q5_1-tied.gguf
  (every tokenizer.* key, 512 tokens); seeded random weights, 2-D tensors in
  Q8_0 (gguf's quantizer), the expert stacks in --experts (Q8_0 by default; a
  type gguf's quantizer writes, e.g. MXFP4 where both engines run it), norms,
  biases and sinks in F32.  Sizes: the gate and up products spread by about 3.4
  (0.42 * sqrt(64)) around biases of 1, so some of them pass the SwiGLU's
  clamp at 7 (layer 0 over the 301-token prompt: 2% of the gates, 5% of the
  up values) and dropping the clamp shows; the sinks (std 1.5) sit among the
  scores (q.k / sqrt(32): std 0.67 in layer 0), so dropping them
  moves every position; the 41- and 301-token prompts reach past the window.
  The router is Q8_0 like the other matrices, although llama.cpp's quantizer
  leaves real files' routers alone: with an F32 router the two engines' F32
  products (summed in other orders) flipped near-tied expert choices on 2 of 9
  unseen sequences (top-10 0.017 and 0.025 apart, up to 0.056 at some
  position), while with Q8_0 they agree to 1e-5 on every position;
* tests/data/golden/synth/gpt-oss-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (make_iq_synth's recorder) on a
  full-size sliding-window cache (swa_full=True), from llama-cpp-python
  0.3.36's AVX-512 build with its extra buffer types off (on an AMX host that
  build crashes with them).

    python scripts/make_synth_gpt_oss.py [--no-golden] [--experts q8_0|mxfp4]

(--experts mxfp4 writes tests/data/synth/gpt-oss-mxfp4.gguf: the same weights,
the expert stacks in MXFP4; llama.cpp runs it, 0.030-0.038 from the exact
result at the prompts' last positions.)
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, RopeScalingType

import synth_common as common

ARCH = "gpt-oss"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 4, 4, 2, 32
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 4, 2, 64
WINDOW = 16
ROPE_BASE, EPS = 150000.0, 1e-5
YARN_FACTOR, YARN_ORIG_CTX, CONTEXT_LENGTH = 8.0, 64, 512
SEED = 28

STD = {"token_embd": 1.0, "output": 0.12, "attn_q": 0.08, "attn_k": 0.08, "attn_v": 0.1, "attn_output": 0.06,
       "bias_q": 0.2, "bias_k": 0.2, "bias_v": 0.1, "bias_o": 0.05, "sinks": 1.5,
       "router": 0.15, "bias_router": 0.3, "exp_gate": 0.42, "exp_up": 0.42, "exp_down": 0.02,
       "bias_gate": 1.0, "bias_up": 1.0, "bias_down": 0.05}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order."""
    w = common.RandomWeights(rng, STD)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += common.attention_tensors(w, p, n_embd=N_EMBD, q_dim=q_dim, kv_dim=kv_dim, biases=True)
        out += [(p + "attn_output.bias", w.vector("bias_o", N_EMBD)),
                (p + "attn_sinks.weight", w.vector("sinks", N_HEAD)),
                (p + "post_attention_norm.weight", w.norm(N_EMBD)),
                (p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, N_EMBD)),
                (p + "ffn_gate_inp.bias", w.vector("bias_router", N_EXPERT)),
                (p + "ffn_gate_exps.weight", common.matrix_stack(w, "exp_gate", N_EXPERT, N_FF_EXP, N_EMBD)),
                (p + "ffn_gate_exps.bias", common.expert_bias_stack(w, "bias_gate", N_EXPERT, N_FF_EXP)),
                (p + "ffn_up_exps.weight", common.matrix_stack(w, "exp_up", N_EXPERT, N_FF_EXP, N_EMBD)),
                (p + "ffn_up_exps.bias", common.expert_bias_stack(w, "bias_up", N_EXPERT, N_FF_EXP)),
                (p + "ffn_down_exps.weight", common.matrix_stack(w, "exp_down", N_EXPERT, N_EMBD, N_FF_EXP)),
                (p + "ffn_down_exps.bias", common.expert_bias_stack(w, "bias_down", N_EXPERT, N_EMBD))]
    return out


def tensor_type(expert_type: GGMLQuantizationType):
    """The quantize_as rule: expert stacks in expert_type, the other weight matrices in
    Q8_0, every bias (the 2-D expert biases too), norm and sink in F32."""
    def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
        if "_exps.weight" in name:
            return expert_type
        return GGMLQuantizationType.Q8_0 if name.endswith(".weight") and data.ndim == 2 else None
    return quantize_as


def write_model(path: Path, expert_type: GGMLQuantizationType = GGMLQuantizationType.Q8_0) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-gpt-oss", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF_EXP, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_scaling_type(RopeScalingType.YARN)
    writer.add_rope_scaling_factor(YARN_FACTOR)
    writer.add_rope_scaling_orig_ctx_len(YARN_ORIG_CTX)
    writer.add_sliding_window(WINDOW)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_expert_feed_forward_length(N_FF_EXP)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=tensor_type(expert_type))


# AVX-512 build, llama.cpp's extra buffer types off, a sliding-window cache as large as the context
record_golden = functools.partial(common.record_golden, extra_buffer_types=False, swa_full=True)


def parse_expert_type(argv: list[str]) -> tuple[GGMLQuantizationType, list[str]]:
    """--experts TYPE (a gguf type name, e.g. q8_0 or mxfp4), and the other arguments."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--experts", default="q8_0", type=lambda s: GGMLQuantizationType[s.upper()])
    args, rest = parser.parse_known_args(argv)
    return args.experts, rest


if __name__ == "__main__":
    expert_type, rest = parse_expert_type(sys.argv[1:])
    stem = f"gpt-oss-{expert_type.name.lower()}"   # gpt-oss-q8_0; gpt-oss-mxfp4: MXFP4 experts, Q8_0 elsewhere
    common.main(rest, __doc__, stem, functools.partial(write_model, expert_type=expert_type), record_golden)
