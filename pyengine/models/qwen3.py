"""Qwen3: Qwen2's layout with an RMS norm over each query and key head
(before RoPE), a head size set by `attention.key_length` (not necessarily
n_embd / n_head), and no projection biases.  GGUF `qwen3`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import RMSNorm
from pyengine.models import llama, qwen2
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.registry import register


@dataclass(eq=False)
class Attention(qwen2.Attention):
    """q/k/v projections, then each q and k head RMS-normed over its head_dim values."""

    attn_q_norm: RMSNorm = tensor("attn_q_norm", shape=("head_dim",))
    attn_k_norm: RMSNorm = tensor("attn_k_norm", shape=("head_dim",))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        eps = self.cfg.eps
        q, k, v = super().project(ctx, x)                                           # [hd, H|Hkv, T]
        return self.attn_q_norm(ctx, q, eps), self.attn_k_norm(ctx, k, eps), v


@dataclass(eq=False)
class Block(llama.Block):
    attn: Attention = module()


@register("qwen3")
@dataclass(eq=False)
class Qwen3(qwen2.Qwen2):
    Config = qwen2.Qwen2Config

    layers: list[Block] = blocks("blk")
