"""Jina BERT v2 (jina-embeddings-v2): BERT's post-norm blocks without position
embeddings; positions enter as ALiBi (each head's scores minus its slope times the
tokens' distance, max bias 8, as llama.cpp sets it), bidirectionally.  Biased q/k/v
projections, optionally each of q and k LayerNormed over all of a token's values,
a GELU-gated MLP (gelu(gate x) * (up x + b), then down + b; or GEGLU over a fused
up projection of 2 x n_ff rows), and where the file has `attn_norm_2` a second
LayerNorm after the attention's, over its output plus the layer's input again.
GGUF `general.architecture = jina-bert-v2`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import LayerNorm, Linear
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

ALIBI_MAX_BIAS = 8.0   # llama.cpp's for jina-bert-v2 (no GGUF key holds it)


@dataclass(frozen=True)
class JinaBertV2Config(common.EncoderConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "JinaBertV2Config":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX)
        kw["alibi_max_bias"] = ALIBI_MAX_BIAS
        return cls(**kw)


@dataclass(eq=False)
class Attention(common.NoRopeAttention):
    """Biased q/k/v; q and k optionally LayerNormed over the whole token (before the heads)."""

    attn_q_norm: LayerNorm | None = tensor("attn_q_norm", optional=True, shape=("q_dim",))
    attn_k_norm: LayerNorm | None = tensor("attn_k_norm", optional=True, shape=("kv_dim",))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.cfg
        q, k, v = nn.linears(ctx, (self.attn_q, self.attn_k, self.attn_v), x)       # [q_dim|kv_dim, T]
        if self.attn_q_norm is not None:
            q = self.attn_q_norm(ctx, q, c.eps)
        if self.attn_k_norm is not None:
            k = self.attn_k_norm(ctx, k, c.eps)
        return common.split_heads(ctx, q, c.head_dim), common.split_heads(ctx, k, c.head_dim), v


@dataclass(eq=False)
class MLP(Module):
    """gelu(gate x) * (up x + b) -> down; without ffn_gate, GEGLU over the fused up."""

    ffn_gate: Linear | None = tensor("ffn_gate", optional=True, shape=("n_embd", "n_ff"))
    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", None))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        n_ff = self.cfg.n_ff
        if self.ffn_gate is not None:
            gate, up = nn.linears(ctx, (self.ffn_gate, self.ffn_up), x)             # [n_ff, T] each
        else:
            gate_up = self.ffn_up(ctx, x)                                           # [2*n_ff, T]
            if gate_up.shape[0] != 2 * n_ff:
                raise ModelError(f"ffn_up has {gate_up.shape[0]} rows: without ffn_gate it must hold gate "
                                 f"and up, 2 x {n_ff}")
            gate, up = ctx.rows_slice(gate_up, 0, n_ff), ctx.rows_slice(gate_up, n_ff, n_ff)
        return self.ffn_down(ctx, ctx.geglu(gate, up))


@dataclass(eq=False)
class Block(common.EncoderBlock):
    attn: Attention = module()
    attn_norm_2: LayerNorm | None = tensor("attn_norm_2", optional=True, shape=("n_embd",))
    mlp: MLP = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps = self.cfg.eps
        h = self.attn_output_norm(ctx, ctx.add(x, self.attn(ctx, x, batch, layer, inputs)), eps)
        if self.attn_norm_2 is not None:
            h = self.attn_norm_2(ctx, ctx.add(h, x), eps)
        return self.layer_output_norm(ctx, ctx.add(h, self.mlp(ctx, h)), eps)


@register("jina-bert-v2")
@dataclass(eq=False)
class JinaBertV2(common.Encoder):
    Config = JinaBertV2Config

    layers: list[Block] = blocks("blk")
