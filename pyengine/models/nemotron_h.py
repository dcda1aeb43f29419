"""NVIDIA Nemotron-H (Nemotron Nano 2): every layer is one pre-normed sublayer and
a residual add, the sublayer one of three kinds, read as llama.cpp reads them from
the per-layer `attention.head_count_kv` and `feed_forward_length` arrays:

* a Mamba-2 mixer where both are 0;
* attention where only the MLP length is 0: no position encoding at all (the
  Mamba-2 layers before it carry the order), scores scaled by 1/sqrt(head_dim)
  (llama.cpp reads no `attention.scale` for it), an optional output bias;
* an MLP where the length is > 0: down(relu(up x)^2), ungated, optional biases;
  in a file with experts (Nemotron 3's `nemotron_h_moe`, which llama.cpp builds
  with the same graph) routed squared-ReLU experts instead, scored by
  sigmoid(router) with a selection bias (exp_probs_b), weighted by their
  scores (renormalised when `expert_weights_norm`, times
  `expert_weights_scale`), plus an ungated squared-ReLU shared expert.

Only the Mamba-2 and attention layers keep anything in the cache: the layout
holds one entry per such layer, in layer order (`cache_slots`).
GGUF `general.architecture = nemotron_h` or `nemotron_h_moe`.  Refused for now:
the MoE latent projections (`moe_latent_size`, Nemotron 3 Super), expert
groups, counts that differ between layers, and the multi-token-prediction
blocks (`nextn_predict_layers`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, Linear, RMSNorm
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.common import check_range
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

SSM, ATTENTION, MLP = "ssm", "attention", "mlp"


def per_layer(f: GGUFFile, name: str, n_layer: int, default: int) -> list[int]:
    """A count the converter writes once per layer (or once for all of them)."""
    value = f.metadata.get(f.arch_key(name), default)
    if not isinstance(value, (list, tuple, np.ndarray)):
        return [int(value)] * n_layer
    if len(value) != n_layer:
        raise ModelError(f"{f.path}: {len(value)} {name} entries for {n_layer} layers")
    return [int(v) for v in value]


def layer_kinds(head_count_kv: list[int], ffn_lengths: list[int]) -> tuple[str, ...]:
    """llama.cpp's rule: recurrent iff both are 0, else attention iff the MLP length is 0."""
    return tuple(SSM if n_kv == 0 and n_ff == 0 else ATTENTION if n_ff == 0 else MLP
                 for n_kv, n_ff in zip(head_count_kv, ffn_lengths))


def norm_eps(f: GGUFFile) -> float:
    """The RMS epsilon, else the LayerNorm one (llama.cpp's fallback for this architecture)."""
    for name in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        if f.arch_key(name) in f.metadata:
            return f.get_float(f.arch_key(name))
    raise ModelError(f"{f.path}: missing metadata key {f.arch_key('attention.layer_norm_epsilon')!r} "
                     "(nemotron_h models must set their norm epsilon)")


def experts_from_gguf(f: GGUFFile, kw: dict) -> dict:
    """The routed and shared experts' keys of a file with experts (expert_count > 0)."""
    key = f.arch_key
    for name in ("moe_latent_size", "nextn_predict_layers"):
        if f.get_int(key(name), 0) > 0:
            raise UnsupportedError(f"{f.path}: Nemotron-H with {name} > 0 is not supported yet")
    if f.get_int(key("expert_group_count"), 1) > 1:
        raise UnsupportedError(f"{f.path}: Nemotron-H with expert groups is not supported yet")
    n_used = _uniform_int(f, "expert_used_count", kw["n_layer"])
    n_ff_exp = _uniform_int(f, "expert_feed_forward_length", kw["n_layer"], kw["n_ff"] // max(n_used, 1))
    out = common.ExpertsConfig.experts_from_gguf(f, n_ff_exp=n_ff_exp, norm_default=False)   # llama.cpp's default
    out.update(n_expert_used=n_used, n_ff_shexp=f.get_int(key("expert_shared_feed_forward_length"), 0))
    return out


def _uniform_int(f: GGUFFile, name: str, n_layer: int, default: int = 0) -> int:
    """A per-layer count that must be one value on the layers that set it (0: unset)."""
    counts = {n for n in per_layer(f, name, n_layer, default) if n} or {0}
    if len(counts) > 1:
        raise UnsupportedError(f"{f.path}: {f.arch_key(name)} differs between layers ({sorted(counts)}); "
                               "pyengine runs Nemotron-H models whose expert layers are alike")
    return counts.pop()


@dataclass(frozen=True)
class NemotronHConfig(common.Mamba2AttentionConfig, common.ExpertsConfig):
    ZERO_KV_LAYERS = True
    ZERO_FF_LAYERS = True

    kinds: tuple[str, ...] = ()   # per layer: SSM, ATTENTION or MLP

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "NemotronHConfig":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX)   # (no layer ropes)
        n_layer = kw["n_layer"]
        kinds = layer_kinds(per_layer(f, "attention.head_count_kv", n_layer, kw["n_head_kv"]),
                            per_layer(f, "feed_forward_length", n_layer, kw["n_ff"]))
        kw.update(eps=norm_eps(f), kinds=kinds, **cls.ssm_from_gguf(f))
        if f.get_int(f.arch_key("expert_count"), 0) > 0:
            kw.update(experts_from_gguf(f, kw))
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        if SSM in self.kinds:
            self.check_ssm()
        if self.n_expert:
            self.check_experts()
            check_range("expert_shared_feed_forward_length", self.n_ff_shexp, 1, 1 << 20)
        if len(self.kinds) != self.n_layer:
            raise ModelError(f"{len(self.kinds)} layer kinds for {self.n_layer} layers")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ModelError(f"the norm epsilon must be positive, got {self.eps}")

    @property
    def cache_slots(self) -> tuple[int | None, ...]:
        """Per layer its entry in the cache layout; None for an MLP layer (it keeps nothing)."""
        slots, n = [], 0
        for kind in self.kinds:
            slots.append(None if kind == MLP else n)
            n += kind != MLP
        return tuple(slots)

    def cache_layout(self) -> list[nn.LayerCache]:
        return [self.mamba2_cache() if kind == SSM else nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim)
                for kind in self.kinds if kind != MLP]


def squared_relu(ctx: Context, x: Tensor) -> Tensor:
    r = ctx.relu(x)                                                                # (ggml's sqr(relu(x)))
    return ctx.mul(r, r)


@dataclass(eq=False)
class SquaredReluMLP(Module):
    """down(relu(up x)^2), each projection with an optional bias."""

    ffn_up: Linear = tensor("ffn_up", shape=("n_embd", "n_ff"))
    ffn_down: Linear = tensor("ffn_down", shape=("n_ff", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return self.ffn_down(ctx, squared_relu(ctx, self.ffn_up(ctx, x)))


@dataclass(eq=False)
class SquaredReluExperts(common.SigmoidExperts):
    """Sigmoid-routed experts with a selection bias (SigmoidExperts' routing), each
    down(relu(up x)^2): no gate."""

    ffn_gate_exps: nn.Experts | None = None

    def experts(self, ctx: Context, x: Tensor, chosen: Tensor) -> Tensor:
        x = ctx.reshape(x, (self.cfg.n_embd, 1, x.shape[-1]))                      # one input for all U
        return self.ffn_down_exps(ctx, squared_relu(ctx, self.ffn_up_exps(ctx, x, chosen)), chosen)


@dataclass(eq=False)
class ExpertsMLP(Module):
    """The routed experts plus the shared expert down(relu(up x)^2)."""

    routed: SquaredReluExperts = module()
    ffn_up_shexp: Linear = tensor("ffn_up_shexp", shape=("n_embd", "n_ff_shexp"))
    ffn_down_shexp: Linear = tensor("ffn_down_shexp", shape=("n_ff_shexp", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        shared = self.ffn_down_shexp(ctx, squared_relu(ctx, self.ffn_up_shexp(ctx, x)))
        return ctx.add(self.routed(ctx, x), shared)


@dataclass(eq=False)
class Block(Module):
    """x + (Mamba-2, attention or MLP)(norm(x))."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    mixer: common.Mamba2Mixer | None = module(present_if="ssm_in")
    attn: common.NoRopeAttention | None = module(present_if="attn_q")
    mlp: SquaredReluMLP | None = module(present_if="ffn_up")
    moe: ExpertsMLP | None = module(present_if="ffn_gate_inp")

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        h = self.attn_norm(ctx, x, self.cfg.eps)
        slot = self.cfg.cache_slots[layer]
        if self.mixer is not None:
            h = self.mixer(ctx, h, batch, slot)
        elif self.attn is not None:
            h = self.attn(ctx, h, batch, slot, inputs)
        else:
            h = (self.moe or self.mlp)(ctx, h)
        return ctx.add(x, h)

    def kind(self) -> str | None:
        """The one sublayer bound, or None where the file gives none or several."""
        bound = [k for k, m in ((SSM, self.mixer), (ATTENTION, self.attn), (MLP, self.mlp), (MLP, self.moe))
                 if m is not None]
        return bound[0] if len(bound) == 1 else None


@register("nemotron_h", "nemotron_h_moe")
@dataclass(eq=False)
class NemotronH(common.Decoder):
    Config = NemotronHConfig

    rope_freqs: F32Param | None = None   # no rope anywhere
    layers: list[Block] = blocks("blk")

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        return k   # unroped keys hold no position (the recurrent layers refuse a shift anyway)

    def cache_layout(self) -> list[nn.LayerCache]:
        for i, (block, kind) in enumerate(zip(self.layers, self.cfg.kinds)):
            if block.kind() != kind:
                raise ModelError(f"layer {i} of a nemotron_h model must hold only the {kind} sublayer "
                                 "its head_count_kv and feed_forward_length say")
        return self.cfg.cache_layout()
