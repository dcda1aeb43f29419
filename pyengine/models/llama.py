"""Llama (and the Mistral family): RMSNorm, RoPE, grouped-query attention,
SiLU-gated MLP, `rope_freqs` (Llama 3's factors) where the file has them.
Mixtral is a Llama whose file has experts (`expert_count` > 0): every layer's
MLP is then a mixture of experts (ffn_gate_inp, ffn_{gate,up,down}_exps), a
softmax router whose `expert_used_count` best experts are weighted by their
probabilities renormalised over the chosen, as llama.cpp's llama graph has
it; the experts' hidden size is `feed_forward_length`.
GGUF `general.architecture = llama`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.binding import blocks, module
from pyengine.models.config import ROPE_NORMAL
from pyengine.models.registry import register


@dataclass(frozen=True)
class LlamaConfig(common.ExpertsConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "LlamaConfig":
        # GGUF llama weights are permuted for the interleaved ("normal") layout; a value
        # head size of its own is refused by the tensors' shapes
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NORMAL, equal_heads=False)
        # llama.cpp's llama always renormalises and sizes its experts by feed_forward_length
        kw.update(cls.experts_from_gguf(f, n_ff_exp=kw["n_ff"]), norm_expert_weights=True)
        return cls(**kw)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_expert or self.n_expert_used:
            self.check_experts()


@dataclass(eq=False)
class MoeBlock(common.PreNormBlock):
    """Llama's block with the MLP replaced by routed experts (Mixtral)."""

    mlp: common.SoftmaxExperts = module()


def block_kind(cfg: LlamaConfig, layer: int) -> type:
    return MoeBlock if cfg.n_expert > 0 else common.PreNormBlock


@register("llama", "mistral")
@dataclass(eq=False)
class Llama(common.Decoder):
    Config = LlamaConfig

    layers: list[common.PreNormBlock] = blocks("blk", kind=block_kind)
