"""Phi-3: one fused q/k/v projection, one fused gate/up projection, and
(for the 128k-context models) LongRoPE: per-dimension frequency factors,
the "short" set while a sequence's context fits the original training length
(`rope.scaling.original_context_length`) and the "long" set beyond it, with
the file's attention factor on the rotation (both read by the shared config,
models/config.py).  NeoX-style RoPE.  GGUF `phi3`.

Which set a run uses follows llama.cpp (llama_model::get_rope_factors): the
long one when the context one sequence may fill (its n_ctx_seq) exceeds the
original length.  A graph reads that context from its batch
(`common.context_per_sequence`); a context shift is told it by the rotator, so
re-roped keys take the set they were roped with."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class Phi3Config(common.AttentionConfig):
    # n_ctx_orig (where the "long" factors start) and rope_attn_factor (LongRoPE's
    # magnitude fix) are the shared config's; the factors are this model's tensors
    ROPE_SCALINGS = common.AttentionConfig.ROPE_SCALINGS + ("longrope",)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Phi3Config":
        return cls(**cls.common_from_gguf(f, rope_mode=ROPE_NEOX))

    @property
    def rope_pairs(self) -> int:
        return self.rope_dims // 2


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: common.FusedAttention = module()
    mlp: common.FusedMLP = module()


@register("phi3")
@dataclass(eq=False)
class Phi3(common.Decoder):
    Config = Phi3Config

    rope_freqs: F32Param | None = None
    rope_factors_short: F32Param | None = tensor("rope_factors_short", optional=True, shape=("rope_pairs",))
    rope_factors_long: F32Param | None = tensor("rope_factors_long", optional=True, shape=("rope_pairs",))
    layers: list[Block] = blocks("blk")

    def rope_factors(self, n_ctx_seq: int) -> F32Param | None:
        """LongRoPE's factors for sequences of up to n_ctx_seq tokens, as llama.cpp chooses them."""
        return self.rope_factors_long if n_ctx_seq > self.cfg.n_ctx_orig else self.rope_factors_short

    def chosen_factors(self, ctx: Context, n_ctx_seq: int) -> Tensor | None:
        factors = self.rope_factors(n_ctx_seq)
        return ctx.weight(factors.weight) if factors else None

    def layer_inputs(self, ctx: Context, batch) -> common.LayerInputs:
        return common.LayerInputs(freq_factors=self.chosen_factors(ctx, common.context_per_sequence(batch)))

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        """The factors the forward pass used, and no attn_factor, which the keys already carry."""
        if n_ctx_seq is None:
            if self.rope_factors_short is not self.rope_factors_long:
                raise ModelError("re-roping Phi-3's keys needs the context per sequence: its LongRoPE "
                                 "factors depend on it")
            n_ctx_seq = self.cfg.n_ctx_orig   # (no factors: any context ropes alike)
        ff = self.chosen_factors(ctx, n_ctx_seq)
        return self.cfg.rotation_only().layer_rope(ctx, k, positions, layer, ff)
