"""Qwen2-VL (and Qwen2.5-VL, whose GGUF text model is the same architecture): Qwen2
blocks with M-RoPE, a run of rotated pairs per position stream (models/common.py).
GGUF `general.architecture = qwen2vl`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen2VLConfig(common.MRopeConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen2VLConfig":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX), **cls.mrope_from_gguf(f))


@register("qwen2vl")
@dataclass(eq=False)
class Qwen2VL(common.MRopeDecoder):
    Config = Qwen2VLConfig
