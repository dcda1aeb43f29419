"""Qwen2: Llama with biases on the q/k/v projections and NeoX-style RoPE.
GGUF `general.architecture = qwen2`.

This file also holds the attention the other non-llama architectures share
(Qwen3, Qwen3-MoE, Gemma 2/3, Phi-3): `SelfAttention` ropes, attends over the
cache and projects out; subclasses only say how q, k and v are projected.
What differs per layer (rope base, query scale, score soft-cap, window) is
asked of the config (`AttentionConfig`), so no layer class branches on the
architecture."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Linear
from pyengine.models import llama
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX, TransformerConfig
from pyengine.models.registry import register


def check_range(name: str, value: int, low: int, high: int) -> None:
    """A hyper-parameter outside [low, high] is a broken model, not a crash later."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ModelError(f"hyper-parameter {name} = {value} is out of range ({low}..{high})")


@dataclass(frozen=True)
class AttentionConfig(TransformerConfig):
    """Shared hyper-parameters plus the per-layer attention knobs."""

    attn_scale: float = 0.0     # multiplies q.k before the softmax
    attn_softcap: float = 0.0   # cap * tanh(score / cap) on the scores; 0 = none
    scale_query: bool = False   # apply attn_scale to the query instead (Gemma, as llama.cpp does)

    @classmethod
    def common_from_gguf(cls, f: GGUFFile, *, rope_mode: int = ROPE_NEOX, eps_default: float = 1e-5) -> dict:
        kw = super().common_from_gguf(f, rope_mode=rope_mode, eps_default=eps_default)
        head_dim = kw["head_dim"]
        value_dim = f.get_int(f.arch_key("attention.value_length"), head_dim)
        if head_dim > 0 and value_dim != head_dim:   # (an invalid head_dim fails in __post_init__)
            raise UnsupportedError(f"{f.path}: value head size {value_dim} differs from key head size "
                                   f"{head_dim}; pyengine needs them equal")
        kw["attn_scale"] = 1.0 / math.sqrt(head_dim) if head_dim > 0 else 0.0
        return kw

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.attn_scale > 0 and math.isfinite(self.attn_scale)):
            raise ModelError(f"attention scale must be positive, got {self.attn_scale}")
        if not (self.attn_softcap >= 0 and math.isfinite(self.attn_softcap)):
            raise ModelError(f"attention soft-capping must be >= 0, got {self.attn_softcap}")

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        """RoPE as layer `layer` applies it (the same for every layer here)."""
        return self.rope(ctx, x, positions, freq_factors=freq_factors)

    def layer_window(self, layer: int) -> int:
        """Sliding-window size of layer `layer` in tokens; 0 = it sees everything."""
        return 0

    def cache_layout(self) -> list[nn.CacheSpec]:
        return [nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim, window=self.layer_window(i))
                for i in range(self.n_layer)]


@dataclass(frozen=True)
class Qwen2Config(AttentionConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen2Config":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX))


@dataclass(eq=False)
class SelfAttention(Module):
    """Rope q and k, attend over this layer's cache, project out."""

    attn_output: Linear = tensor("attn_output", shape=("q_dim", "n_embd"))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [hd, H, T], k [hd, Hkv, T], v [hd*Hkv, T] of the normed input x [n_embd, T]."""
        raise NotImplementedError

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, freq_factors: Tensor | None = None) -> Tensor:
        c = self.cfg
        q, k, v = self.project(ctx, x)
        q = c.layer_rope(ctx, q, batch.positions, layer, freq_factors)              # [hd, H, T]
        k = c.layer_rope(ctx, k, batch.positions, layer, freq_factors)              # [hd, Hkv, T]
        scale = c.attn_scale
        if c.scale_query:
            q, scale = ctx.scale(q, scale), 1.0
        o = nn.attention(ctx, batch, layer, q, ctx.reshape(k, (c.kv_dim, -1)), v,
                         n_head_kv=c.n_head_kv, scale=scale, softcap=c.attn_softcap)  # [hd*H, T]
        return self.attn_output(ctx, o)


def split_heads(ctx: Context, x: Tensor, head_dim: int) -> Tensor:
    """[head_dim * heads, T] -> [head_dim, heads, T]."""
    return ctx.reshape(x, (head_dim, -1, x.shape[1]))


@dataclass(eq=False)
class Attention(SelfAttention):
    """Separate q/k/v projections, each with an optional bias (Qwen2 has them)."""

    attn_q: Linear = tensor("attn_q", shape=("n_embd", "q_dim"))
    attn_k: Linear = tensor("attn_k", shape=("n_embd", "kv_dim"))
    attn_v: Linear = tensor("attn_v", shape=("n_embd", "kv_dim"))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hd = self.cfg.head_dim
        q, k, v = nn.linears(ctx, (self.attn_q, self.attn_k, self.attn_v), x)
        return split_heads(ctx, q, hd), split_heads(ctx, k, hd), v                  # [hd, H|Hkv, T], [hd*Hkv, T]


@dataclass(eq=False)
class Block(llama.Block):
    attn: Attention = module()


@register("qwen2")
@dataclass(eq=False)
class Qwen2(llama.Llama):
    Config = Qwen2Config

    layers: list[Block] = blocks("blk")

    def cache_layout(self) -> list[nn.CacheSpec]:
        return self.cfg.cache_layout()
