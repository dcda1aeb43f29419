"""Gemma 2: embeddings scaled by sqrt(n_embd), a GELU(tanh)-gated MLP, RMS
norms after attention and after the MLP as well as before, soft-capped
attention scores and final logits, and sliding-window attention on every
other layer (the even ones).  GGUF `gemma2`.

Gemma's GGUF norm weights already include Gemma's "+1", so they are plain
RMSNorm weights here."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

# llama.cpp's values when a Gemma 2 file lacks the keys
GEMMA2_DEFAULT_WINDOW = 4096
GEMMA2_DEFAULT_ATTN_SOFTCAP = 50.0
GEMMA2_DEFAULT_FINAL_SOFTCAP = 30.0
LAYERS_27B = 46   # how llama.cpp recognises the 27B model (see common.gemma_query_scale)


@dataclass(frozen=True)
class Gemma2Config(common.SlidingWindowConfig):
    final_softcap: float = 0.0     # cap * tanh(logit / cap) on the output; 0 = none

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Gemma2Config":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=1e-6)
        key = f.arch_key
        kw.update(
            attn_scale=common.gemma_query_scale(kw, LAYERS_27B),
            scale_query=True,
            sliding_window=f.get_int(key("attention.sliding_window"), GEMMA2_DEFAULT_WINDOW),
            swa_pattern=2,
            rope_base_local=kw["rope_base"],
            rope_scale_local=kw["rope_scale"],
            attn_softcap=f.get_float(key("attn_logit_softcapping"), GEMMA2_DEFAULT_ATTN_SOFTCAP),
            final_softcap=f.get_float(key("final_logit_softcapping"), GEMMA2_DEFAULT_FINAL_SOFTCAP),
        )
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.final_softcap >= 0 and math.isfinite(self.final_softcap)):
            raise ModelError(f"final_logit_softcapping must be >= 0, got {self.final_softcap}")


@dataclass(eq=False)
class Block(common.SandwichBlock):
    mlp: common.GeluMLP = module()


@register("gemma2")
@dataclass(eq=False)
class Gemma2(common.Decoder):
    """Embeddings scaled by sqrt(n_embd), logits soft-capped; no rope_freqs."""

    Config = Gemma2Config

    rope_freqs: F32Param | None = None
    layers: list[Block] = blocks("blk")

    def embed(self, ctx: Context, tokens: Tensor) -> Tensor:
        return ctx.scale(self.token_embd(ctx, tokens), math.sqrt(self.cfg.n_embd))   # [n_embd, T]

    def head(self, ctx: Context, x: Tensor) -> Tensor:
        c = self.cfg
        logits = self.output(ctx, x)                                               # [n_vocab, n_out]
        return ctx.softcap(logits, c.final_softcap) if c.final_softcap > 0 else logits
