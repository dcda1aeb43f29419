"""Make the synthetic Llama 4 (text) model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/llama4-q8_0.gguf: `general.architecture = llama4`, 4
  layers: 0-2 RoPE layers (interleaved RoPE, base 500000, q and k L2-normed
  after it: llama.cpp's use_kq_norm, on for every expert count but 128), 3 a
  NoPE layer (llama.cpp's fixed step of 4) with the attention temperature;
  `interleave_moe_layer_step` 2, so layers 1 and 3 route to 1 of 4 experts
  of hidden size 32 (input scaled by the sigmoid of the router logit) plus a
  shared expert of 32, layers 0 and 2 a dense MLP of 96; n_embd 64, 4 query
  heads of 16 over 2 KV heads; the tokenizer of llama-bpe-q5_1-tied.gguf (512
  tokens); seeded random weights, the matrices and expert stacks in Q8_0
  (gguf's quantizer), norms in F32.  The attention chunk (8192) and the
  temperature's step (8192) lie beyond the prompts, as beyond the context
  pyengine runs Llama 4 with;
* tests/data/golden/synth/llama4-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (make_iq_synth's recorder), from
  llama-cpp-python 0.3.36's AVX-512 build with its extra buffer types off;
* with --long, only tests/data/golden/synth/llama4-long-q8_0.json: llama.cpp's
  logits over a seeded random sequence of 8320 tokens, past the first chunk,
  at its last 160 positions (the top 10 and the argmax of each).

    python scripts/make_synth_llama4.py [--no-golden | --long]
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np

import synth_common as common

ARCH = "llama4"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 4, 4, 2, 16
N_FF, N_EXPERT, N_EXPERT_USED, N_FF_EXP, MOE_STEP = 96, 4, 1, 32, 2
ROPE_BASE, EPS, CONTEXT_LENGTH = 500000.0, 1e-5, 512
SEED = 4004

STD = {"token_embd": 1.0, "output": 0.12, "attn_q": 0.12, "attn_k": 0.12, "attn_v": 0.12, "attn_output": 0.1,
       "ffn_gate": 0.12, "ffn_up": 0.12, "ffn_down": 0.1, "router": 0.25, "exp_gate": 0.15, "exp_up": 0.15,
       "exp_down": 0.15, "shexp_gate": 0.15, "shexp_up": 0.15, "shexp_down": 0.1}


def tensors(rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order."""
    w = common.RandomWeights(rng, STD)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out = common.embedding_and_output(w, n_vocab, N_EMBD)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        out += common.attention_tensors(w, p, n_embd=N_EMBD, q_dim=q_dim, kv_dim=kv_dim)
        out += [(p + "ffn_norm.weight", w.norm(N_EMBD))]
        if (i + 1) % MOE_STEP:
            out += [(p + "ffn_gate.weight", w.matrix("ffn_gate", N_FF, N_EMBD)),
                    (p + "ffn_up.weight", w.matrix("ffn_up", N_FF, N_EMBD)),
                    (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, N_FF))]
            continue
        out += [(p + "ffn_gate_inp.weight", w.matrix("router", N_EXPERT, N_EMBD)),
                (p + "ffn_gate_exps.weight", common.matrix_stack(w, "exp_gate", N_EXPERT, N_FF_EXP, N_EMBD)),
                (p + "ffn_up_exps.weight", common.matrix_stack(w, "exp_up", N_EXPERT, N_FF_EXP, N_EMBD)),
                (p + "ffn_down_exps.weight", common.matrix_stack(w, "exp_down", N_EXPERT, N_EMBD, N_FF_EXP)),
                (p + "ffn_gate_shexp.weight", w.matrix("shexp_gate", N_FF_EXP, N_EMBD)),
                (p + "ffn_up_shexp.weight", w.matrix("shexp_up", N_FF_EXP, N_EMBD)),
                (p + "ffn_down_shexp.weight", w.matrix("shexp_down", N_EMBD, N_FF_EXP))]
    return out


def write_model(path: Path) -> None:
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, ARCH, name="synthetic-llama4", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=N_HEAD_KV)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_expert_count(N_EXPERT)
    writer.add_expert_used_count(N_EXPERT_USED)
    writer.add_expert_feed_forward_length(N_FF_EXP)
    writer.add_interleave_moe_layer_step(MOE_STEP)
    common.finish_q8_0_model(writer, tokenizer, tensors(np.random.default_rng(SEED), common.vocab_size(tokenizer)),
                             quantize_as=common.q8_0_matrices_and_stacks)


# AVX-512 build, llama.cpp's extra buffer types off; a chunked cache as large as the context
record_golden = functools.partial(common.record_golden, extra_buffer_types=False, swa_full=True)


LONG_TOKENS, LONG_RECORDED, LONG_SEED = 8320, 160, 4005


def long_sequence(n_vocab: int) -> list[int]:
    """The --long recording's tokens: seeded random ids past the special ones."""
    return np.random.default_rng(LONG_SEED).integers(3, n_vocab, LONG_TOKENS).tolist()


def record_long(model: Path, out: Path) -> None:
    """llama.cpp's logits at the last LONG_RECORDED of LONG_TOKENS positions (its chunked
    cache as large as the context, one ubatch of 512 at a time)."""
    from llama_cpp import Llama

    ids = long_sequence(common.vocab_size(common.read_tokenizer_source()))
    args = {**common.RECORDER_CONTEXT_ARGS, "n_ctx": LONG_TOKENS + 128, "swa_full": True}
    with common.llama_extra_buffer_types_off():
        llm = Llama(str(model), **args)
        llm.eval(ids)
        logits = np.asarray(llm.scores[LONG_TOKENS - LONG_RECORDED:LONG_TOKENS], np.float32)
        llm.close()
    top = np.argsort(-logits, axis=1, kind="stable")[:, :10]
    golden = {"model": model.name, "n_tokens": LONG_TOKENS, "seed": LONG_SEED,
              "first_recorded": LONG_TOKENS - LONG_RECORDED, "argmax": logits.argmax(axis=1).tolist(),
              "top_ids": top.tolist(), "top_logits": np.take_along_axis(logits, top, axis=1).tolist()}
    out.write_text(json.dumps(golden), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--long"]:
        record_long(common.model_paths("llama4-q8_0")[0], common.GOLDEN_DIR / "llama4-long-q8_0.json")
    else:
        common.main(sys.argv[1:], __doc__, "llama4-q8_0", write_model, record_golden)
