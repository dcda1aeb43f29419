"""GLM-4.5 (Zhipu's MoE models, GLM-4.5 / GLM-4.5-Air / GLM-4.6): pre-norm
blocks whose second norm is called `post_attention_norm`; q/k/v projections
with biases, each q and k head RMS-normed before RoPE where the file has
`attn_q_norm` / `attn_k_norm` (the 355B model), NeoX RoPE over the first
`rope.dimension_count` values of each head (half of it in the released
models); the first `leading_dense_block_count` layers run a dense SiLU-gated
MLP, the others routed experts plus one shared expert: the router's sigmoid
scores, the `expert_used_count` best by score plus a selection bias
(`exp_probs_b`), weighted by their scores (renormalised over the chosen when
`expert_weights_norm`, then times `expert_weights_scale`, the routed scaling
factor), added to the shared expert's output.  The last
`nextn_predict_layers` blocks (the multi-token-prediction layer) stay in the
file and are never run, as llama.cpp has it.  GGUF `glm4moe`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, RMSNorm
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

GATING_SIGMOID = 2   # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, GLM-4.5's (and its default)


@dataclass(frozen=True)
class Glm4MoeConfig(common.ExpertsConfig):
    n_dense_lead: int = 0     # leading layers with a dense MLP instead of experts
    n_expert_shared: int = 0
    n_nextn: int = 0          # trailing multi-token-prediction blocks: in the file, not in n_layer, never run

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Glm4MoeConfig":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)
        gating = f.get_int(key("expert_gating_func"), GATING_SIGMOID)
        if gating != GATING_SIGMOID:
            raise UnsupportedError(f"{f.path}: expert_gating_func {gating} is not supported for GLM-4.5 "
                                   f"(only sigmoid, {GATING_SIGMOID})")
        n_blocks, nextn = kw["n_layer"], f.get_int(key("nextn_predict_layers"), 0)
        if not 0 <= nextn < n_blocks:
            raise ModelError(f"{f.path}: nextn_predict_layers {nextn} must be at least 0 and fewer than "
                             f"block_count {n_blocks}")
        # llama.cpp's glm4moe: no renormalisation and no scaling unless the file says
        experts = cls.experts_from_gguf(f, n_ff_exp=f.get_int(key("expert_feed_forward_length")), norm_default=False)
        n_shared = f.get_int(key("expert_shared_count"))
        kw.update(experts, n_layer=n_blocks - nextn, n_nextn=nextn, n_expert_shared=n_shared,
                  n_ff_shexp=experts["n_ff_exp"] * n_shared,
                  n_dense_lead=f.get_int(key("leading_dense_block_count"), 0))
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_experts()
        common.check_range("leading_dense_block_count", self.n_dense_lead, 0, self.n_layer)
        common.check_range("expert_shared_count", self.n_expert_shared, 0, 64)
        if self.n_dense_lead:
            common.check_range("feed_forward_length", self.n_ff, 1, 1 << 20)

    def is_dense(self, layer: int) -> bool:
        return layer < self.n_dense_lead


@dataclass(eq=False)
class Attention(common.Attention):
    """Separate biased projections; each q and k head RMS-normed where the file has the norms."""

    attn_q_norm: RMSNorm | None = tensor("attn_q_norm", optional=True, shape=("head_dim",))
    attn_k_norm: RMSNorm | None = tensor("attn_k_norm", optional=True, shape=("head_dim",))

    def project(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        eps = self.cfg.eps
        q, k, v = super().project(ctx, x)                                           # [hd, H|Hkv, T]
        if self.attn_q_norm is not None:
            q = self.attn_q_norm(ctx, q, eps)
        if self.attn_k_norm is not None:
            k = self.attn_k_norm(ctx, k, eps)
        return q, k, v


@dataclass(eq=False)
class MoE(Module):
    """The routed experts plus the shared expert(s), on the same input."""

    routed: common.SigmoidExperts = module()
    shared: common.SharedExpert = module()

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return ctx.add(self.routed(ctx, x), self.shared(ctx, x))


@dataclass(eq=False)
class RoutedOnly(Module):
    """expert_shared_count 0: the routed experts alone."""

    routed: common.SigmoidExperts = module()

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return self.routed(ctx, x)


@dataclass(eq=False)
class DenseBlock(Module):
    """x + attn(attn_norm(x)), then + mlp(post_attention_norm(.))."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: Attention = module()
    post_attention_norm: RMSNorm = tensor("post_attention_norm", shape=("n_embd",))
    mlp: common.MLP = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.attn(ctx, self.attn_norm(ctx, x, eps), batch, layer, inputs))
        return ctx.add(x, self.mlp(ctx, self.post_attention_norm(ctx, x, eps)))


@dataclass(eq=False)
class MoeBlock(DenseBlock):
    mlp: MoE = module()


@dataclass(eq=False)
class RoutedOnlyBlock(DenseBlock):
    mlp: RoutedOnly = module()


def block_kind(cfg: Glm4MoeConfig, layer: int) -> type:
    if cfg.is_dense(layer):
        return DenseBlock
    return MoeBlock if cfg.n_expert_shared > 0 else RoutedOnlyBlock


@register("glm4moe")
@dataclass(eq=False)
class Glm4Moe(common.Decoder):
    Config = Glm4MoeConfig

    rope_freqs: F32Param | None = None                 # llama.cpp's glm4moe takes no RoPE factors
    layers: list[DenseBlock] = blocks("blk", kind=block_kind)   # n_layer: the nextn blocks are left out
