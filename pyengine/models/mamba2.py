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
from pyengine.ml.nn import Embedding, Linear, RMSNorm
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.common import check_range
from pyengine.models.registry import register


@dataclass(frozen=True)
class Mamba2Config(common.Mamba2Dims):
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
                   **common.Mamba2Dims.ssm_from_gguf(f))

    def __post_init__(self) -> None:
        check_range("embedding_length", self.n_embd, 1, 1 << 20)
        check_range("block_count", self.n_layer, 1, 1 << 12)
        self.check_ssm()
        if not (self.eps > 0 and math.isfinite(self.eps)):
            raise ModelError(f"layer_norm_rms_epsilon must be positive, got {self.eps}")

    def cache_layout(self) -> list[nn.LayerCache]:
        return [self.mamba2_cache() for _ in range(self.n_layer)]

    def describe(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(eq=False)
class Block(Module):
    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    mixer: common.Mamba2Mixer = module()

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        return ctx.add(x, self.mixer(ctx, self.attn_norm(ctx, x, self.cfg.eps), batch, layer))


@register("mamba2")
@dataclass(eq=False)
class Mamba2(Module):
    Config = Mamba2Config
    shift_head_dim = 1   # the engine's key rotator asks every model; this one has no keys to shift

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
