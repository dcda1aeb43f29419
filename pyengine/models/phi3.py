"""Phi-3: one fused q/k/v projection, one fused gate/up projection, and
(for the 128k-context models) LongRoPE: per-dimension frequency factors,
the "short" set while the context fits the original training length
(`rope.scaling.original_context_length`) and the "long" set beyond it, with
the file's attention factor on the rotation (both read by the shared config,
models/config.py).  NeoX-style RoPE.  GGUF `phi3`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Embedding, F32Param, Linear, RMSNorm
from pyengine.models import llama, qwen2
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

F32_BYTES = 4


@dataclass(frozen=True)
class Phi3Config(qwen2.AttentionConfig):
    # n_ctx_orig (where the "long" factors start) and rope_attn_factor (LongRoPE's
    # magnitude fix) are the shared config's; the factors are this model's tensors
    ROPE_SCALINGS = qwen2.AttentionConfig.ROPE_SCALINGS + ("longrope",)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Phi3Config":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX))

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    @property
    def rope_pairs(self) -> int:
        return self.rope_dims // 2

    @property
    def n_ff_pair(self) -> int:
        return 2 * self.n_ff


@dataclass(eq=False)
class Attention(qwen2.SelfAttention):
    attn_qkv: Linear = tensor("attn_qkv", shape=("n_embd", "qkv_dim"))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c, n_tokens = self.cfg, x.shape[1]
        qkv = self.attn_qkv(ctx, x)                                                 # [q_dim + 2*kv_dim, T]
        row, head = c.qkv_dim * F32_BYTES, c.head_dim * F32_BYTES
        # strided views into each token's row: q heads, then k heads, then v
        q = ctx.view(qkv, (c.head_dim, c.n_head, n_tokens), (F32_BYTES, head, row))                # [hd, H, T]
        k = ctx.view(qkv, (c.head_dim, c.n_head_kv, n_tokens), (F32_BYTES, head, row),
                     c.q_dim * F32_BYTES)                                                           # [hd, Hkv, T]
        v = ctx.rows_slice(qkv, c.q_dim + c.kv_dim, c.kv_dim)                                      # [hd*Hkv, T]
        return q, k, v


@dataclass(eq=False)
class MLP(Module):
    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff_pair"))     # gate and up, stacked
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        n_ff = self.cfg.n_ff
        gate_up = self.ffn_up(ctx, x)                                               # [2*n_ff, T]
        gate, up = ctx.rows_slice(gate_up, 0, n_ff), ctx.rows_slice(gate_up, n_ff, n_ff)
        return self.ffn_down(ctx, ctx.swiglu(gate, up))


@dataclass(eq=False)
class Block(llama.Block):
    attn: Attention = module()
    mlp: MLP = module()


@register("phi3")
@dataclass(eq=False)
class Phi3(Module):
    Config = Phi3Config

    token_embd: Embedding = tensor("token_embd", shape=("n_embd", "n_vocab"))
    rope_factors_short: F32Param | None = tensor("rope_factors_short", optional=True, shape=("rope_pairs",))
    rope_factors_long: F32Param | None = tensor("rope_factors_long", optional=True, shape=("rope_pairs",))
    layers: list[Block] = blocks("blk")
    output_norm: RMSNorm = tensor("output_norm", shape=("n_embd",))
    output: Linear = tensor("output", alt="token_embd", shape=("n_embd", "n_vocab"))
    n_ctx: int = 0      # context size of the last graph built: which factors the keys were roped with

    def rope_factors(self, n_ctx: int) -> F32Param | None:
        """LongRoPE's factors for a context of n_ctx tokens, as llama.cpp chooses them."""
        return self.rope_factors_long if n_ctx > self.cfg.n_ctx_orig else self.rope_factors_short

    def forward(self, ctx: Context, batch) -> Tensor:
        # every Phi-3 layer attends globally, so layer 0's cache holds the whole context
        self.n_ctx = batch.attn_inputs(0).k.shape[1]
        factors = self.rope_factors(self.n_ctx)
        ff = ctx.weight(factors.weight) if factors else None
        x = self.token_embd(ctx, batch.tokens)                                     # [n_embd, T]
        for i, block in enumerate(self.layers):
            x = block(ctx, x, batch, i, ff)
        x = ctx.get_rows(x, batch.out_ids)                                         # [n_embd, n_out]
        return self.output(ctx, self.output_norm(ctx, x, self.cfg.eps))           # [n_vocab, n_out]

    def rope_for_layer(self, ctx: Context, x: Tensor, positions: Tensor, layer: int) -> Tensor:
        """Rotate cached keys further (a context shift, kvcache/rotate.py): the factors
        the forward pass used, and no attn_factor, which the keys already carry."""
        factors = self.rope_factors(self.n_ctx)
        ff = ctx.weight(factors.weight) if factors else None
        return self.cfg.rotation_only().rope(ctx, x, positions, freq_factors=ff)

    def cache_layout(self) -> list[nn.CacheSpec]:
        return self.cfg.cache_layout()
