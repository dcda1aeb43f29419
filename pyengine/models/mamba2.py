"""Mamba-2: every layer a pre-normed Mamba-2 mixer and a residual add, no
attention, no MLP.  The mixer: ssm_in projects a token to z (d_inner), xBC
(d_inner + 2 * groups * state) and dt (one per head); xBC runs through a causal
depthwise convolution (ssm.conv_kernel taps, with a bias) and SiLU, and splits
into x [head_dim, heads], B and C [state, groups]; the selective scan
(ssm_scan: softplus(dt + dt_bias), the decay exp(dt A), the skip D x) gives y,
gated by silu(z), RMS-normed per group (ssm_norm), projected by ssm_out.
GGUF `general.architecture = mamba2`: `ssm.inner_size`, `ssm.state_size`,
`ssm.time_step_rank` (the heads), `ssm.group_count`, `ssm.conv_kernel`."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import BareF32Param, Embedding, Linear, RMSNorm, Weight
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.common import check_range
from pyengine.models.registry import register

F32_BYTES = 4


@dataclass(frozen=True)
class Mamba2Config:
    """No attention, so none of TransformerConfig's heads or RoPE."""

    n_vocab: int
    n_embd: int
    n_layer: int
    eps: float
    n_ctx_train: int
    d_inner: int
    d_state: int
    n_ssm_head: int
    n_group: int
    conv_kernel: int

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Mamba2Config":
        key = f.arch_key
        embd = f.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelError(f"missing tensor 'token_embd.weight' in {f.path}")
        return cls(n_vocab=embd.shape[1], n_embd=f.get_int(key("embedding_length")),
                   n_layer=f.get_int(key("block_count")),
                   eps=f.get_float(key("attention.layer_norm_rms_epsilon"), 1e-5),
                   n_ctx_train=f.get_int(key("context_length"), 2048),
                   d_inner=f.get_int(key("ssm.inner_size")), d_state=f.get_int(key("ssm.state_size")),
                   n_ssm_head=f.get_int(key("ssm.time_step_rank")), n_group=f.get_int(key("ssm.group_count"), 1),
                   conv_kernel=f.get_int(key("ssm.conv_kernel")))

    def __post_init__(self) -> None:
        check_range("embedding_length", self.n_embd, 1, 1 << 20)
        check_range("block_count", self.n_layer, 1, 1 << 12)
        check_range("ssm.inner_size", self.d_inner, 1, 1 << 20)
        check_range("ssm.state_size", self.d_state, 1, 1 << 12)
        check_range("ssm.time_step_rank", self.n_ssm_head, 1, self.d_inner)
        check_range("ssm.group_count", self.n_group, 1, self.n_ssm_head)
        check_range("ssm.conv_kernel", self.conv_kernel, 2, 64)
        if self.d_inner % self.n_ssm_head or self.n_ssm_head % self.n_group:
            raise ModelError(f"ssm.inner_size {self.d_inner}, time_step_rank {self.n_ssm_head} and group_count "
                             f"{self.n_group} must divide one another")
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ModelError(f"layer_norm_rms_epsilon must be positive, got {self.eps}")

    @property
    def head_dim(self) -> int:
        return self.d_inner // self.n_ssm_head

    @property
    def n_conv(self) -> int:
        """Channels of the convolution: x, B and C."""
        return self.d_inner + 2 * self.n_group * self.d_state

    @property
    def n_in_proj(self) -> int:
        return self.d_inner + self.n_conv + self.n_ssm_head

    @property
    def group_dim(self) -> int:
        return self.d_inner // self.n_group

    def cache_layout(self) -> list[nn.LayerCache]:
        return [nn.RecurrentSpec(conv_dim=(self.conv_kernel - 1) * self.n_conv,
                                 state_dim=self.n_ssm_head * self.d_state * self.head_dim)
                for _ in range(self.n_layer)]

    def describe(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(eq=False)
class ConvKernel:
    """The convolution's taps [K, channels] and its bias [channels], both float32."""

    weight: Weight
    bias: Weight

    PARTS = {"weight": True, "bias": True}
    F32_PARTS = ("weight", "bias")


@dataclass(eq=False)
class DtBias:
    """The time step's bias, stored as `ssm_dt.bias` alone."""

    bias: Weight

    PARTS = {"bias": True}
    F32_PARTS = ("bias",)


@dataclass(eq=False)
class Mixer(Module):
    ssm_in: Linear = tensor("ssm_in", shape=("n_embd", "n_in_proj"))
    ssm_conv1d: ConvKernel = tensor("ssm_conv1d", shape=("conv_kernel", "n_conv"))
    ssm_dt: DtBias = tensor("ssm_dt")
    ssm_a: BareF32Param = tensor("ssm_a", shape=(1, "n_ssm_head"))
    ssm_d: BareF32Param = tensor("ssm_d", shape=(1, "n_ssm_head"))
    ssm_norm: RMSNorm = tensor("ssm_norm", shape=("group_dim", "n_group"))
    ssm_out: Linear = tensor("ssm_out", shape=("d_inner", "n_embd"))

    def __call__(self, ctx: Context, h: Tensor, batch, layer: int) -> Tensor:
        c = self.cfg
        n_tokens = h.shape[1]
        rec = batch.recurrent_inputs(layer)
        zxbcdt = self.ssm_in(ctx, h)                                               # [n_in_proj, T]
        z = ctx.rows_slice(zxbcdt, 0, c.d_inner)
        xbc = ctx.rows_slice(zxbcdt, c.d_inner, c.n_conv)
        dt = ctx.rows_slice(zxbcdt, c.d_inner + c.n_conv, c.n_ssm_head)            # [H, T]
        xbc = ctx.ssm_conv(xbc, ctx.weight(self.ssm_conv1d.weight), rec.conv, rec.seqs)   # [n_conv, T]
        xbc = ctx.silu(ctx.add(xbc, ctx.weight(self.ssm_conv1d.bias)))
        row = c.n_conv * F32_BYTES
        x = ctx.view(xbc, (c.head_dim, c.n_ssm_head, n_tokens), (F32_BYTES, c.head_dim * F32_BYTES, row))
        b = ctx.view(xbc, (c.d_state, c.n_group, n_tokens), (F32_BYTES, c.d_state * F32_BYTES, row),
                     c.d_inner * F32_BYTES)
        cc = ctx.view(xbc, (c.d_state, c.n_group, n_tokens), (F32_BYTES, c.d_state * F32_BYTES, row),
                      (c.d_inner + c.n_group * c.d_state) * F32_BYTES)
        a = ctx.reshape(ctx.weight(self.ssm_a.weight), (c.n_ssm_head,))
        d = ctx.reshape(ctx.weight(self.ssm_d.weight), (c.n_ssm_head,))
        y = ctx.ssm_scan(x, dt, a, b, cc, rec.state, rec.seqs, D=d, dt_bias=ctx.weight(self.ssm_dt.bias))
        y = ctx.swiglu(z, ctx.reshape(y, (c.d_inner, n_tokens)))                   # silu(z) * y
        y = ctx.rms_norm(ctx.reshape(y, (c.group_dim, c.n_group, n_tokens)), None, c.eps)   # per group
        y = ctx.mul(y, ctx.weight(self.ssm_norm.weight))                           # [gd, G, T] x [gd, G]
        return self.ssm_out(ctx, ctx.reshape(y, (c.d_inner, n_tokens)))


@dataclass(eq=False)
class Block(Module):
    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    mixer: Mixer = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        return ctx.add(x, self.mixer(ctx, self.attn_norm(ctx, x, self.cfg.eps), batch, layer))


@register("mamba2")
@dataclass(eq=False)
class Mamba2(Module):
    Config = Mamba2Config

    token_embd: Embedding = tensor("token_embd", shape=("n_embd", "n_vocab"))
    layers: list[Block] = blocks("blk")
    output_norm: RMSNorm = tensor("output_norm", shape=("n_embd",))
    output: Linear = tensor("output", alt="token_embd", shape=("n_embd", "n_vocab"))

    def hidden(self, ctx: Context, batch) -> Tensor:
        x = self.token_embd(ctx, batch.tokens)                                     # [n_embd, T]
        for i, block in enumerate(self.layers):
            x = block(ctx, x, batch, i)
        return self.output_norm(ctx, ctx.get_rows(x, batch.out_ids), self.cfg.eps)

    def head(self, ctx: Context, x: Tensor) -> Tensor:
        return self.output(ctx, x)

    def forward(self, ctx: Context, batch) -> Tensor:
        return self.head(ctx, self.hidden(ctx, batch))

    def shift_keys(self, ctx: Context, k: Tensor, positions: Tensor, layer: int,
                   n_ctx_seq: int | None = None) -> Tensor:
        raise ModelError("a Mamba-2 model keeps no keys: its state cannot be shifted")

    def cache_layout(self) -> list[nn.LayerCache]:
        return self.cfg.cache_layout()
