"""Tencent Hunyuan dense models (0.5B to 7B): Llama's block -- RMSNorm,
grouped-query attention, SiLU-gated MLP, the output tied to the token
embedding when the file has no `output.weight` -- with NeoX-style RoPE and an
RMS norm over each query and key head applied AFTER RoPE (Qwen3 norms before
it).  GGUF `general.architecture = hunyuan-dense`.

Hunyuan's NTK "alpha" RoPE scaling is folded into `rope.freq_base` by the
converter (with `rope.scaling.type` none); a file that carries
`rope.scaling.alpha` instead gets llama.cpp's base * alpha^(head_dim /
(head_dim - 2)).  Other scalings are read by the shared config.  XD-RoPE
sections (Hunyuan-VL's) and a fused attn_qkv are refused.

The cached keys are normed after RoPE, so a context shift cannot just rotate
them further (llama.cpp's K-shift does, and leaves them off by the norm
weight's unevenness): the key norm's weight is divided out, the keys rotated
and normed again, which gives a fresh run's keys."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import F32, Context, Tensor
from pyengine.ml.nn import F32Param, RMSNorm, Weight
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class HunyuanDenseConfig(common.AttentionConfig):
    ROPE_WHOLE_HEADS = True

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "HunyuanDenseConfig":
        key = f.arch_key
        if "blk.0.attn_qkv.weight" in f.tensors:
            raise UnsupportedError(f"{f.path}: a fused attn_qkv is not supported for hunyuan-dense yet; "
                                   "use a file with separate attn_q, attn_k and attn_v tensors")
        if any(int(s) for s in f.get_array(key("rope.dimension_sections"), ())):
            raise UnsupportedError(f"{f.path}: XD-RoPE sections (rope.dimension_sections, Hunyuan-VL's) "
                                   "are not supported")
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)   # HF's q/k layout: NeoX pairs
        alpha = f.get_float(key("rope.scaling.alpha"), 0.0)
        if alpha > 0:   # NTK alpha: in float32, as llama.cpp scales the base
            hd = kw["head_dim"]
            if hd <= 2:
                raise ModelError(f"rope.scaling.alpha needs a head size above 2, got {hd}")
            exponent = np.float32(hd) / np.float32(hd - 2)
            kw["rope_base"] = float(np.float32(kw["rope_base"]) * np.power(np.float32(alpha), exponent))
        return cls(**kw)


@dataclass(eq=False)
class Attention(common.Attention):
    """q/k/v projections (optional biases), RoPE, then each q and k head RMS-normed."""

    attn_q_norm: RMSNorm = tensor("attn_q_norm", shape=("head_dim",))
    attn_k_norm: RMSNorm = tensor("attn_k_norm", shape=("head_dim",))
    k_norm_inverse: Weight | None = None   # 1 / the key norm's weight (0 where it is 0), made at load

    def __post_init__(self) -> None:
        w = self.attn_k_norm.weight
        values = np.asarray(w.data).view(np.float32).reshape(-1)
        inverse = np.divide(1.0, values, out=np.zeros_like(values), where=values != 0)
        self.k_norm_inverse = Weight(f"{w.name}.inverse", F32, w.shape, inverse)

    def rerope(self, ctx: Context, k: Tensor, positions: Tensor, layer: int) -> Tensor:
        """Cached keys k [hd, Hkv, n] (normed after RoPE) moved by `positions` more."""
        c = self.cfg
        k = ctx.mul(k, ctx.weight(self.k_norm_inverse))                             # the normed head
        return self.attn_k_norm(ctx, c.layer_rope(ctx, k, positions, layer), c.eps)

    def position(self, ctx: Context, q: Tensor, k: Tensor, positions: Tensor, layer: int,
                 freq_factors: Tensor | None) -> tuple[Tensor, Tensor]:
        c = self.cfg
        q = self.attn_q_norm(ctx, c.layer_rope(ctx, q, positions, layer), c.eps)       # [hd, H, T]
        k = self.attn_k_norm(ctx, c.layer_rope(ctx, k, positions, layer), c.eps)       # [hd, Hkv, T]
        return q, k


@dataclass(eq=False)
class Block(common.PreNormBlock):
    attn: Attention = module()


@register("hunyuan-dense")
@dataclass(eq=False)
class HunyuanDense(common.Decoder):
    """The shared decoder with Hunyuan's blocks; `rope_freqs` is not bound (llama.cpp
    ropes Hunyuan without frequency factors)."""

    Config = HunyuanDenseConfig

    rope_freqs: F32Param | None = None
    layers: list[Block] = blocks("blk")

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        return self.layers[layer].attn.rerope(ctx, k, positions, layer)
