"""LFM2's hybrid of attention and gated short-convolution layers, the pieces the
architectures built on it share (lfm2, lfm2moe): the config (which layers are
convolutions, by the file's per-layer `attention.head_count_kv`), the short
convolution itself and the block around it, whose MLP a subclass binds.

A short convolution: in_proj gives B, C and x (in that order, n_embd rows each),
B*x runs through a causal depthwise convolution over the last `shortconv.l_cache`
tokens (its window is the layer's recurrent state), C gates the result, out_proj
projects it."""

from __future__ import annotations

from dataclasses import dataclass

from pyengine.errors import ModelError, UnsupportedError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, Linear, RMSNorm
from pyengine.models import common
from pyengine.models.binding import Module, module, tensor
from pyengine.models.config import ROPE_NEOX


@dataclass(frozen=True)
class ShortConvConfig(common.AttentionConfig):
    ZERO_KV_LAYERS = True

    conv_kernel: int = 3                     # shortconv.l_cache: taps of the convolution
    recurrent: tuple[bool, ...] = ()         # per layer: a short convolution (no attention)

    @classmethod
    def shortconv_from_gguf(cls, f: GGUFFile) -> dict:
        """The shared keys plus the layer kinds and the convolution's window."""
        key = f.arch_key
        if f.get_int(key("attention.sliding_window"), 0) > 0:
            raise UnsupportedError(f"{f.path}: LFM2 with sliding-window attention is not supported yet")
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)
        kw["recurrent"] = common.zero_kv_layers(f, kw["n_layer"], kw["n_head_kv"])
        kw["conv_kernel"] = f.get_int(key("shortconv.l_cache"))
        return kw

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("shortconv.l_cache", self.conv_kernel, 2, 64)
        if len(self.recurrent) != self.n_layer:
            raise ModelError(f"{len(self.recurrent)} layer kinds for {self.n_layer} layers")

    @property
    def n_bcx(self) -> int:
        """Rows of the short convolution's input projection: B, C and x."""
        return 3 * self.n_embd

    @property
    def conv_state_dim(self) -> int:
        """A sequence's convolution window: the last kernel-1 tokens' n_embd channels."""
        return (self.conv_kernel - 1) * self.n_embd

    def cache_layout(self) -> list[nn.LayerCache]:
        return [nn.RecurrentSpec(conv_dim=self.conv_state_dim, state_dim=0) if rec
                else nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim) for rec in self.recurrent]


@dataclass(eq=False)
class ShortConv(Module):
    """out_proj(C * conv(B * x)), B, C, x from in_proj; the convolution reads and
    writes the layer's window rows in the recurrent cache."""

    in_proj: Linear = tensor("shortconv.in_proj", shape=("n_embd", "n_bcx"))
    conv: F32Param = tensor("shortconv.conv", shape=("conv_kernel", "n_embd"))
    out_proj: Linear = tensor("shortconv.out_proj", shape=("n_embd", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        n = self.cfg.n_embd
        rec = batch.recurrent_inputs(layer)
        bcx = self.in_proj(ctx, x)                                                 # [3*n_embd, T]
        b, c, v = (ctx.rows_slice(bcx, i * n, n) for i in range(3))
        y = ctx.ssm_conv(ctx.mul(b, v), ctx.weight(self.conv.weight), rec.conv, rec.seqs)   # [n_embd, T]
        return self.out_proj(ctx, ctx.mul(c, y))


@dataclass(eq=False)
class ShortConvBlock(Module):
    """x + (attention or short convolution)(norm(x)), then + mlp(norm(.)); a subclass binds `mlp`."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: common.HeadNormAttention | None = module(present_if="attn_q")
    shortconv: ShortConv | None = module(present_if="shortconv.in_proj")
    ffn_norm: RMSNorm = tensor("ffn_norm", shape=("n_embd",))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps = self.cfg.eps
        h = self.attn_norm(ctx, x, eps)
        if self.shortconv is not None:
            h = self.shortconv(ctx, h, batch, layer)
        else:
            h = self.attn(ctx, h, batch, layer, inputs)
        x = ctx.add(x, h)
        return ctx.add(x, self.mlp(ctx, self.ffn_norm(ctx, x, eps)))


def check_layer_kinds(arch: str, layers, recurrent: tuple[bool, ...]) -> None:
    """Each block has the mixer head_count_kv gives its layer, and only that one."""
    for i, (block, rec) in enumerate(zip(layers, recurrent)):
        if (block.shortconv is not None, block.attn is not None) != (rec, not rec):
            raise ModelError(f"layer {i} of an {arch} model must have "
                             f"{'a short convolution' if rec else 'attention'} only, as head_count_kv says")
