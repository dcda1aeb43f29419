"""Gemma 3: Gemma 2's block with Qwen3-style RMS norms on each q and k head,
five sliding-window layers for every global one, RoPE base 10000 on the
sliding layers (the file's `rope.freq_base` and linear scaling on the global
ones), and no soft-capping.  GGUF `gemma3`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.models import gemma2, qwen3
from pyengine.models.binding import blocks, module
from pyengine.models.registry import register

LOCAL_ROPE_BASE = 10000.0   # Gemma 3's sliding layers; GGUF does not store it


@dataclass(frozen=True)
class Gemma3Config(gemma2.Gemma2Config):
    LAYERS_27B = 62

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Gemma3Config":
        kw = cls.gemma_from_gguf(f)
        window_key = f.arch_key("attention.sliding_window")
        if window_key not in f.metadata:
            raise ModelError(f"{f.path}: missing metadata key {window_key!r} (Gemma 3 needs its window)")
        kw.update(sliding_window=f.get_int(window_key), swa_pattern=6,
                  rope_base_local=LOCAL_ROPE_BASE, rope_scale_local=1.0)
        return cls(**kw)


@dataclass(eq=False)
class Block(gemma2.Block):
    attn: qwen3.Attention = module()


@register("gemma3")
@dataclass(eq=False)
class Gemma3(gemma2.Gemma2):
    Config = Gemma3Config

    layers: list[Block] = blocks("blk")
