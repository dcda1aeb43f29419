"""Gemma 3: Gemma 2's block (RMS norms before and after attention and the
GELU(tanh)-gated MLP, embeddings scaled by sqrt(n_embd)) with Qwen3-style RMS
norms on each q and k head, five sliding-window layers for every global one,
RoPE base 10000 on the sliding layers (the file's `rope.freq_base` and linear
scaling on the global ones), and no soft-capping.  GGUF `gemma3`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param
from pyengine.models import common
from pyengine.models.binding import blocks
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

LOCAL_ROPE_BASE = 10000.0   # Gemma 3's sliding layers; GGUF does not store it
LAYERS_27B = 62             # how llama.cpp recognises the 27B model (see common.gemma_query_scale)


@dataclass(frozen=True)
class Gemma3Config(common.SlidingWindowConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Gemma3Config":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=1e-6)
        window_key = f.arch_key("attention.sliding_window")
        if window_key not in f.metadata:
            raise ModelError(f"{f.path}: missing metadata key {window_key!r} (Gemma 3 needs its window)")
        kw.update(attn_scale=common.gemma_query_scale(kw, LAYERS_27B), scale_query=True,
                  sliding_window=f.get_int(window_key), swa_pattern=6,
                  rope_base_local=LOCAL_ROPE_BASE, rope_scale_local=1.0)
        return cls(**kw)


@register("gemma3")
@dataclass(eq=False)
class Gemma3(common.Decoder):
    """Embeddings scaled by sqrt(n_embd); no rope_freqs."""

    Config = Gemma3Config

    rope_freqs: F32Param | None = None
    layers: list[common.GemmaBlock] = blocks("blk")

    def embed(self, ctx: Context, tokens: Tensor) -> Tensor:
        return ctx.scale(self.token_embd(ctx, tokens), math.sqrt(self.cfg.n_embd))   # [n_embd, T]
