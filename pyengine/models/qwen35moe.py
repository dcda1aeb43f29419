"""Qwen3.5-MoE: Qwen3.5's hybrid of gated attention and Gated DeltaNet layers
(common.py's DeltaNet pieces) with a mixture-of-experts MLP in every layer: a
router's softmax over the experts, the `expert_used_count` best run their SiLU-gated
MLPs, weighted by their probabilities renormalised over the chosen; beside them a
shared expert, its output times sigmoid(ffn_gate_inp_shexp . x) (common.py's
DeltaNetMoeConfig and GatedSharedExpertMoE, shared with Qwen3-Next).  GGUF `qwen35moe`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen35MoeConfig(common.DeltaNetMoeConfig):
    pass


@dataclass(eq=False)
class Block(common.DeltaNetHybridBlock):
    mlp: common.GatedSharedExpertMoE = module()


@register("qwen35moe")
@dataclass(eq=False)
class Qwen35Moe(common.Decoder):
    Config = Qwen35MoeConfig

    rope_freqs: None = None
    layers: list[Block] = blocks("blk")

    def shift_keys(self, ctx, k, positions, layer, n_ctx_seq=None):
        raise ModelError("qwen35moe keeps recurrent states, which cannot be shifted")
