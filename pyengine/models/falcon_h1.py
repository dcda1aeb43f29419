"""TII Falcon-H1: in every layer attention and a Mamba-2 mixer run side by side on
the same normed input (one `attn_norm`), their outputs added to each other and to
the residual, then a pre-normed SiLU-gated MLP.  Attention: NeoX RoPE (no
`rope_freqs` factors: llama.cpp loads them but never applies them), scores scaled
by 1/sqrt(head_dim).  The mixer is Mamba-2's, its grouped `ssm_norm` optional.
The MLP's norm is `blk.N.ffn_norm`, with no `.weight` (as the converter names it).

Falcon-H1's muP multipliers (embedding, attention in/out, key, SSM in/out, the
five slices of ssm_in, MLP gate/down, lm head) appear nowhere at run time:
llama.cpp's converter folds each into the weights it multiplies.

Every layer keeps both an attention K/V and a recurrent state: the cache layout
holds the n_layer attention entries, then the n_layer states (`ssm_slot`).
GGUF `general.architecture = falcon-h1`."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, RMSNorm
from pyengine.gguf import GGUFFile
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register


@dataclass(frozen=True)
class FalconH1Config(common.Mamba2AttentionConfig):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "FalconH1Config":
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)   # llama.cpp requires the RMS eps
        return cls(**kw, **cls.ssm_from_gguf(f))

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_ssm()

    def ssm_slot(self, layer: int) -> int:
        """Layer `layer`'s recurrent state in the cache layout (after every layer's K/V)."""
        return self.n_layer + layer

    def cache_layout(self) -> list[nn.LayerCache]:
        return super().cache_layout() + [self.mamba2_cache() for _ in range(self.n_layer)]


@dataclass(eq=False)
class Mixer(common.Mamba2Mixer):
    """Mamba-2's mixer, the gated output normed per group only where the file has ssm_norm."""

    ssm_norm: RMSNorm | None = tensor("ssm_norm", shape=("group_dim", "n_group"), optional=True)

    def group_norm(self, ctx: Context, y: Tensor) -> Tensor:
        return super().group_norm(ctx, y) if self.ssm_norm is not None else y


@dataclass(eq=False)
class BareRMSNorm(RMSNorm):
    """RMS norm weights named without `.weight`: Falcon-H1's ffn_norm, which the converter
    maps from the checkpoint's whole `pre_ff_layernorm.weight` name to `blk.N.ffn_norm`."""

    BARE = True


@dataclass(eq=False)
class Block(Module):
    """h = norm(x); x + attention(h) + mixer(h), then + mlp(norm(.))."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: common.Attention = module()
    mixer: Mixer = module()
    ffn_norm: BareRMSNorm = tensor("ffn_norm", alt="ffn_norm.weight", shape=("n_embd",))   # (llama.cpp: bare only)
    mlp: common.MLP = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps = self.cfg.eps
        h = self.attn_norm(ctx, x, eps)
        both = ctx.add(self.attn(ctx, h, batch, layer, inputs), self.mixer(ctx, h, batch, self.cfg.ssm_slot(layer)))
        x = ctx.add(both, x)
        return ctx.add(self.mlp(ctx, self.ffn_norm(ctx, x, eps)), x)


@register("falcon-h1")
@dataclass(eq=False)
class FalconH1(common.Decoder):
    Config = FalconH1Config

    rope_freqs: F32Param | None = None   # never applied by llama.cpp
    layers: list[Block] = blocks("blk")
