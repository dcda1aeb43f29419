"""Qwen3.5-MoE: Qwen3.5's hybrid of gated attention and Gated DeltaNet layers
(common.py's DeltaNet pieces) with a mixture-of-experts MLP in every layer: a
router's softmax over the experts, the `expert_used_count` best run their SiLU-gated
MLPs, weighted by their probabilities renormalised over the chosen; beside them a
shared expert, its output times sigmoid(ffn_gate_inp_shexp . x).  GGUF `qwen35moe`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Linear, Param
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.registry import register

MAX_EXPERTS = 1024


@dataclass(frozen=True)
class Qwen35MoeConfig(common.DeltaNetConfig):
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0       # hidden size of one routed expert
    n_ff_shexp: int = 0     # hidden size of the shared expert

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen35MoeConfig":
        key = f.arch_key
        kw = cls.delta_from_gguf(f)
        n_used = f.get_int(key("expert_used_count"), 0)
        n_ff_exp = f.get_int(key("expert_feed_forward_length"), kw["n_ff"] // n_used if n_used > 0 else 0)
        return cls(**kw, n_expert=f.get_int(key("expert_count"), 0), n_expert_used=n_used, n_ff_exp=n_ff_exp,
                   n_ff_shexp=f.get_int(key("expert_shared_feed_forward_length"), kw["n_ff"]))

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("expert_count", self.n_expert, 1, MAX_EXPERTS)
        common.check_range("expert_used_count", self.n_expert_used, 1, self.n_expert)
        common.check_range("expert_feed_forward_length", self.n_ff_exp, 1, 1 << 20)
        common.check_range("expert_shared_feed_forward_length", self.n_ff_shexp, 1, 1 << 20)


@dataclass(eq=False)
class SharedExpertMoE(Module):
    ffn_gate_inp: Linear = tensor("ffn_gate_inp", shape=("n_embd", "n_expert"))          # the router
    ffn_gate_exps: Param = tensor("ffn_gate_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_up_exps: Param = tensor("ffn_up_exps", shape=("n_embd", "n_ff_exp", "n_expert"))
    ffn_down_exps: Param = tensor("ffn_down_exps", shape=("n_ff_exp", "n_embd", "n_expert"))
    ffn_gate_inp_shexp: Linear = tensor("ffn_gate_inp_shexp", shape=("n_embd",))          # the shared gate
    ffn_gate_shexp: Linear = tensor("ffn_gate_shexp", shape=("n_embd", "n_ff_shexp"))
    ffn_up_shexp: Linear = tensor("ffn_up_shexp", shape=("n_embd", "n_ff_shexp"))
    ffn_down_shexp: Linear = tensor("ffn_down_shexp", shape=("n_ff_shexp", "n_embd"))

    def routed(self, ctx: Context, x: Tensor) -> Tensor:
        c, n_tokens = self.cfg, x.shape[1]
        scores = self.ffn_gate_inp(ctx, x)                                          # [E, T]
        chosen = ctx.topk(scores, c.n_expert_used)                                  # i32 [U, T]
        weights = ctx.moe_weights(scores, chosen, True)                             # [U, T]
        x = ctx.reshape(x, (c.n_embd, 1, n_tokens))
        gate = ctx.mul_mat_id(ctx.weight(self.ffn_gate_exps.weight), x, chosen)     # [F, U, T]
        up = ctx.mul_mat_id(ctx.weight(self.ffn_up_exps.weight), x, chosen)
        down = ctx.mul_mat_id(ctx.weight(self.ffn_down_exps.weight), ctx.swiglu(gate, up), chosen)
        return ctx.weighted_sum(down, weights)                                      # [n_embd, T]

    def shared(self, ctx: Context, x: Tensor) -> Tensor:
        h = ctx.swiglu(self.ffn_gate_shexp(ctx, x), self.ffn_up_shexp(ctx, x))
        gate = ctx.sigmoid(self.ffn_gate_inp_shexp(ctx, x))                         # [1, T]
        return ctx.mul(self.ffn_down_shexp(ctx, h), gate)

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return ctx.add(self.routed(ctx, x), self.shared(ctx, x))


@dataclass(eq=False)
class Block(common.DeltaNetHybridBlock):
    mlp: SharedExpertMoE = module()


@register("qwen35moe")
@dataclass(eq=False)
class Qwen35Moe(common.Decoder):
    Config = Qwen35MoeConfig

    rope_freqs: None = None
    layers: list[Block] = blocks("blk")

    def shift_keys(self, ctx, k, positions, layer, n_ctx_seq=None):
        raise ModelError("qwen35moe keeps recurrent states, which cannot be shifted")
