"""Qwen3-MoE: Qwen3's attention with a mixture-of-experts MLP.  A router
scores every expert per token; the `expert_used_count` best run their own
SiLU-gated MLP and their outputs are summed, weighted by the router's
softmax probabilities renormalised over the chosen experts.
GGUF `qwen3moe`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen3MoeConfig(common.ExpertsConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3MoeConfig":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX)
        # llama.cpp always renormalises Qwen3-MoE's weights; a file may say otherwise
        return cls(**kw, **cls.experts_from_gguf(f, n_ff_exp=cls.expert_width(f, kw["n_ff"]), norm_default=True))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_experts()


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: common.HeadNormAttention = module()
    mlp: common.SoftmaxExperts = module()


@register("qwen3moe")
@dataclass(eq=False)
class Qwen3Moe(common.Decoder):
    Config = Qwen3MoeConfig

    layers: list[Block] = blocks("blk")
