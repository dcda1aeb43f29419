"""Qwen3-VL-MoE's text model: Qwen3-MoE blocks (head-normed attention, softmax
routing over experts renormalised over the chosen ones) with Qwen3-VL's
interleaved M-RoPE and deepstack pieces (models/common.py).  GGUF `qwen3vlmoe`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml.context import ROPE_IMROPE
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen3VLMoeConfig(common.MRopeConfig, common.ExpertsConfig):
    MROPE_MODE = ROPE_IMROPE

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3VLMoeConfig":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)
        experts = cls.experts_from_gguf(f, n_ff_exp=cls.expert_width(f, kw["n_ff"]), norm_default=True)
        return cls(**kw, **cls.mrope_from_gguf(f), **experts)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_experts()


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: common.HeadNormAttention = module()
    mlp: common.SoftmaxExperts = module()


@register("qwen3vlmoe")
@dataclass(eq=False)
class Qwen3VLMoe(common.MRopeDecoder):
    Config = Qwen3VLMoeConfig

    layers: list[Block] = blocks("blk")
