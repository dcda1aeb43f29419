"""Llama (and the Mistral family): RMSNorm, RoPE, grouped-query attention,
SiLU-gated MLP, `rope_freqs` (Llama 3's factors) where the file has them.
GGUF `general.architecture = llama`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.config import ROPE_NORMAL
from pyengine.models.registry import register


@dataclass(frozen=True)
class LlamaConfig(common.AttentionConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "LlamaConfig":
        # GGUF llama weights are permuted for the interleaved ("normal") layout; a value
        # head size of its own is refused by the tensors' shapes
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, equal_heads=False))


@register("llama", "mistral")
@dataclass(eq=False)
class Llama(common.Decoder):
    Config = LlamaConfig
