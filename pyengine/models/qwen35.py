"""Qwen3.5 (dense): a hybrid of gated attention and Gated DeltaNet layers.  GGUF `qwen35`.

Every `full_attention_interval`-th layer (the 4th, 8th, ... by default) attends;
the others are linear-attention layers whose memory is a fixed-size delta-rule
state per sequence (the cache's recurrent kind).  Each block norms its input,
adds the mixer's output, then norms again (`post_attention_norm`) into a SwiGLU
MLP.  The norm weights are used as the file has them: the converter already
folded Qwen's (1 + w) into them.

Attention layers: `attn_q` yields per head the query then a gate of the same
size; q and k are RMS-normed per head, roped over the first rope.dimension_count
dims (NeoX pairs; the file's rope sections are M-RoPE's, which for text, where
every section sees the same position, is this rope), and the attention output
is multiplied by sigmoid(gate) before `attn_output`.

Linear layers: `attn_qkv` gives the q, k, v channels, run through a causal
depthwise convolution (`ssm_conv1d`, kernel ssm.conv_kernel) and SiLU; q and k
(ssm.group_count heads of ssm.state_size) are L2-normed; per value head
(ssm.time_step_rank of them) beta = sigmoid(ssm_beta x) and the log decay
g = softplus(ssm_alpha x + ssm_dt.bias) * ssm_a (the file holds -exp(A_log));
the gated delta rule gives o, which is RMS-normed per head (`ssm_norm`), times
silu(attn_gate x), then projected by `ssm_out`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml import nn
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import F32Param, Linear, RMSNorm, Weight
from pyengine.models import common
from pyengine.models.binding import Module, blocks, module, tensor
from pyengine.models.config import ROPE_NEOX
from pyengine.models.registry import register

F32_BYTES = 4


@dataclass(frozen=True)
class Qwen35Config(common.AttentionConfig):
    full_attention_interval: int = 4
    conv_kernel: int = 4      # ssm.conv_kernel
    head_k_dim: int = 128     # ssm.state_size: q/k (and value) head size of the linear layers
    n_k_heads: int = 16       # ssm.group_count
    n_v_heads: int = 32       # ssm.time_step_rank
    d_inner: int = 4096       # ssm.inner_size: value heads * value head size

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen35Config":
        key = f.arch_key
        kw = cls.common_from_gguf(f, rope_mode=ROPE_NEOX, eps_default=None)
        return cls(**kw, full_attention_interval=f.get_int(key("full_attention_interval"), 4),
                   conv_kernel=f.get_int(key("ssm.conv_kernel")), head_k_dim=f.get_int(key("ssm.state_size")),
                   n_k_heads=f.get_int(key("ssm.group_count")), n_v_heads=f.get_int(key("ssm.time_step_rank")),
                   d_inner=f.get_int(key("ssm.inner_size")))

    def __post_init__(self) -> None:
        super().__post_init__()
        common.check_range("full_attention_interval", self.full_attention_interval, 1, 1 << 16)
        common.check_range("ssm.conv_kernel", self.conv_kernel, 2, 64)
        common.check_range("ssm.state_size", self.head_k_dim, 1, 1024)
        common.check_range("ssm.group_count", self.n_k_heads, 1, 1024)
        common.check_range("ssm.time_step_rank", self.n_v_heads, 1, 1024)
        if self.n_v_heads % self.n_k_heads:
            raise ModelError(f"ssm.time_step_rank {self.n_v_heads} is not a multiple of ssm.group_count "
                             f"{self.n_k_heads}")
        if self.d_inner != self.n_v_heads * self.head_v_dim or self.head_v_dim != self.head_k_dim:
            raise ModelError(f"ssm.inner_size {self.d_inner} is not ssm.time_step_rank {self.n_v_heads} value "
                             f"heads of ssm.state_size {self.head_k_dim}")

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0

    @property
    def head_v_dim(self) -> int:
        return self.d_inner // self.n_v_heads

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def conv_channels(self) -> int:
        """Channels of the q/k/v projection the convolution runs over."""
        return 2 * self.key_dim + self.d_inner

    @property
    def q_gate_dim(self) -> int:
        """Rows of an attention layer's query projection: each head's query, then its gate."""
        return 2 * self.q_dim

    def cache_layout(self) -> list:
        state = nn.RecurrentSpec(conv_dim=(self.conv_kernel - 1) * self.conv_channels,
                                 state_dim=self.n_v_heads * self.head_k_dim * self.head_v_dim)
        attn = nn.CacheSpec(k_dim=self.kv_dim, v_dim=self.kv_dim)
        return [state if self.is_recurrent(i) else attn for i in range(self.n_layer)]


@dataclass(eq=False)
class BareF32:
    """A float32 vector the converter names without a suffix (`ssm_a`)."""

    weight: Weight

    PARTS = {"weight": True}
    F32_PARTS = ("weight",)
    BARE = True


@dataclass(eq=False)
class F32Bias:
    """A float32 vector stored as `<name>.bias` alone (`ssm_dt.bias`)."""

    bias: Weight

    PARTS = {"bias": True}
    F32_PARTS = ("bias",)


def head_views(ctx: Context, x: Tensor, head_dim: int, n_heads: int, stride: int, offset: int) -> Tensor:
    """[head_dim, n_heads, T] contiguous: heads `stride` floats apart from `offset` in each row of x."""
    row = x.shape[0] * F32_BYTES
    return ctx.cont(ctx.view(x, (head_dim, n_heads, x.shape[1]), (F32_BYTES, stride * F32_BYTES, row),
                             offset * F32_BYTES))


@dataclass(eq=False)
class GatedAttention(Module):
    attn_q: Linear | None = tensor("attn_q", optional=True, shape=("n_embd", "q_gate_dim"))
    attn_k: Linear | None = tensor("attn_k", optional=True, shape=("n_embd", "kv_dim"))
    attn_v: Linear | None = tensor("attn_v", optional=True, shape=("n_embd", "kv_dim"))
    attn_q_norm: RMSNorm | None = tensor("attn_q_norm", optional=True, shape=("head_dim",))
    attn_k_norm: RMSNorm | None = tensor("attn_k_norm", optional=True, shape=("head_dim",))
    attn_output: Linear | None = tensor("attn_output", optional=True, shape=("q_dim", "n_embd"))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        c = self.cfg
        hd = c.head_dim
        q_gate = self.attn_q(ctx, x)                                               # [2*hd*H, T]
        q = head_views(ctx, q_gate, hd, c.n_head, 2 * hd, 0)                       # [hd, H, T]
        gate = ctx.reshape(head_views(ctx, q_gate, hd, c.n_head, 2 * hd, hd), (c.q_dim, -1))
        k = common.split_heads(ctx, self.attn_k(ctx, x), hd)                       # [hd, Hkv, T]
        q = c.rope(ctx, self.attn_q_norm(ctx, q, c.eps), batch.positions)
        k = c.rope(ctx, self.attn_k_norm(ctx, k, c.eps), batch.positions)
        o = nn.attention(ctx, batch, layer, q, ctx.reshape(k, (c.kv_dim, -1)), self.attn_v(ctx, x),
                         n_head_kv=c.n_head_kv, scale=c.attn_scale)                # [hd*H, T]
        return self.attn_output(ctx, ctx.mul(o, ctx.sigmoid(gate)))


@dataclass(eq=False)
class DeltaNet(Module):
    attn_qkv: Linear | None = tensor("attn_qkv", optional=True, shape=("n_embd", "conv_channels"))
    attn_gate: Linear | None = tensor("attn_gate", optional=True, shape=("n_embd", "d_inner"))
    ssm_conv1d: F32Param | None = tensor("ssm_conv1d", optional=True, shape=("conv_kernel", "conv_channels"))
    ssm_dt: F32Bias | None = tensor("ssm_dt", optional=True)
    ssm_a: BareF32 | None = tensor("ssm_a", optional=True)
    ssm_beta: Linear | None = tensor("ssm_beta", optional=True, shape=("n_embd", "n_v_heads"))
    ssm_alpha: Linear | None = tensor("ssm_alpha", optional=True, shape=("n_embd", "n_v_heads"))
    ssm_norm: RMSNorm | None = tensor("ssm_norm", optional=True, shape=("head_v_dim",))
    ssm_out: Linear | None = tensor("ssm_out", optional=True, shape=("d_inner", "n_embd"))

    def log_decay(self, ctx: Context, x: Tensor) -> Tensor:
        """g [Hv, T] = softplus(alpha x + dt_bias) * ssm_a (ssm_a = -exp(A_log) <= 0)."""
        alpha = ctx.add(self.ssm_alpha(ctx, x), ctx.weight(self.ssm_dt.bias))
        return ctx.mul(ctx.softplus(alpha), ctx.weight(self.ssm_a.weight))

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int) -> Tensor:
        c = self.cfg
        rec = batch.recurrent_inputs(layer)
        beta = ctx.sigmoid(self.ssm_beta(ctx, x))                                  # [Hv, T]
        g = self.log_decay(ctx, x)                                                 # [Hv, T]
        mixed = ctx.ssm_conv(self.attn_qkv(ctx, x), ctx.weight(self.ssm_conv1d.weight), rec.conv, rec.seqs)
        mixed = ctx.silu(mixed)                                                    # [conv_channels, T]
        dk, dv = c.head_k_dim, c.head_v_dim
        q = ctx.l2_norm(head_views(ctx, mixed, dk, c.n_k_heads, dk, 0), c.eps)     # [Dk, Hk, T]
        k = ctx.l2_norm(head_views(ctx, mixed, dk, c.n_k_heads, dk, c.key_dim), c.eps)
        v = head_views(ctx, mixed, dv, c.n_v_heads, dv, 2 * c.key_dim)             # [Dv, Hv, T]
        o = ctx.delta_net(q, k, v, g, beta, rec.state, rec.seqs, scale=1.0 / math.sqrt(dk))   # [Dv, Hv, T]
        z = common.split_heads(ctx, self.attn_gate(ctx, x), dv)                    # [Dv, Hv, T]
        o = ctx.mul(self.ssm_norm(ctx, o, c.eps), ctx.silu(z))
        return self.ssm_out(ctx, ctx.reshape(o, (c.d_inner, -1)))


@dataclass(eq=False)
class Block(Module):
    """x + mixer(norm(x)), then + mlp(post_attention_norm(.)); the mixer is the
    layer's kind: gated attention or the delta rule."""

    attn_norm: RMSNorm = tensor("attn_norm", shape=("n_embd",))
    attn: GatedAttention = module()
    linear: DeltaNet = module()
    post_attention_norm: RMSNorm = tensor("post_attention_norm", shape=("n_embd",))
    mlp: common.MLP = module()

    def mixer(self, layer: int):
        mixer = self.linear if self.cfg.is_recurrent(layer) else self.attn
        missing = [n for n, v in vars(mixer).items() if v is None]
        if missing:
            raise ModelError(f"layer {layer} ({type(mixer).__name__}) is missing tensors: {', '.join(missing)}")
        return mixer

    def __call__(self, ctx: Context, x: Tensor, batch, layer: int, inputs: common.LayerInputs) -> Tensor:
        eps = self.cfg.eps
        x = ctx.add(x, self.mixer(layer)(ctx, self.attn_norm(ctx, x, eps), batch, layer))
        return ctx.add(x, self.mlp(ctx, self.post_attention_norm(ctx, x, eps)))


@register("qwen35")
@dataclass(eq=False)
class Qwen35(common.Decoder):
    Config = Qwen35Config

    rope_freqs: None = None
    layers: list[Block] = blocks("blk")

    def shift_keys(self, ctx, k, positions, layer, n_ctx_seq=None):
        raise ModelError("qwen35 keeps recurrent states, which cannot be shifted")
