"""LFM2 (Liquid AI): a hybrid of attention layers and gated short-convolution
layers (models/common.py).  Every layer is pre-normed (`attn_norm`) and
followed by a pre-normed SiLU-gated MLP; what sits between is, by the file's
per-layer `attention.head_count_kv`, either attention (a count > 0: q/k/v, each q
and k head RMS-normed, NeoX RoPE) or, where the count is 0, a short convolution.
The final norm is `token_embd_norm`; the output is tied to the token embedding
unless the file has one.  GGUF `general.architecture = lfm2`.

LFM2-MoE (`lfm2moe`, models/lfm2moe.py) and the sliding-window variant are other
architectures."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.nn import F32Param, RMSNorm
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.registry import register


@dataclass(frozen=True)
class Lfm2Config(common.ShortConvConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Lfm2Config":
        return cls(**cls.shortconv_from_gguf(f))


@dataclass(eq=False)
class Block(common.ShortConvBlock):
    mlp: common.MLP = module()


@register("lfm2")
@dataclass(eq=False)
class Lfm2(common.Decoder):
    Config = Lfm2Config

    rope_freqs: F32Param | None = None
    layers: list[Block] = blocks("blk")
    output_norm: RMSNorm = tensor("token_embd_norm", shape=("n_embd",))

    def cache_layout(self) -> list[nn.LayerCache]:
        common.check_shortconv_layers("lfm2", self.layers, self.cfg.recurrent)
        return self.cfg.cache_layout()
