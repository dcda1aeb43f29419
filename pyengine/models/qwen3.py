"""Qwen3: Qwen2's layout with an RMS norm over each query and key head
(before RoPE), a head size set by `attention.key_length` (not necessarily
n_embd / n_head), and no projection biases.  GGUF `qwen3`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen3Config(common.AttentionConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3Config":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX))


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: common.HeadNormAttention = module()


@register("qwen3")
@dataclass(eq=False)
class Qwen3(common.Decoder):
    Config = Qwen3Config

    layers: list[Block] = blocks("blk")
