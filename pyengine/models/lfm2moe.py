"""LFM2-MoE (Liquid AI's LFM2-8B-A1B): LFM2's hybrid of attention and gated
short-convolution layers (models/common.py) whose MLP, past the first
`leading_dense_block_count` layers, is a mixture of experts: sigmoid(router)
scores the experts, the `expert_used_count` best by score plus a per-expert
selection bias (`exp_probs_b`, which only chooses) run their SiLU-gated MLPs,
weighted by their unbiased scores renormalised over the chosen (llama.cpp
always renormalises and never scales them for this architecture, whatever the
file's expert_weights_norm / expert_weights_scale).  The leading layers keep a
dense SiLU-gated MLP of `feed_forward_length`.  GGUF `lfm2moe`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.nn import F32Param, RMSNorm
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.registry import register

GATING_SIGMOID = 2   # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID, what LFM2-MoE's converter writes


@dataclass(frozen=True)
class Lfm2MoeConfig(common.ShortConvConfig, common.ExpertsConfig):
    n_dense_lead: int = 0     # leading layers with a dense MLP instead of experts

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Lfm2MoeConfig":
        key = f.arch_key
        gating = f.get_int(key("expert_gating_func"), GATING_SIGMOID)
        if gating != GATING_SIGMOID:
            raise UnsupportedError(f"{f.path}: expert_gating_func {gating} is not supported for LFM2-MoE "
                                   f"(only sigmoid, {GATING_SIGMOID})")
        experts = cls.experts_from_gguf(f, n_ff_exp=f.get_int(key("expert_feed_forward_length")))
        return cls(**cls.shortconv_from_gguf(f), **dict(experts, norm_expert_weights=True, expert_weights_scale=1.0),
                   n_dense_lead=f.get_int(key("leading_dense_block_count"), 0))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_experts()
        common.check_range("leading_dense_block_count", self.n_dense_lead, 0, self.n_layer)
        if self.n_dense_lead:
            common.check_range("feed_forward_length", self.n_ff, 1, 1 << 20)

    def is_dense(self, layer: int) -> bool:
        return layer < self.n_dense_lead


@dataclass(eq=False)
class DenseBlock(common.ShortConvBlock):
    mlp: common.MLP = module()


@dataclass(eq=False)
class MoeBlock(common.ShortConvBlock):
    mlp: common.SigmoidExperts = module()


def block_kind(cfg: Lfm2MoeConfig, layer: int) -> type:
    return DenseBlock if cfg.is_dense(layer) else MoeBlock


@register("lfm2moe")
@dataclass(eq=False)
class Lfm2Moe(common.Decoder):
    Config = Lfm2MoeConfig

    rope_freqs: F32Param | None = None
    layers: list[common.ShortConvBlock] = blocks("blk", kind=block_kind)
    output_norm: RMSNorm = tensor("token_embd_norm", shape=("n_embd",))

    def cache_layout(self) -> list[nn.LayerCache]:
        common.check_shortconv_layers("lfm2moe", self.layers, self.cfg.recurrent)
        return self.cfg.cache_layout()
