"""Qwen3-VL's text model: Qwen3 blocks (RMS norms over each query and key head)
with interleaved M-RoPE - the time, row and column streams take turns pair by pair
(`rope.dimension_sections`, e.g. 24/20/20 of 64 pairs) - and deepstack: an image's
rows bring a piece for each of the first `n_deepstack_layers` layers, added to
their outputs (models/common.py).  GGUF `qwen3vl`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml.context import ROPE_IMROPE
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen3VLConfig(common.MRopeConfig):
    MROPE_MODE = ROPE_IMROPE

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3VLConfig":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None), **cls.mrope_from_gguf(f))


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: common.HeadNormAttention = module()


@register("qwen3vl")
@dataclass(eq=False)
class Qwen3VL(common.MRopeDecoder):
    Config = Qwen3VLConfig

    layers: list[Block] = blocks("blk")
