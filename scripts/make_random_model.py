"""Random-weight GGUF models at real shapes, for measuring speed at size without real checkpoints.

    python scripts/make_random_model.py llama-3.2-1b q4_k_m            # -> ./llama-3.2-1b-q4_k_m.gguf
    python scripts/make_random_model.py llama-3.1-8b q4_0 -o /tmp/models/
    python scripts/make_random_model.py --list

A file times like the real model of that shape and type mix: the same tensors, shapes
and quantization types (Q4_K_M follows llama.cpp's choice of Q6_K per tensor), the same
vocabulary size.  The weights are random codes written straight into the quantized
blocks, with block scales set so that each matrix has entries of standard deviation
1/sqrt(inputs): every matmul roughly keeps the RMS of its input, so activations stay
finite through the whole depth (norm weights are 1, biases 0).  The output is noise.

The tokenizer is a real one (by default the 512-token BPE vocabulary of
tests/data/synth/llama-bpe-q5_1-tied.gguf; --tokenizer takes any GGUF's), padded with
unused control tokens <|reserved_N|> up to the shape's vocabulary size, so the embedding
and output matrices have the real model's shape.

Tensors are generated and written in chunks of rows, so writing an 8B file takes about
a hundred megabytes of memory, not gigabytes; the random bytes are slices at random
offsets of one pool drawn at the start, which makes it take seconds, not minutes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import (GGML_QUANT_SIZES, ExpertGatingFuncType, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter,
                  LlamaFileType, RopeScalingType)

T = GGMLQuantizationType
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER = ROOT / "tests" / "data" / "synth" / "llama-bpe-q5_1-tied.gguf"
CHUNK_BYTES = 16 << 20      # bytes of one tensor generated at a time
FILLER_TOKEN_TYPE = 3       # CONTROL: never produced by tokenizing text


@dataclass(frozen=True)
class Shape:
    """A model's architecture and hyper-parameters (the GGUF keys and tensor shapes)."""

    arch: str                   # general.architecture: llama, qwen2, gemma3, qwen3moe, deepseek2, gpt-oss,
                                #   lfm2, qwen35
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    tied: bool                  # the output projection is token_embd (no output.weight)
    n_ctx: int = 8192
    rope_base: float = 10000.0
    eps: float = 1e-5
    llama3_rope_factor: float = 0.0   # Llama 3.1+'s rope scaling, stored as a rope_freqs tensor; 0 = none
    sliding_window: int = 0           # Gemma 3's and gpt-oss's local attention window
    # deepseek2 (MLA; head_dim is a query head's nope + rope values, n_head_kv 1 in the file)
    q_lora_rank: int = 0              # 0: a plain attn_q (V2-Lite)
    kv_lora_rank: int = 0             # the latent's width
    rope_dims: int = 0                # the roped values per head (0: the whole head)
    v_head_dim: int = 0
    n_dense_lead: int = 0             # leading dense layers; the rest route to experts
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_expert_shared: int = 0
    yarn_factor: float = 0.0          # YaRN scaling over yarn_orig_ctx (0 = none)
    yarn_orig_ctx: int = 0
    yarn_log_mul: float = 0.0         # rope.scaling.yarn_log_multiplier as the converter writes it
    # hybrids: lfm2 (short convolutions beside attention), qwen35 (Gated DeltaNet beside gated attention)
    attn_layers: tuple[int, ...] = ()   # lfm2: the layers that attend (head_count_kv 0 in the others)
    conv_kernel: int = 0                # lfm2's shortconv.l_cache, qwen35's ssm.conv_kernel
    full_attention_interval: int = 0    # qwen35: every n-th layer attends, the others run the delta rule
    ssm_state: int = 0                  # qwen35: the linear layers' q/k (and value) head size
    ssm_groups: int = 0                 # qwen35: their q/k heads
    ssm_v_heads: int = 0                # qwen35: their value heads
    rope_sections: tuple[int, ...] = ()  # qwen35's M-RoPE sections

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    def is_recurrent(self, layer: int) -> bool:
        """A hybrid's layer without attention (a short convolution or the delta rule)."""
        if self.arch == "lfm2":
            return layer not in self.attn_layers
        return self.arch == "qwen35" and (layer + 1) % self.full_attention_interval != 0

    @property
    def d_inner(self) -> int:
        """qwen35: the linear layers' value channels."""
        return self.ssm_v_heads * self.ssm_state


SHAPES: dict[str, Shape] = {
    "llama-3.2-1b": Shape("llama", 128256, 2048, 16, 8192, 32, 8, 64, tied=True, n_ctx=131072,
                          rope_base=500000.0, llama3_rope_factor=32.0),
    "llama-3.2-3b": Shape("llama", 128256, 3072, 28, 8192, 24, 8, 128, tied=True, n_ctx=131072,
                          rope_base=500000.0, llama3_rope_factor=32.0),
    "llama-3.1-8b": Shape("llama", 128256, 4096, 32, 14336, 32, 8, 128, tied=False, n_ctx=131072,
                          rope_base=500000.0, llama3_rope_factor=8.0),
    "qwen2.5-7b": Shape("qwen2", 152064, 3584, 28, 18944, 28, 4, 128, tied=False, n_ctx=32768,
                        rope_base=1000000.0, eps=1e-6),
    "qwen2.5-0.5b": Shape("qwen2", 151936, 896, 24, 4864, 14, 2, 64, tied=True, n_ctx=32768,
                          rope_base=1000000.0, eps=1e-6),
    "gemma-3-270m": Shape("gemma3", 262144, 640, 18, 2048, 4, 1, 256, tied=True, n_ctx=32768,
                          rope_base=1000000.0, eps=1e-6, sliding_window=512),
    # Qwen3-30B-A3B: 48 layers of 128 experts (8 chosen, 768 wide), q/k norms, untied output
    "qwen3-30b-a3b": Shape("qwen3moe", 151936, 2048, 48, 6144, 32, 4, 128, tied=False, n_ctx=40960,
                           rope_base=1000000.0, eps=1e-6, n_expert=128, n_expert_used=8, n_ff_exp=768),
    "smollm2-135m": Shape("llama", 49152, 576, 30, 1536, 9, 3, 64, tied=True, n_ctx=8192, rope_base=100000.0),
}
SHAPES["qwen2.5-coder-0.5b"] = SHAPES["qwen2.5-0.5b"]   # the same shape
# DeepSeek-V2-Lite (config.json): 27 layers, the first dense, 64 routed experts (6 used, softmax
# gating, no groups) + 2 shared of 1408, MLA with kv_lora_rank 512, heads of 128 + 64 roped values,
# values of 128, no q LoRA; YaRN x40 over 4096, mscale_all_dim 0.707
SHAPES["deepseek-v2-lite"] = Shape("deepseek2", 102400, 2048, 27, 10944, 16, 1, 192, tied=False, n_ctx=163840,
                                   eps=1e-6, kv_lora_rank=512, rope_dims=64, v_head_dim=128, n_dense_lead=1,
                                   n_expert=64, n_expert_used=6, n_ff_exp=1408, n_expert_shared=2,
                                   yarn_factor=40.0, yarn_orig_ctx=4096, yarn_log_mul=0.0707)

# gpt-oss-20b (config.json): 24 layers alternating a 128-token window and full attention,
# 64 query heads of 64 over 8 KV heads (q is 4096 wide over a 2880 stream), biases on
# every projection and one sink logit per head, 32 experts of 2880 (4 used, a router with a
# bias, a bias per expert), untied output; YaRN x32 over 4096, base 150000
SHAPES["gpt-oss-20b"] = Shape("gpt-oss", 201088, 2880, 24, 2880, 64, 8, 64, tied=False, n_ctx=131072,
                              rope_base=150000.0, sliding_window=128, n_expert=32, n_expert_used=4,
                              n_ff_exp=2880, yarn_factor=32.0, yarn_orig_ctx=4096)
# LFM2-1.2B (config.json): 16 layers, attention in 6 (32 heads over 8 of 64), gated short convolutions
# over 3 tokens in the others, an MLP of 8192 (block_ff_dim 12288 auto-adjusted), tied output
SHAPES["lfm2-1.2b"] = Shape("lfm2", 65536, 2048, 16, 8192, 32, 8, 64, tied=True, n_ctx=128000,
                            rope_base=1000000.0, attn_layers=(2, 5, 8, 10, 12, 14), conv_kernel=3)
# Qwen3.5-2B (its text config as we read it): 24 layers, every 4th gated attention (8 heads over 2
# of 256, RoPE over 64 dims), the others Gated DeltaNet (16 q/k and 16 value heads of 128, a 4-tap
# convolution), an MLP of 6144, tied output
SHAPES["qwen3.5-2b"] = Shape("qwen35", 248320, 2048, 24, 6144, 8, 2, 256, tied=True, n_ctx=262144,
                             rope_base=10000000.0, eps=1e-6, rope_dims=64, full_attention_interval=4,
                             conv_kernel=4, ssm_state=128, ssm_groups=16, ssm_v_heads=16,
                             rope_sections=(11, 11, 10, 0))

# mix -> (the type of most matrices, general.file_type)
MIXES: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "q4_k_m": (T.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "q4_0": (T.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q8_0": (T.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "f16": (T.F16, LlamaFileType.MOSTLY_F16),
    "mxfp4_moe": (T.Q8_0, LlamaFileType.MOSTLY_MXFP4_MOE),   # expert stacks MXFP4, the rest as q8_0
}

# llama.cpp's replacement for a type whose block does not divide a row
FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}


# ---------------------------------------------------------------- which type each matrix gets

def use_more_bits(layer: int, n_layer: int) -> bool:
    """The layers whose attn_v and ffn_down Q4_K_M stores in Q6_K (llama.cpp's rule):
    the first and last eighth, and every third layer between them."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def block_size(qtype: GGMLQuantizationType) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def matrix_type(mix: str, role: str, n_in: int, layer: int = 0, n_layer: int = 1,
                expert: bool = False) -> GGMLQuantizationType:
    """The type llama-quantize gives a matrix of `n_in` columns for `mix`.

    role: "output" (output.weight, or token_embd when it is also the output), "attn_v",
    "ffn_down" (with their layer), "router" and "f32" (kept float32), or anything else for the
    rest; `expert`: a MoE's expert stack."""
    base = MIXES[mix][0]
    if role in ("router", "f32"):     # routers and convolution taps stay float32 in llama.cpp's mixes
        return T.F32
    if expert and mix == "mxfp4_moe":
        return T.MXFP4
    if base == T.F16:                 # llama.cpp converts every matrix alike for a float type
        return T.F16
    qtype = base
    if role == "output":
        qtype = T.Q8_0 if n_in % block_size(base) or base == T.Q8_0 else T.Q6_K
    elif mix == "q4_k_m" and role in ("attn_v", "ffn_down") and use_more_bits(layer, n_layer):
        qtype = T.Q6_K
    if n_in % block_size(qtype):
        qtype = FALLBACK.get(qtype, T.F16)
        if n_in % block_size(qtype):
            qtype = T.F16
    return qtype


# ---------------------------------------------------------------- random blocks

def fp16_bytes(value: float) -> np.ndarray:
    return np.array([value], dtype=np.float16).view(np.uint8)


def q4_k_scale_bytes(scale: int, minimum: int) -> np.ndarray:
    """The 12 bytes of Q4_K's 6-bit scales and mins, the same pair for all 8 sub-blocks.
    Sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
    sub-blocks 4-7 put the low 4 bits in bytes 8-11 and the top 2 in the top bits of 0-7."""
    out = np.zeros(12, dtype=np.uint8)
    out[0:4] = (scale & 63) | ((scale >> 4) << 6)
    out[4:8] = (minimum & 63) | ((minimum >> 4) << 6)
    out[8:12] = (scale & 15) | ((minimum & 15) << 4)
    return out


def block_header(qtype: GGMLQuantizationType, sigma: float) -> list[tuple[int, np.ndarray]]:
    """(offset, bytes) to write into every block of `qtype` so that its values, with random
    codes elsewhere, have mean ~0 and standard deviation ~sigma."""
    if qtype in (T.Q4_0, T.Q5_0, T.Q8_0):
        # code - offset is uniform over 16 / 32 / 256 values: RMS sqrt((n^2 - 1)/12 + 1/4)
        levels = {T.Q4_0: 16, T.Q5_0: 32, T.Q8_0: 256}[qtype]
        return [(0, fp16_bytes(sigma / math.sqrt((levels ** 2 - 1) / 12 + 0.25)))]
    if qtype == T.Q4_K:
        # value = d * 16 * q - dmin * 30 with dmin = 4 d: 16 * (q - 7.5), q uniform in 0..15
        d = np.float16(sigma / (16 * math.sqrt(255 / 12)))
        return [(0, fp16_bytes(d)), (2, fp16_bytes(4 * float(d))), (4, q4_k_scale_bytes(16, 30))]
    if qtype == T.Q6_K:
        # ql[128] qh[64] scales[16] d: value = d * 4 * (q - 32), q uniform in 0..63
        d = sigma / (4 * math.sqrt(4095 / 12 + 0.25))
        return [(192, np.full(16, 4, dtype=np.uint8)), (208, fp16_bytes(d))]
    if qtype == T.MXFP4:
        # e[1] qs[16]: value = E2M1 code (0, +-0.5 .. +-6, RMS sqrt(34.25) / 2) * 2^(e - 127)
        e = 127 + round(math.log2(sigma / (math.sqrt(34.25) / 2)))
        return [(0, np.array([e], dtype=np.uint8))]
    raise ValueError(f"no random blocks for {qtype.name}")


class RandomBytes:
    """Random bytes, fast: slices at random offsets of one pool drawn once (drawing fresh
    bytes for every block took most of the time of writing an 8B file)."""

    def __init__(self, rng: np.random.Generator, size: int = 4 * CHUNK_BYTES) -> None:
        self.rng, self.size = rng, size
        self.pool = rng.integers(0, 256, size, dtype=np.uint8)
        self.normal_pools: dict[float, np.ndarray] = {}   # sigma -> float16 N(0, sigma^2) values

    def slice(self, pool: np.ndarray, n: int) -> np.ndarray:
        start = int(self.rng.integers(0, pool.size - n + 1))
        return pool[start:start + n].copy()

    def take(self, n: int) -> np.ndarray:
        """n random bytes."""
        if n > self.pool.size // 2:
            return self.rng.integers(0, 256, n, dtype=np.uint8)
        return self.slice(self.pool, n)

    def normal_f16(self, n: int, sigma: float) -> np.ndarray:
        """n float16 values of N(0, sigma^2)."""
        if sigma not in self.normal_pools:   # (a small model's need makes a small pool)
            normal = self.rng.standard_normal(min(self.size // 2, 4 * n), dtype=np.float32) * sigma
            self.normal_pools[sigma] = normal.astype(np.float16)
        pool = self.normal_pools[sigma]
        if n > pool.size // 2:
            return (self.rng.standard_normal(n, dtype=np.float32) * sigma).astype(np.float16)
        return self.slice(pool, n)


def random_rows(qtype: GGMLQuantizationType, n_rows: int, n_in: int, sigma: float,
                random: RandomBytes) -> np.ndarray:
    """n_rows rows of n_in random weights of standard deviation ~sigma, as the bytes of `qtype`."""
    if qtype == T.F16:
        return random.normal_f16(n_rows * n_in, sigma).view(np.uint8).reshape(n_rows, -1)
    if qtype == T.F32:
        return random.normal_f16(n_rows * n_in, sigma).astype(np.float32).view(np.uint8).reshape(n_rows, -1)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = random.take(n_rows * n_in // block * block_bytes).reshape(-1, block_bytes)
    for offset, header in block_header(qtype, sigma):
        blocks[:, offset:offset + header.size] = header
    return blocks.reshape(n_rows, -1)


def row_bytes(qtype: GGMLQuantizationType, n_in: int) -> int:
    if qtype == T.F32:
        return 4 * n_in
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    return n_in // block * block_bytes


class StreamedMatrix:
    """A random [n_out, n_in] matrix that GGUFWriter.write_tensor_data writes without
    holding it whole: the writer asks only for nbytes and tofile(file)."""

    def __init__(self, qtype: GGMLQuantizationType, n_out: int, n_in: int, sigma: float, random: RandomBytes):
        self.qtype, self.n_out, self.n_in, self.sigma, self.random = qtype, n_out, n_in, sigma, random
        self.nbytes = n_out * row_bytes(qtype, n_in)

    def tofile(self, fout) -> None:
        rows_per_chunk = max(1, CHUNK_BYTES // row_bytes(self.qtype, self.n_in))
        for start in range(0, self.n_out, rows_per_chunk):
            n_rows = min(rows_per_chunk, self.n_out - start)
            random_rows(self.qtype, n_rows, self.n_in, self.sigma, self.random).tofile(fout)


# ---------------------------------------------------------------- the model's tensors

@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]          # numpy order: [n_out, n_in] for a matrix, [E, n_out, n_in] for a stack
    role: str = "matrix"            # matrix type rule (see matrix_type); "norm", "zeros" or "data" for F32 vectors
    layer: int = 0
    expert: bool = False            # a MoE's stack of expert matrices
    data: np.ndarray | None = None  # a "data" vector's values


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """Llama 3.1's per-frequency rope divisors (original context 8192, low / high
    frequency factors 1 and 4): long wavelengths are slowed by the factor, short ones
    kept, those between blended."""
    old_ctx, low, high, factor = 8192, 1.0, 4.0, shape.llama3_rope_factor
    freqs = shape.rope_base ** -(np.arange(0, shape.head_dim, 2, dtype=np.float64) / shape.head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, blended))
    return out.astype(np.float32)


def deepseek2_layer(s: Shape, i: int) -> Iterator[TensorSpec]:
    """One DeepSeek-2 layer: MLA's projections (the split attn_k_b / attn_v_b of current
    converters), then a dense MLP or the routed and shared experts (stacks [E, out, in])."""
    p, nope = f"blk.{i}.", s.head_dim - s.rope_dims
    yield TensorSpec(p + "attn_norm.weight", (s.n_embd,), "norm")
    if s.q_lora_rank:
        yield TensorSpec(p + "attn_q_a.weight", (s.q_lora_rank, s.n_embd), layer=i)
        yield TensorSpec(p + "attn_q_a_norm.weight", (s.q_lora_rank,), "norm")
        yield TensorSpec(p + "attn_q_b.weight", (s.q_dim, s.q_lora_rank), layer=i)
    else:
        yield TensorSpec(p + "attn_q.weight", (s.q_dim, s.n_embd), layer=i)
    yield TensorSpec(p + "attn_kv_a_mqa.weight", (s.kv_lora_rank + s.rope_dims, s.n_embd), layer=i)
    yield TensorSpec(p + "attn_kv_a_norm.weight", (s.kv_lora_rank,), "norm")
    yield TensorSpec(p + "attn_k_b.weight", (s.n_head, s.kv_lora_rank, nope), layer=i)
    yield TensorSpec(p + "attn_v_b.weight", (s.n_head, s.v_head_dim, s.kv_lora_rank), "attn_v", layer=i)
    yield TensorSpec(p + "attn_output.weight", (s.n_embd, s.n_head * s.v_head_dim), layer=i)
    yield TensorSpec(p + "ffn_norm.weight", (s.n_embd,), "norm")
    if i < s.n_dense_lead:
        yield TensorSpec(p + "ffn_gate.weight", (s.n_ff, s.n_embd), layer=i)
        yield TensorSpec(p + "ffn_up.weight", (s.n_ff, s.n_embd), layer=i)
        yield TensorSpec(p + "ffn_down.weight", (s.n_embd, s.n_ff), "ffn_down", layer=i)
        return
    n_sh = s.n_ff_exp * s.n_expert_shared
    yield from expert_tensors(s, p, i)
    yield TensorSpec(p + "ffn_gate_shexp.weight", (n_sh, s.n_embd), layer=i)
    yield TensorSpec(p + "ffn_up_shexp.weight", (n_sh, s.n_embd), layer=i)
    yield TensorSpec(p + "ffn_down_shexp.weight", (s.n_embd, n_sh), "ffn_down", layer=i)


def gpt_oss_layer(s: Shape, i: int) -> Iterator[TensorSpec]:
    """One gpt-oss layer: biased attention projections and sinks, then the biased router and
    expert stacks (the expert biases are [E, n] float32)."""
    p = f"blk.{i}."
    yield TensorSpec(p + "attn_norm.weight", (s.n_embd,), "norm")
    for name, n_out in (("attn_q", s.q_dim), ("attn_k", s.kv_dim), ("attn_v", s.kv_dim)):
        yield TensorSpec(p + f"{name}.weight", (n_out, s.n_embd), "attn_v" if name == "attn_v" else "matrix", i)
        yield TensorSpec(p + f"{name}.bias", (n_out,), "zeros")
    yield TensorSpec(p + "attn_output.weight", (s.n_embd, s.q_dim), layer=i)
    yield TensorSpec(p + "attn_output.bias", (s.n_embd,), "zeros")
    yield TensorSpec(p + "attn_sinks.weight", (s.n_head,), "zeros")
    yield TensorSpec(p + "post_attention_norm.weight", (s.n_embd,), "norm")
    yield from expert_tensors(s, p, i)
    yield TensorSpec(p + "ffn_gate_inp.bias", (s.n_expert,), "zeros")
    for name, n_out in (("ffn_gate_exps", s.n_ff_exp), ("ffn_up_exps", s.n_ff_exp), ("ffn_down_exps", s.n_embd)):
        yield TensorSpec(p + f"{name}.bias", (s.n_expert, n_out), "zeros")
def lfm2_mixer(s: Shape, i: int) -> Iterator[TensorSpec]:
    """An LFM2 layer's attention (q/k head norms) or short convolution (B, C, x; taps F32)."""
    p = f"blk.{i}."
    if s.is_recurrent(i):
        yield TensorSpec(p + "shortconv.conv.weight", (s.n_embd, s.conv_kernel), "f32", layer=i)
        yield TensorSpec(p + "shortconv.in_proj.weight", (3 * s.n_embd, s.n_embd), layer=i)
        yield TensorSpec(p + "shortconv.out_proj.weight", (s.n_embd, s.n_embd), layer=i)
        return
    yield TensorSpec(p + "attn_q.weight", (s.q_dim, s.n_embd), layer=i)
    yield TensorSpec(p + "attn_k.weight", (s.kv_dim, s.n_embd), layer=i)
    yield TensorSpec(p + "attn_v.weight", (s.kv_dim, s.n_embd), "attn_v", layer=i)
    yield TensorSpec(p + "attn_q_norm.weight", (s.head_dim,), "norm")
    yield TensorSpec(p + "attn_k_norm.weight", (s.head_dim,), "norm")
    yield TensorSpec(p + "attn_output.weight", (s.n_embd, s.q_dim), layer=i)


def qwen35_mixer(s: Shape, i: int) -> Iterator[TensorSpec]:
    """A Qwen3.5 layer's gated attention (each query head then its gate) or Gated DeltaNet
    (q, k, v through the F32 conv taps; decays -1, dt biases 0)."""
    p = f"blk.{i}."
    if not s.is_recurrent(i):
        yield TensorSpec(p + "attn_q.weight", (2 * s.q_dim, s.n_embd), layer=i)
        yield TensorSpec(p + "attn_k.weight", (s.kv_dim, s.n_embd), layer=i)
        yield TensorSpec(p + "attn_v.weight", (s.kv_dim, s.n_embd), "attn_v", layer=i)
        yield TensorSpec(p + "attn_output.weight", (s.n_embd, s.q_dim), layer=i)
        yield TensorSpec(p + "attn_q_norm.weight", (s.head_dim,), "norm")
        yield TensorSpec(p + "attn_k_norm.weight", (s.head_dim,), "norm")
        return
    channels = 2 * s.ssm_groups * s.ssm_state + s.d_inner
    yield TensorSpec(p + "attn_qkv.weight", (channels, s.n_embd), layer=i)
    yield TensorSpec(p + "attn_gate.weight", (s.d_inner, s.n_embd), layer=i)
    yield TensorSpec(p + "ssm_conv1d.weight", (channels, s.conv_kernel), "f32", layer=i)
    yield TensorSpec(p + "ssm_dt.bias", (s.ssm_v_heads,), "zeros")
    yield TensorSpec(p + "ssm_a", (s.ssm_v_heads,), "data", data=np.full(s.ssm_v_heads, -1.0, np.float32))
    yield TensorSpec(p + "ssm_beta.weight", (s.ssm_v_heads, s.n_embd), layer=i)
    yield TensorSpec(p + "ssm_alpha.weight", (s.ssm_v_heads, s.n_embd), layer=i)
    yield TensorSpec(p + "ssm_norm.weight", (s.ssm_state,), "norm")
    yield TensorSpec(p + "ssm_out.weight", (s.n_embd, s.d_inner), layer=i)


def hybrid_tensors(s: Shape) -> Iterator[TensorSpec]:
    """lfm2's and qwen35's tensors: each layer's mixer, then its norm and MLP (LFM2's final
    norm is token_embd_norm; Qwen3.5 names its second norm post_attention_norm)."""
    yield TensorSpec("token_embd.weight", (s.n_vocab, s.n_embd), "output" if s.tied else "token_embd")
    yield TensorSpec("token_embd_norm.weight" if s.arch == "lfm2" else "output_norm.weight", (s.n_embd,), "norm")
    mixer, second_norm = (lfm2_mixer, "ffn_norm") if s.arch == "lfm2" else (qwen35_mixer, "post_attention_norm")
    for i in range(s.n_layer):
        p = f"blk.{i}."
        yield TensorSpec(p + "attn_norm.weight", (s.n_embd,), "norm")
        yield from mixer(s, i)
        yield TensorSpec(p + f"{second_norm}.weight", (s.n_embd,), "norm")
        yield TensorSpec(p + "ffn_gate.weight", (s.n_ff, s.n_embd), layer=i)
        yield TensorSpec(p + "ffn_up.weight", (s.n_ff, s.n_embd), layer=i)
        yield TensorSpec(p + "ffn_down.weight", (s.n_embd, s.n_ff), "ffn_down", layer=i)


def model_tensors(shape: Shape) -> Iterator[TensorSpec]:
    """The tensors of `shape`'s architecture, in llama.cpp's usual file order."""
    s = shape
    if s.arch in ("lfm2", "qwen35"):
        yield from hybrid_tensors(s)
        return
    if s.arch in ("deepseek2", "gpt-oss"):
        layer = deepseek2_layer if s.arch == "deepseek2" else gpt_oss_layer
        yield TensorSpec("token_embd.weight", (s.n_vocab, s.n_embd), "token_embd")
        yield TensorSpec("output_norm.weight", (s.n_embd,), "norm")
        yield TensorSpec("output.weight", (s.n_vocab, s.n_embd), "output")
        for i in range(s.n_layer):
            yield from layer(s, i)
        return
    yield TensorSpec("token_embd.weight", (s.n_vocab, s.n_embd), "output" if s.tied else "token_embd")
    if s.llama3_rope_factor:
        yield TensorSpec("rope_freqs.weight", (s.head_dim // 2,), "data", data=llama3_rope_factors(s))
    yield TensorSpec("output_norm.weight", (s.n_embd,), "norm")
    if not s.tied:
        yield TensorSpec("output.weight", (s.n_vocab, s.n_embd), "output")
    for i in range(s.n_layer):
        p = f"blk.{i}."
        yield TensorSpec(p + "attn_norm.weight", (s.n_embd,), "norm")
        yield TensorSpec(p + "attn_q.weight", (s.q_dim, s.n_embd), layer=i)
        yield TensorSpec(p + "attn_k.weight", (s.kv_dim, s.n_embd), layer=i)
        yield TensorSpec(p + "attn_v.weight", (s.kv_dim, s.n_embd), "attn_v", layer=i)
        if s.arch == "qwen2":
            yield TensorSpec(p + "attn_q.bias", (s.q_dim,), "zeros")
            yield TensorSpec(p + "attn_k.bias", (s.kv_dim,), "zeros")
            yield TensorSpec(p + "attn_v.bias", (s.kv_dim,), "zeros")
        if s.arch in ("gemma3", "qwen3moe"):
            yield TensorSpec(p + "attn_q_norm.weight", (s.head_dim,), "norm")
            yield TensorSpec(p + "attn_k_norm.weight", (s.head_dim,), "norm")
        yield TensorSpec(p + "attn_output.weight", (s.n_embd, s.q_dim), layer=i)
        if s.arch == "gemma3":
            yield TensorSpec(p + "post_attention_norm.weight", (s.n_embd,), "norm")
        yield TensorSpec(p + "ffn_norm.weight", (s.n_embd,), "norm")
        if s.n_expert:
            yield from expert_tensors(s, p, i)
        else:
            yield TensorSpec(p + "ffn_gate.weight", (s.n_ff, s.n_embd), layer=i)
            yield TensorSpec(p + "ffn_up.weight", (s.n_ff, s.n_embd), layer=i)
            yield TensorSpec(p + "ffn_down.weight", (s.n_embd, s.n_ff), "ffn_down", layer=i)
        if s.arch == "gemma3":
            yield TensorSpec(p + "post_ffw_norm.weight", (s.n_embd,), "norm")


def expert_tensors(s: Shape, p: str, i: int) -> Iterator[TensorSpec]:
    """A MoE layer's router and expert stacks (llama.cpp's names; ffn_down_exps takes
    ffn_down's type rule, as llama-quantize matches it by name)."""
    yield TensorSpec(p + "ffn_gate_inp.weight", (s.n_expert, s.n_embd), "router", layer=i)
    yield TensorSpec(p + "ffn_gate_exps.weight", (s.n_expert, s.n_ff_exp, s.n_embd), layer=i, expert=True)
    yield TensorSpec(p + "ffn_up_exps.weight", (s.n_expert, s.n_ff_exp, s.n_embd), layer=i, expert=True)
    yield TensorSpec(p + "ffn_down_exps.weight", (s.n_expert, s.n_embd, s.n_ff_exp), "ffn_down", layer=i,
                     expert=True)


def vector_data(spec: TensorSpec) -> np.ndarray:
    if spec.role == "data":
        return spec.data
    fill = 1.0 if spec.role == "norm" else 0.0
    return np.full(spec.shape, fill, dtype=np.float32)


# ---------------------------------------------------------------- keys and tokenizer

def add_hyper_parameters(writer: GGUFWriter, shape: Shape, name: str, mix: str) -> None:
    s = shape
    writer.add_name(name)
    writer.add_block_count(s.n_layer)
    writer.add_context_length(s.n_ctx)
    writer.add_embedding_length(s.n_embd)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_head)
    if s.arch == "lfm2":     # per layer: 0 marks a short convolution
        writer.add_head_count_kv([0 if s.is_recurrent(i) else s.n_head_kv for i in range(s.n_layer)])
    else:
        writer.add_head_count_kv(s.n_head_kv)
    if s.arch == "deepseek2":
        add_mla_parameters(writer, s)
    else:
        writer.add_key_length(s.head_dim)
        writer.add_value_length(s.head_dim)
    writer.add_layer_norm_rms_eps(s.eps)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_rope_dimension_count(s.rope_dims or s.head_dim)
    if s.sliding_window:
        writer.add_sliding_window(s.sliding_window)
    if s.arch == "gpt-oss":
        add_yarn(writer, s)
    add_hybrid_parameters(writer, s)
    if s.n_expert:
        writer.add_expert_count(s.n_expert)
        writer.add_expert_used_count(s.n_expert_used)
        writer.add_expert_feed_forward_length(s.n_ff_exp)
    writer.add_vocab_size(s.n_vocab)
    writer.add_file_type(int(MIXES[mix][1]))
    writer.add_quantization_version(2)


def add_hybrid_parameters(writer: GGUFWriter, s: Shape) -> None:
    """lfm2's convolution window; qwen35's layer pattern, delta-rule sizes and rope sections."""
    if s.arch == "lfm2":
        writer.add_shortconv_l_cache(s.conv_kernel)
    elif s.arch == "qwen35":
        writer.add_full_attention_interval(s.full_attention_interval)
        writer.add_ssm_conv_kernel(s.conv_kernel)
        writer.add_ssm_inner_size(s.d_inner)
        writer.add_ssm_state_size(s.ssm_state)
        writer.add_ssm_time_step_rank(s.ssm_v_heads)
        writer.add_ssm_group_count(s.ssm_groups)
        writer.add_rope_dimension_sections(list(s.rope_sections))


def add_mla_parameters(writer: GGUFWriter, s: Shape) -> None:
    """DeepSeek-2's keys as current converters write them: key/value_length are the absorbed
    single KV head (latent + rope, latent), *_mla the per-head sizes; shared experts and
    gating (the expert counts are add_hyper_parameters'); YaRN."""
    writer.add_key_length(s.kv_lora_rank + s.rope_dims)
    writer.add_value_length(s.kv_lora_rank)
    writer.add_key_length_mla(s.head_dim)
    writer.add_value_length_mla(s.v_head_dim)
    if s.q_lora_rank:
        writer.add_q_lora_rank(s.q_lora_rank)
    writer.add_kv_lora_rank(s.kv_lora_rank)
    writer.add_leading_dense_block_count(s.n_dense_lead)
    writer.add_expert_shared_count(s.n_expert_shared)
    writer.add_expert_weights_scale(1.0)
    writer.add_expert_weights_norm(False)
    writer.add_expert_gating_func(ExpertGatingFuncType.SOFTMAX)
    add_yarn(writer, s)


def add_yarn(writer: GGUFWriter, s: Shape) -> None:
    if s.yarn_factor:
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(s.yarn_factor)
        writer.add_rope_scaling_orig_ctx_len(s.yarn_orig_ctx)
        if s.yarn_log_mul:
            writer.add_rope_scaling_yarn_log_mul(s.yarn_log_mul)


def add_tokenizer(writer: GGUFWriter, source: Path, n_vocab: int) -> None:
    """Every tokenizer.* key of the GGUF `source`, its per-token arrays padded with unused
    control tokens <|reserved_N|> to n_vocab entries."""
    reader = GGUFReader(source)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    if len(tokens) > n_vocab:
        raise ValueError(f"{source}: its {len(tokens)} tokens do not fit a vocabulary of {n_vocab}")
    known = set(tokens)
    fillers = [t for t in (f"<|reserved_{i}|>" for i in range(len(tokens), 2 * n_vocab)) if t not in known]
    fillers = fillers[:n_vocab - len(tokens)]
    padding = {"tokenizer.ggml.tokens": fillers,
               "tokenizer.ggml.token_type": [FILLER_TOKEN_TYPE] * len(fillers),
               "tokenizer.ggml.scores": [0.0] * len(fillers)}
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value_type = field.types[0]
        element_type = field.types[1] if value_type == GGUFValueType.ARRAY else None
        value = field.contents()
        if key in padding:
            value = list(value) + padding[key]
        writer.add_key_value(key, value, value_type, sub_type=element_type)


# ---------------------------------------------------------------- writing

def write_model(path: str | os.PathLike, shape: Shape, mix: str, *, name: str = "random",
                tokenizer: str | os.PathLike = DEFAULT_TOKENIZER, seed: int = 0) -> Path:
    """Write a random-weight GGUF of `shape` in type mix `mix` to `path`."""
    if mix not in MIXES:
        raise ValueError(f"unknown type mix {mix!r}; choose one of {', '.join(MIXES)}")
    path = Path(path)
    random = RandomBytes(np.random.default_rng(seed))
    writer = GGUFWriter(path, shape.arch)
    add_hyper_parameters(writer, shape, name, mix)
    add_tokenizer(writer, Path(tokenizer), shape.n_vocab)
    data = []
    n_layer = shape.n_layer
    for spec in model_tensors(shape):
        if len(spec.shape) == 1 or spec.role == "zeros":
            vector = vector_data(spec)
            writer.add_tensor_info(spec.name, vector.shape, vector.dtype, vector.nbytes)
            data.append(vector)
            continue
        *stack, n_out, n_in = spec.shape        # a stack [E, n_out, n_in] is written as E * n_out rows
        qtype = matrix_type(mix, spec.role, n_in, spec.layer, n_layer, spec.expert)
        matrix = StreamedMatrix(qtype, n_out * math.prod(stack), n_in, 1.0 / math.sqrt(n_in), random)
        writer.add_tensor_info(spec.name, (*stack, n_out, row_bytes(qtype, n_in)), np.dtype(np.uint8), matrix.nbytes,
                               raw_dtype=qtype)
        data.append(matrix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in data:
        writer.write_tensor_data(tensor)
    writer.close()
    return path


def parse_spec(spec: str) -> tuple[str, str]:
    """'llama-3.2-1b:q4_k_m' -> (shape name, mix); the mix defaults to q4_k_m."""
    shape_name, _, mix = spec.partition(":")
    mix = mix.lower() or "q4_k_m"
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r}; choose one of {', '.join(SHAPES)}")
    if mix not in MIXES:
        raise ValueError(f"unknown type mix {mix!r}; choose one of {', '.join(MIXES)}")
    return shape_name, mix


def cached_model(spec: str, out_dir: str | os.PathLike | None = None) -> Path:
    """The file of `spec` ('shape:mix') under out_dir (default <pyengine cache>/random/),
    written there first if it is not yet (atomically: a half-written file is never seen)."""
    shape_name, mix = parse_spec(spec)
    if out_dir is None:
        from pyengine.store import cache_dir
        out_dir = cache_dir() / "random"
    out_dir = Path(out_dir)
    path = out_dir / f"{shape_name}-{mix}.gguf"
    if path.exists():
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=path.name, suffix=".part")
    os.close(fd)
    try:
        write_model(tmp, SHAPES[shape_name], mix, name=f"random {shape_name}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", nargs="?", help="a shape name (see --list)")
    ap.add_argument("mix", nargs="?", default="q4_k_m", help=f"type mix: {', '.join(MIXES)} (default q4_k_m)")
    ap.add_argument("-o", "--out", help="output file, or a directory for <shape>-<mix>.gguf (default: here)")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="GGUF whose tokenizer to copy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--list", action="store_true", help="list the shapes and exit")
    args = ap.parse_args(argv)
    if args.list or not args.shape:
        for name, s in SHAPES.items():
            print(f"{name:<20} {s.arch:<7} layers {s.n_layer:>2}  embd {s.n_embd:>5}  ff {s.n_ff:>5}  "
                  f"heads {s.n_head}/{s.n_head_kv}  vocab {s.n_vocab}{'  tied' if s.tied else ''}")
        return 0
    try:
        shape_name, mix = parse_spec(f"{args.shape}:{args.mix}")
    except ValueError as e:
        ap.error(str(e))
    out = Path(args.out or ".")
    if out.is_dir() or not out.suffix:
        out = out / f"{shape_name}-{mix}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_model(out, SHAPES[shape_name], mix, name=f"random {shape_name}", tokenizer=args.tokenizer, seed=args.seed)
    print(f"{out}: {out.stat().st_size / 1e9:.3f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
