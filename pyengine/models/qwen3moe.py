"""Qwen3-MoE: Qwen3's attention with a mixture-of-experts MLP.  A router
scores every expert per token; the `expert_used_count` best run their own
SiLU-gated MLP and their outputs are summed, weighted by the router's
softmax probabilities renormalised over the chosen experts.
GGUF `qwen3moe`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Experts, Linear
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

MAX_EXPERTS = 1024


@dataclass(frozen=True)
class Qwen3MoeConfig(common.AttentionConfig):
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0              # hidden size of one expert's MLP
    norm_expert_weights: bool = True
    expert_weights_scale: float = 1.0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3MoeConfig":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX)
        n_used = f.get_int(key("expert_used_count"), 0)
        n_ff_default = kw["n_ff"] // n_used if n_used > 0 else 0   # llama.cpp's fallback
        scale = f.get_float(key("expert_weights_scale"), 0.0)
        kw.update(
            n_expert=f.get_int(key("expert_count"), 0),
            n_expert_used=n_used,
            n_ff_exp=f.get_int(key("expert_feed_forward_length"), n_ff_default),
            # llama.cpp always renormalises Qwen3-MoE's weights; a file may say otherwise
            norm_expert_weights=f.get_bool(key("expert_weights_norm"), True),
            expert_weights_scale=scale if scale > 0 else 1.0,
        )
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("expert_count", self.n_expert, 1, MAX_EXPERTS)
        common.check_range("expert_used_count", self.n_expert_used, 1, self.n_expert)
        common.check_range("expert_feed_forward_length", self.n_ff_exp, 1, 1 << 20)
        if not math.isfinite(self.expert_weights_scale):
            raise ModelError(f"expert_weights_scale must be finite, got {self.expert_weights_scale}")


@dataclass(eq=False)
class MoE(Module):
    ffn_gate_inp: Linear = tensor("ffn_gate_inp", shape=("n_embd", "n_expert"))          # the router
    ffn_gate_exps: Experts = tensor("ffn_gate_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_up_exps: Experts = tensor("ffn_up_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_down_exps: Experts = tensor("ffn_down_exps", shape=("n_ff_exp", "n_embd", "n_expert"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        c, n_tokens = self.cfg, x.shape[1]
        scores = self.ffn_gate_inp(ctx, x)                                          # [E, T]
        chosen = ctx.topk(scores, c.n_expert_used)                                  # i32 [U, T]
        weights = ctx.moe_weights(scores, chosen, c.norm_expert_weights)            # [U, T]
        if c.expert_weights_scale != 1.0:
            weights = ctx.scale(weights, c.expert_weights_scale)
        x = ctx.reshape(x, (c.n_embd, 1, n_tokens))                                 # one input for all U
        gate = self.ffn_gate_exps(ctx, x, chosen)     # [F, U, T]
        up = self.ffn_up_exps(ctx, x, chosen)         # [F, U, T]
        down = self.ffn_down_exps(ctx, ctx.swiglu(gate, up), chosen)  # [n_embd, U, T]
        return ctx.weighted_sum(down, weights)                                      # [n_embd, T]


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: common.HeadNormAttention = module()
    mlp: MoE = module()


@register("qwen3moe")
@dataclass(eq=False)
class Qwen3Moe(common.Decoder):
    Config = Qwen3MoeConfig

    layers: list[Block] = blocks("blk")
