"""OLMo 2 (AI2): no norm before attention or the MLP; instead an RMS norm on
the output of each (before its residual add), and an RMS norm over the whole
projected query and key of a token (not per head as in Qwen3) before they are
split into heads and roped.  NeoX-style RoPE, SiLU-gated MLP, a separate output
projection.  GGUF `general.architecture = olmo2`.

Files with `attention.sliding_window` (OLMo 3, which llama.cpp also runs as
olmo2, with YaRN on its full-attention layers) are refused."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Linear, RMSNorm
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Olmo2Config(common.AttentionConfig):
    ROPE_WHOLE_HEADS = True

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Olmo2Config":
        key = f.arch_key
        if f.get_int(key("attention.sliding_window"), 0) > 0:
            raise UnsupportedError(f"{f.path}: sliding-window attention (OLMo 3) is not supported yet; "
                                   "only OLMo 2 models (no attention.sliding_window) run")
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None))

    def __post_init__(self) -> None:
        super().__post_init__()
        # llama.cpp sizes q and its norm by n_embd
        if self.q_dim != self.n_embd:
            raise ModelError(f"head_count {self.n_head} x head size {self.head_dim} = {self.q_dim} must equal "
                             f"embedding_length {self.n_embd} in an olmo2 model")


@dataclass(eq=False)
class Attention(common.Attention):
    """q/k/v projections, then q and k each RMS-normed over all of a token's values."""

    attn_q_norm: RMSNorm = tensor("attn_q_norm", shape=("q_dim",))
    attn_k_norm: RMSNorm = tensor("attn_k_norm", shape=("kv_dim",))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.cfg
        q, k, v = nn.linears(ctx, (self.attn_q, self.attn_k, self.attn_v), x)      # [q_dim|kv_dim, T]
        q = self.attn_q_norm(ctx, q, c.eps)                                         # [hd*H, T]
        k = self.attn_k_norm(ctx, k, c.eps)                                         # [hd*Hkv, T]
        return common.split_heads(ctx, q, c.head_dim), common.split_heads(ctx, k, c.head_dim), v


@dataclass(eq=False)
class Block(common.PostNormBlock):
    attn: Attention = module()


@register("olmo2")
@dataclass(eq=False)
class Olmo2(common.Decoder):
    Config = Olmo2Config

    layers: list[Block] = blocks("blk")
    output: Linear = tensor("output", shape=("n_embd", "n_vocab"))   # never tied in llama.cpp's olmo2
