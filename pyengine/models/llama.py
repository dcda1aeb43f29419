"""Llama (and the Mistral family): RMSNorm, RoPE, grouped-query attention,
SiLU-gated MLP.  GGUF `general.architecture = llama`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Embedding, F32Param, Linear, RMSNorm
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NORMAL, TransformerConfig
from pyengine.models.registry import register


@dataclass(frozen=True)
class LlamaConfig(TransformerConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "LlamaConfig":
        # GGUF llama weights are permuted for the interleaved ("normal") layout
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NORMAL))


@dataclass(eq=False)
class Attention(Module):
    attn_q: Linear = tensor("attn_q", shape=("n_embd", "q_dim"))
    attn_k: Linear = tensor("attn_k", shape=("n_embd", "kv_dim"))
    attn_v: Linear = tensor("attn_v", shape=("n_embd", "kv_dim"))
    attn_output: Linear = tensor("attn_output", shape=("q_dim", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, freq_factors: Tensor | None,
                 q_scale: Tensor | None = None) -> Tensor:
        """q_scale [1, 1, T]: a factor per token on the roped queries (Llama 4's
        attention temperature, models/mistral3.py); None for none."""
        c, n_tokens = self.cfg, x.shape[1]
        q, k, v = nn.linears(ctx, (self.attn_q, self.attn_k, self.attn_v), x)      # v [hd*Hkv, T]
        q = ctx.reshape(q, (c.head_dim, c.n_head, n_tokens))                         # [hd, H, T]
        k = ctx.reshape(k, (c.head_dim, c.n_head_kv, n_tokens))                      # [hd, Hkv, T]
        q = c.rope(ctx, q, batch.positions, freq_factors=freq_factors)
        k = c.rope(ctx, k, batch.positions, freq_factors=freq_factors)
        if q_scale is not None:
            q = ctx.mul(q, q_scale)                                                  # [hd, H, T] x [1, 1, T]
        o = nn.attention(ctx, batch, layer, q, ctx.reshape(k, (c.kv_dim, n_tokens)), v,
                         n_head_kv=c.n_head_kv, scale=1.0 / math.sqrt(c.head_dim))  # [hd*H, T]
        return self.attn_output(ctx, o)


@dataclass(eq=False)
class MLP(Module):
    ffn_gate: Linear = tensor("ffn_gate", shape=("n_embd", "n_ff"))
    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return self.ffn_down(ctx, ctx.swiglu(*nn.linears(ctx, (self.ffn_gate, self.ffn_up), x)))


@dataclass(eq=False)
class Block(Module):
    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: Attention = module()
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))
    mlp: MLP = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, freq_factors: Tensor | None) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer, freq_factors))
        return ctx.add(x, self.mlp(ctx, self.ffn_norm(ctx, x, eps)))


@register("llama", "mistral")
@dataclass(eq=False)
class Llama(Module):
    Config = LlamaConfig

    token_embd: Embedding = tensor("token_embd", shape=("n_embd", "n_vocab"))
    rope_freqs: F32Param | None = tensor("rope_freqs", optional=True)
    layers: list[Block] = blocks("blk")
    output_norm: RMSNorm = tensor("output_norm", shape=("n_embd",))
    output: Linear = tensor("output", alt="token_embd", shape=("n_embd", "n_vocab"))

    def forward(self, ctx: Context, batch) -> Tensor:
        ff = ctx.weight(self.rope_freqs.weight) if self.rope_freqs else None
        x = self.token_embd(ctx, batch.tokens)                                     # [n_embd, T]
        for i, block in enumerate(self.layers):
            x = block(ctx, x, batch, i, ff)
        x = ctx.get_rows(x, batch.out_ids)                                         # [n_embd, n_out]
        return self.output(ctx, self.output_norm(ctx, x, self.cfg.eps))           # [n_vocab, n_out]

    def cache_layout(self) -> list[nn.CacheSpec]:
        c = self.cfg
        return [nn.CacheSpec(k_dim=c.kv_dim, v_dim=c.kv_dim, window=0)] * c.n_layer
