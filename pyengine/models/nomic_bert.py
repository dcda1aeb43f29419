"""nomic-bert (nomic-embed-text): BERT's post-norm blocks with rotary positions
(NeoX style) instead of learned ones, one fused q/k/v projection, a SwiGLU MLP
(silu(gate x) * up x, then down) and no biases on the projections; LayerNorms
with biases.  Attention is bidirectional.  GGUF `general.architecture = nomic-bert`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class NomicBertConfig(common.EncoderConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "NomicBertConfig":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX))


@dataclass(eq=False)
class Block(common.EncoderBlock):
    attn: common.FusedAttention = module()
    mlp: common.MLP = module()


@register("nomic-bert")
@dataclass(eq=False)
class NomicBert(common.Encoder):
    Config = NomicBertConfig

    head_cls: None = None   # (llama.cpp reads no classification head for nomic-bert)
    layers: list[Block] = blocks("blk")
