"""Qwen2: Llama with biases on the q/k/v projections (optional, as every
projection's here) and NeoX-style RoPE.  GGUF `general.architecture = qwen2`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen2Config(common.AttentionConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen2Config":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX))


@register("qwen2")
@dataclass(eq=False)
class Qwen2(common.Decoder):
    Config = Qwen2Config
