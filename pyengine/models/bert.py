"""BERT (and the encoders converted as it: MiniLM, bge, mxbai-embed): learned
absolute position embeddings and the type-0 row of the token-type embeddings
added to the token embeddings, a LayerNorm, then post-norm blocks (LayerNorm
after each residual add) with biased q/k/v and output projections, a GELU MLP
with biases, and no final norm.  Attention is bidirectional.  A cross-encoder
(reranker) adds the classification head `cls` / `cls.output`.
GGUF `general.architecture = bert`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Embedding
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class BertConfig(common.EncoderConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "BertConfig":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX))


@dataclass(eq=False)
class Block(common.EncoderBlock):
    attn: common.NoRopeAttention = module()


@register("bert")
@dataclass(eq=False)
class Bert(common.Encoder):
    Config = BertConfig

    position_embd: Embedding = tensor("position_embd", shape=("n_embd", "n_ctx_train"))
    layers: list[Block] = blocks("blk")

    def embed(self, ctx: Context, batch) -> Tensor:
        x = super().embed(ctx, batch)                                              # [n_embd, T]
        return ctx.add(x, self.position_embd(ctx, batch.positions))

    def max_positions(self) -> int:
        return self.position_embd.weight.shape[1]
