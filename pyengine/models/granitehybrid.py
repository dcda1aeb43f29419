"""IBM Granite 4 hybrids: Mamba-2 layers (where the file's per-layer
`attention.head_count_kv` is 0) interleaved with attention layers, each
followed by a pre-normed SiLU-gated MLP, with Granite's four multipliers
(embeddings times `embedding_scale`, the mixer's and the MLP's outputs times
`residual_scale` before each residual add, scores times `attention.scale`,
logits divided by `logit_scale`); interleaved RoPE unless
`rope.scaling.finetuned` is false (Granite 4's NoPE models).
GGUF `general.architecture = granitehybrid`.

The mixture-of-experts variants (`expert_count` > 0: Granite 4 tiny / small)
have experts in place of every layer's MLP: the router's softmax, the
`expert_used_count` best run SiLU-gated MLPs of `feed_forward_length`, weighted
by their probabilities renormalised over the chosen (llama.cpp always
renormalises and never scales them here), plus, where
`expert_shared_feed_forward_length` is set, an ungated shared expert."""

from __future__ import annotations

import math
from dataclasses import dataclass


from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, RMSNorm
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NORMAL
from pyengine.models.registry import register


@dataclass(frozen=True)
class GraniteHybridConfig(common.Mamba2Dims, common.ExpertsConfig):
    ZERO_KV_LAYERS = True

    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    use_rope: bool = True
    recurrent: tuple[bool, ...] = ()   # per layer: Mamba-2 (no attention)
    d_inner: int = 0
    d_state: int = 0
    n_ssm_head: int = 0
    n_group: int = 0
    conv_kernel: int = 0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "GraniteHybridConfig":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, eps_default=None)
        if f.get_int(key("expert_count"), 0) > 0:   # an expert is as wide as the dense MLP would be
            experts = cls.experts_from_gguf(f, n_ff_exp=kw["n_ff"])
            kw.update(experts, norm_expert_weights=True, expert_weights_scale=1.0,
                      n_ff_shexp=f.get_int(key("expert_shared_feed_forward_length"), 0))
        kw.update(embedding_scale=f.get_float(key("embedding_scale"), 0.0) or 1.0,   # 0: not scaled
                  residual_scale=f.get_float(key("residual_scale"), 0.0) or 1.0,
                  logit_scale=f.get_float(key("logit_scale"), 0.0) or 1.0,
                  use_rope=f.get_bool(key("rope.scaling.finetuned"), True),
                  recurrent=common.zero_kv_layers(f, kw["n_layer"], kw["n_head_kv"]), **cls.ssm_from_gguf(f))
        kw["attn_scale"] = f.get_float(key("attention.scale"), 0.0) or kw["attn_scale"]
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ssm()
        if self.n_expert:
            self.check_experts()
            common.check_range("expert_shared_feed_forward_length", self.n_ff_shexp, 0, 1 << 20)
        for name in ("embedding_scale", "residual_scale", "logit_scale"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ModelError(f"hyper-parameter {name} must be positive and finite, got {value}")
        if len(self.recurrent) != self.n_layer:
            raise ModelError(f"{len(self.recurrent)} layer kinds for {self.n_layer} layers")

    def layer_rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int,
                   freq_factors: Tensor | None = None) -> Tensor:
        return super().layer_rope(ctx, x, positions, layer, freq_factors) if self.use_rope else x

    def cache_layout(self) -> list[nn.LayerCache]:
        return [self.mamba2_cache() if rec else nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim)
                for rec in self.recurrent]


@dataclass(eq=False)
class Experts(Module):
    """The routed experts, plus the shared expert where the file has one."""

    routed: common.SoftmaxExperts = module()
    shared: common.SharedExpert | None = module(present_if="ffn_up_shexp")

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        out = self.routed(ctx, x)
        return out if self.shared is None else ctx.add(out, self.shared(ctx, x))


@dataclass(eq=False)
class Block(Module):
    """x + s * (Mamba-2 or attention)(norm(x)), then + s * mlp(norm(.))."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: common.Attention | None = module(present_if="attn_q")
    mixer: common.Mamba2Mixer | None = module(present_if="ssm_in")
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))
    mlp: common.MLP = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps, s = self.cfg.eps, self.cfg.residual_scale
        h = self.attn_norm(ctx, x, eps)
        h = self.mixer(ctx, h, batch, layer) if self.mixer is not None else self.attn(ctx, h, batch, layer, inputs)
        x = ctx.add(x, common.scaled(ctx, h, s))
        return ctx.add(x, common.scaled(ctx, self.mlp(ctx, self.ffn_norm(ctx, x, eps)), s))


@dataclass(eq=False)
class MoeBlock(Block):
    mlp: Experts = module()


def block_kind(cfg: GraniteHybridConfig, layer: int) -> type:
    return MoeBlock if cfg.n_expert else Block


@register("granitehybrid")
@dataclass(eq=False)
class GraniteHybrid(common.Decoder):
    Config = GraniteHybridConfig

    rope_freqs: F32Param | None = None
    layers: list[Block] = blocks("blk", kind=block_kind)

    def embed(self, ctx: Context, tokens: Tensor) -> Tensor:
        return common.scaled(ctx, self.token_embd(ctx, tokens), self.cfg.embedding_scale)   # [n_embd, T]

    def head(self, ctx: Context, x: Tensor) -> Tensor:
        return common.scaled(ctx, self.output(ctx, x), 1.0 / self.cfg.logit_scale)         # [n_vocab, n_out]

    def cache_layout(self) -> list[nn.LayerCache]:
        for i, (block, rec) in enumerate(zip(self.layers, self.cfg.recurrent)):
            if (block.mixer is not None, block.attn is not None) != (rec, not rec):
                raise ModelError(f"layer {i} of a granitehybrid model must have "
                                 f"{'a Mamba-2 mixer' if rec else 'attention'} only, as head_count_kv says")
        return self.cfg.cache_layout()
