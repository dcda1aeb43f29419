"""IBM Granite (the 3.x dense models): Llama with four multipliers -- token
embeddings times `embedding_scale`, each block's attention and MLP outputs
times `residual_scale` before they join the residual, attention scores times
`attention.scale` (in place of 1/sqrt(head_dim)), and the final logits
divided by `logit_scale`.  Interleaved ("normal") RoPE, as Llama's.
GGUF `general.architecture = granite`.

The keys are read as llama.cpp reads them: `logit_scale` is required; the
other three may be missing or 0, which means no scaling (1/sqrt(head_dim) for
the scores); `rope.scaling.finetuned` false turns RoPE off (Granite's switch,
on by default)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.models import common
from pyengine.models.binding import blocks
from pyengine.models.config import ROPE_NORMAL
from pyengine.models.registry import register


@dataclass(frozen=True)
class GraniteConfig(common.AttentionConfig):
    embedding_scale: float = 1.0   # multiplies the token embeddings
    residual_scale: float = 1.0    # multiplies attention and MLP outputs before each residual add
    logit_scale: float = 1.0       # divides the logits
    use_rope: bool = True          # rope.scaling.finetuned

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "GraniteConfig":
        key = f.arch_key
        if key("logit_scale") not in f.metadata:
            raise ModelError(f"{f.path}: missing metadata key {key('logit_scale')!r} "
                             "(Granite divides its logits by it)")
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NORMAL)
        kw.update(embedding_scale=f.get_float(key("embedding_scale"), 0.0) or 1.0,   # 0: not scaled
                  residual_scale=f.get_float(key("residual_scale"), 0.0) or 1.0,
                  logit_scale=f.get_float(key("logit_scale")),
                  use_rope=f.get_bool(key("rope.scaling.finetuned"), True))
        kw["attn_scale"] = f.get_float(key("attention.scale"), 0.0) or kw["attn_scale"]
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("embedding_scale", "residual_scale", "logit_scale"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ModelError(f"hyper-parameter {name} must be positive and finite, got {value}")

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        return super().layer_rope(ctx, x, positions, layer, freq_factors) if self.use_rope else x


@dataclass(eq=False)
class Block(common.PreNormBlock):
    """Llama's block with the attention and MLP outputs scaled before each residual add."""

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps, s = self.cfg.eps, self.cfg.residual_scale
        h = self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer, inputs)         # [n_embd, T]
        x = ctx.add(x, common.scaled(ctx, h, s))
        return ctx.add(x, common.scaled(ctx, self.mlp(ctx, self.ffn_norm(ctx, x, eps)), s))


@register("granite")
@dataclass(eq=False)
class Granite(common.Decoder):
    Config = GraniteConfig

    layers: list[Block] = blocks("blk")

    def embed(self, ctx: Context, tokens: Tensor) -> Tensor:
        return common.scaled(ctx, self.token_embd(ctx, tokens), self.cfg.embedding_scale)   # [n_embd, T]

    def head(self, ctx: Context, x: Tensor) -> Tensor:
        return common.scaled(ctx, self.output(ctx, x), 1.0 / self.cfg.logit_scale)         # [n_vocab, n_out]
