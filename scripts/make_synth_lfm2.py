"""Make the synthetic LFM2 model and record llama.cpp's golden outputs for it.

Writes

* tests/data/synth/lfm2-q8_0.gguf: `general.architecture = lfm2`, 6 layers
  whose head_count_kv [0, 0, 2, 0, 2, 0] makes layers 2 and 4 attention (4
  query heads of 16 over 2 KV heads, q and k heads RMS-normed, NeoX RoPE) and
  the others short convolutions over a window of 3 tokens (l_cache 3);
  n_embd 64, a SiLU-gated MLP of 128 in every layer, `token_embd_norm` as the
  final norm, the output tied to the token embedding; the tokenizer of
  llama-bpe-q5_1-tied.gguf; seeded random weights, 2-D tensors in Q8_0 but
  for the convolution kernels (3 taps a row: F32, as llama.cpp's quantizer
  leaves them).  Sizes: in_proj's B, C and x (std 0.18 * sqrt(64) = 1.4 on
  the normed input) and kernels of std 0.5 make the gated convolution weigh
  as much as the attention, so a window one token short (or the gate left
  out) moves nearly every argmax;
* tests/data/golden/synth/lfm2-q8_0.json: llama.cpp's outputs over the
  prompts of llama-bpe-q5_1-tied.json (make_iq_synth's recorder), from
  llama-cpp-python 0.3.36's AVX-512 build with its extra buffer types off.

    python scripts/make_synth_lfm2.py [--no-golden]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

import synth_common as common

ARCH = "lfm2"
N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, L_CACHE = 64, 4, 2, 16, 128, 3
HEAD_COUNT_KV = [0, 0, N_HEAD_KV, 0, N_HEAD_KV, 0]
N_LAYER = len(HEAD_COUNT_KV)
ROPE_BASE, EPS, CONTEXT_LENGTH = 1000000.0, 1e-5, 512
SEED = 31

STD = {"token_embd": 0.35, "attn_q": 0.12, "attn_k": 0.12, "attn_v": 0.12, "attn_output": 0.1,
       "in_proj": 0.18, "conv": 0.5, "out_proj": 0.1, "ffn_gate": 0.15, "ffn_up": 0.15, "ffn_down": 0.08}


def dense_mlp(w: common.RandomWeights, p: str, layer: int) -> list[tuple[str, np.ndarray]]:
    """A layer's SiLU-gated MLP (after its ffn_norm)."""
    return [(p + "ffn_gate.weight", w.matrix("ffn_gate", N_FF, N_EMBD)),
            (p + "ffn_up.weight", w.matrix("ffn_up", N_FF, N_EMBD)),
            (p + "ffn_down.weight", w.matrix("ffn_down", N_EMBD, N_FF))]


def tensors(rng: np.random.Generator, n_vocab: int, mlp=dense_mlp, std=None) -> list[tuple[str, np.ndarray]]:
    """(name, float32 array in numpy order [out, in]), in the converter's order; mlp(w, prefix,
    layer) gives a layer's feed-forward tensors (LFM2-MoE's script passes its own)."""
    w = common.RandomWeights(rng, std or STD)
    q_dim, kv_dim = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    out = [("token_embd.weight", w.matrix("token_embd", n_vocab, N_EMBD)),
           ("token_embd_norm.weight", w.norm(N_EMBD))]
    for i, n_kv in enumerate(HEAD_COUNT_KV):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", w.norm(N_EMBD)))
        if n_kv:
            out += [(p + "attn_q.weight", w.matrix("attn_q", q_dim, N_EMBD)),
                    (p + "attn_k.weight", w.matrix("attn_k", kv_dim, N_EMBD)),
                    (p + "attn_v.weight", w.matrix("attn_v", kv_dim, N_EMBD)),
                    (p + "attn_output.weight", w.matrix("attn_output", N_EMBD, q_dim)),
                    (p + "attn_q_norm.weight", w.norm(HEAD_DIM)),
                    (p + "attn_k_norm.weight", w.norm(HEAD_DIM))]
        else:
            out += [(p + "shortconv.in_proj.weight", w.matrix("in_proj", 3 * N_EMBD, N_EMBD)),
                    (p + "shortconv.conv.weight", w.matrix("conv", N_EMBD, L_CACHE)),
                    (p + "shortconv.out_proj.weight", w.matrix("out_proj", N_EMBD, N_EMBD))]
        out.append((p + "ffn_norm.weight", w.norm(N_EMBD)))
        out += mlp(w, p, i)
    return out


def quantize_as(name: str, data: np.ndarray) -> GGMLQuantizationType | None:
    """Matrices in Q8_0, except the convolution kernels (3 taps a row, under Q8_0's block)."""
    return common.q8_0_matrices(name, data) if not name.endswith("shortconv.conv.weight") else None


def write_model(path: Path, arch: str = ARCH, *, seed: int = SEED, mlp=dense_mlp, std=None,
                add_keys=None, quantize=quantize_as) -> None:
    """The model as `arch`, weights from `seed`, each layer's MLP from mlp(w, prefix, layer),
    add_keys(writer): the architecture's own keys (LFM2-MoE's script passes its experts)."""
    tokenizer = common.read_tokenizer_source()
    writer = common.start_model(path, arch, name=f"synthetic-{arch}", n_layer=N_LAYER, n_ctx=CONTEXT_LENGTH,
                                n_embd=N_EMBD, n_ff=N_FF, n_head=N_HEAD, n_head_kv=HEAD_COUNT_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_uint32(f"{arch}.shortconv.l_cache", L_CACHE)
    if add_keys is not None:
        add_keys(writer)
    named = tensors(np.random.default_rng(seed), common.vocab_size(tokenizer), mlp, std)
    common.finish_q8_0_model(writer, tokenizer, named, quantize_as=quantize)


# AVX-512 build, llama.cpp's extra buffer types off
record_golden = functools.partial(common.record_golden, extra_buffer_types=False)

if __name__ == "__main__":
    common.main(sys.argv[1:], __doc__, "lfm2-q8_0", write_model, record_golden)
