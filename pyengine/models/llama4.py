"""Llama 4's text model (Scout, Maverick): Llama's pre-norm blocks with, in
groups of four layers, three RoPE layers attending within chunks of 8192
tokens (a token sees only the earlier tokens of its own chunk) and one NoPE
layer that sees everything, its queries scaled by the attention temperature
log(floor((pos + 1) / 8192) + 1) * 0.1 + 1; the RoPE layers' q and k
RMS-normed without weights after RoPE (the L2 norm, except in the 128-expert
Maverick); every `interleave_moe_layer_step`-th layer a mixture of experts:
the router's top `expert_used_count` (one) expert, its input scaled by the
sigmoid of its router logit before it runs, plus a shared expert on the
unscaled input; the other layers a dense SiLU-gated MLP.  A file with
`attention.sliding_window` 0 has neither chunks nor NoPE layers, as
llama.cpp reads it.  GGUF `llama4`.

Chunks: the RoPE layers' cache group is chunked (kvcache/causal.py), so a
token's mask holds only its own chunk's cells and the cells of past chunks are
freed as a sliding window's are; the NoPE layers keep every cell."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pyengine.errors import UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module
from pyengine.models.config import ROPE_NORMAL
from pyengine.models.registry import register

# llama.cpp fixes these for Llama 4 (the file has no keys for them)
CHUNK = 8192                 # attention chunk of the RoPE layers
NO_ROPE_STEP = 4             # every 4th layer is NoPE
TEMP_FLOOR, TEMP_SCALE, TEMP_OFFSET = 8192, 0.1, 1.0
N_EXPERT_NO_KQ_NORM = 128    # Maverick (17B-128E) has no q/k L2 norm
F32 = np.float32


def temperature_table(n: int) -> np.ndarray:
    """[n] the NoPE layers' query factor at positions 0..n-1, as llama.cpp's
    attention-temperature input computes it: log(floor((pos + 1) / 8192) + 1) * 0.1 + 1
    (the division in float, the rest in double), stored as float."""
    steps = np.floor((np.arange(n, dtype=F32) + F32(TEMP_OFFSET)) / F32(TEMP_FLOOR))
    values, which = np.unique(steps, return_inverse=True)
    factors = np.array([math.log(float(s) + 1.0) * float(F32(TEMP_SCALE)) + 1.0 for s in values])
    return factors[which].astype(F32)


@dataclass(frozen=True)
class Llama4Config(common.ExpertsConfig):
    n_moe_step: int = 1          # every n-th layer (1-based) has experts
    chunked: bool = True         # chunked RoPE layers, NoPE layers every NO_ROPE_STEP-th
    kq_norm: bool = True

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Llama4Config":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, eps_default=None)
        experts = cls.experts_from_gguf(f, n_ff_exp=f.get_int(key("expert_feed_forward_length")))
        kw.update(experts, norm_expert_weights=False, n_ff_shexp=experts["n_ff_exp"],
                  n_moe_step=f.get_int(key("interleave_moe_layer_step")),
                  chunked=f.get_int(key("attention.sliding_window"), CHUNK) != 0,
                  kq_norm=experts["n_expert"] != N_EXPERT_NO_KQ_NORM)
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("interleave_moe_layer_step", self.n_moe_step, 1, self.n_layer)
        self.check_experts()
        if self.n_expert_used != 1:   # llama.cpp scales the input by the weight: one expert only
            raise UnsupportedError(f"expert_used_count {self.n_expert_used}: Llama 4 routes to one expert")
        common.check_range("feed_forward_length", self.n_ff, 1, 1 << 20)

    def cache_layout(self) -> list[nn.CacheSpec]:
        return [nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim, window=CHUNK if self.is_chunked(i) else 0,
                             chunked=self.is_chunked(i))
                for i in range(self.n_layer)]

    def is_chunked(self, layer: int) -> bool:
        return self.chunked and self.uses_rope(layer)

    def is_moe(self, layer: int) -> bool:
        return (layer + 1) % self.n_moe_step == 0

    def uses_rope(self, layer: int) -> bool:
        return not self.chunked or (layer + 1) % NO_ROPE_STEP != 0

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        """RoPE on the RoPE layers, x as it is on the NoPE ones (a context shift moves
        nothing there)."""
        return super().layer_rope(ctx, x, positions, layer, freq_factors) if self.uses_rope(layer) else x


@dataclass(eq=False)
class Attention(common.Attention):
    """RoPE then the weightless q/k RMS norm on the RoPE layers; on the NoPE layers
    no rope, the queries times the per-token temperature."""

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        c = self.cfg
        q, k, v = self.project(ctx, x)                                              # [hd, H|Hkv, T]
        q, k = self.position(ctx, q, k, batch.positions, layer, inputs.freq_factors)
        if c.uses_rope(layer):
            if c.kq_norm:
                q, k = ctx.rms_norm(q, None, c.eps), ctx.rms_norm(k, None, c.eps)
        elif inputs.q_factor is not None:
            q = ctx.mul(q, inputs.q_factor)                                         # [hd, H, T] x [1, 1, T]
        o = nn.attention(ctx, batch, layer, q, ctx.reshape(k, (c.kv_dim, -1)), v,
                         n_head_kv=c.n_head_kv, scale=c.attn_scale)                 # [hd*H, T]
        return self.attn_output(ctx, o)


@dataclass(eq=False)
class MoE(Module):
    """The router's best expert on its input scaled by sigmoid(its logit), plus
    the shared expert on the unscaled input."""

    routed: common.SoftmaxExperts = module()   # (its stacks; Llama 4 routes here, not by softmax)
    shared: common.SharedExpert = module()

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        c, n_tokens = self.cfg, x.shape[1]
        logits = self.routed.ffn_gate_inp(ctx, x)                                   # [E, T]
        chosen = ctx.topk(logits, 1)                                                # i32 [1, T]
        weight = ctx.moe_sigmoid_weights(logits, chosen, False)                     # [1, T]
        scaled_x = ctx.mul(ctx.reshape(x, (c.n_embd, 1, n_tokens)), ctx.reshape(weight, (1, 1, n_tokens)))
        routed = ctx.reshape(self.routed.experts(ctx, scaled_x, chosen), (c.n_embd, n_tokens))
        return ctx.add(routed, self.shared(ctx, x))


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: Attention = module()


@dataclass(eq=False)
class MoeBlock(Block):
    mlp: MoE = module()


def block_kind(cfg: Llama4Config, layer: int) -> type:
    return MoeBlock if cfg.is_moe(layer) else Block


@register("llama4")
@dataclass(eq=False)
class Llama4(common.Decoder):
    Config = Llama4Config

    layers: list[Block] = blocks("blk", kind=block_kind)

    def layer_inputs(self, ctx: Context, batch) -> common.LayerInputs:
        c = self.cfg
        n = common.context_per_sequence(batch)
        q_factor = None
        if c.chunked:
            table = ctx.input(temperature_table(n), "attn_temp", (1, n))
            q_factor = ctx.reshape(ctx.get_rows(table, batch.positions), (1, 1, -1))   # [1, 1, T]
        return common.LayerInputs(freq_factors=self.freq_factors(ctx), q_factor=q_factor)
