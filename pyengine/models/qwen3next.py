"""Qwen3-Next (Qwen3-Next-80B-A3B): gated attention and Gated DeltaNet layers with a
mixture of experts and a gated shared expert in every layer.  GGUF `qwen3next`.

It is Qwen3.5-MoE's model (common.py's DeltaNet pieces, DeltaNetMoeConfig,
GatedSharedExpertMoE) but for how the linear layers lay out their heads:

* beta and alpha come from one projection, `ssm_ba`, grouped by q/k head: for
  each of the ssm.group_count q/k heads, the betas of its Hv/Hk value heads, then
  their alphas;
* value head h reads q/k head h // (Hv/Hk) (each q/k head repeated in place), where
  Qwen3.5's GGUF tiles them (h % Hk).

The layer pattern is `full_attention_interval`'s, or the file's
`attention.recurrent_layers` where it has one; the trailing `nextn_predict_layers`
blocks (multi-token prediction) are in the file but never run.  Files from the
converter's first Qwen3-Next version have in each linear layer one `ssm_in` in place
of attn_qkv and attn_gate: q, k, v and z grouped per q/k head (its query, its key,
then the values and the gates of its Hv/Hk value heads), regrouped here into the
channels the convolution runs over, as llama.cpp does."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pyengine.errors import ModelError
from pyengine.gguf import GGUFFile
from pyengine.ml.context import Context, Tensor
from pyengine.ml.nn import Linear
from pyengine.models import common
from pyengine.models.binding import blocks, module, tensor
from pyengine.models.registry import register


@dataclass(frozen=True)
class Qwen3NextConfig(common.DeltaNetMoeConfig):
    recurrent: tuple[bool, ...] = ()    # per layer, where the file lists them; else the interval's pattern
    n_nextn: int = 0                    # trailing multi-token-prediction blocks: in the file, not in n_layer

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "Qwen3NextConfig":
        base = super().from_gguf(f)
        key = f.arch_key
        nextn = f.get_int(key("nextn_predict_layers"), 0)
        if not 0 <= nextn < base.n_layer:
            raise ModelError(f"{f.path}: nextn_predict_layers {nextn} must be at least 0 and fewer than "
                             f"block_count {base.n_layer}")
        n_layer = base.n_layer - nextn
        listed = f.metadata.get(key("attention.recurrent_layers"))
        recurrent = ()
        if listed is not None:
            if not isinstance(listed, (list, tuple, np.ndarray)) or len(listed) < n_layer:
                raise ModelError(f"{f.path}: attention.recurrent_layers must list at least {n_layer} layers")
            recurrent = tuple(bool(r) for r in list(listed)[:n_layer])
        return dataclasses.replace(base, n_layer=n_layer, n_nextn=nextn, recurrent=recurrent)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.recurrent and len(self.recurrent) != self.n_layer:
            raise ModelError(f"{len(self.recurrent)} layer kinds for {self.n_layer} layers")

    def is_recurrent(self, layer: int) -> bool:
        return self.recurrent[layer] if self.recurrent else super().is_recurrent(layer)

    @property
    def n_ba(self) -> int:
        """Rows of ssm_ba: a beta and an alpha per value head."""
        return 2 * self.n_v_heads

    @property
    def qkvz_dim(self) -> int:
        """Rows of the first converter's fused ssm_in: q, k, v and z."""
        return 2 * self.key_dim + 2 * self.d_inner

    @property
    def heads_per_key(self) -> int:
        """Value heads per q/k head."""
        return self.n_v_heads // self.n_k_heads


@dataclass(eq=False)
class GroupedDeltaNet(common.DeltaNet):
    """common.DeltaNet with beta and alpha from ssm_ba and each q/k head serving the
    value heads next to one another."""

    ssm_beta: None = None
    ssm_alpha: None = None
    ssm_ba: Linear | None = tensor("ssm_ba", optional=True, shape=("n_embd", "n_ba"))
    ssm_in: Linear | None = tensor("ssm_in", optional=True, shape=("n_embd", "qkvz_dim"))   # the first layout

    def unbound(self) -> list[str]:
        """ssm_in stands for attn_qkv and attn_gate, or is not there."""
        replaced = ("attn_qkv", "attn_gate") if self.ssm_in is not None else ("ssm_in",)
        return [name for name in super().unbound() if name not in replaced]

    def projections(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.ssm_in is None:
            return super().projections(ctx, x)
        c = self.cfg
        dk, group_v = c.head_k_dim, c.head_v_dim * c.heads_per_key
        per_group = 2 * dk + 2 * group_v                                           # one q/k head's q, k, v, z
        qkvz = self.ssm_in(ctx, x)                                                 # [Hk * per_group, T]

        def part(size: int, offset: int) -> Tensor:
            """[size * Hk, T]: `size` rows at `offset` of every q/k head's group, head after head."""
            rows = common.head_views(ctx, qkvz, size, c.n_k_heads, per_group, offset)
            return ctx.reshape(rows, (size * c.n_k_heads, -1))

        qkv = ctx.concat(ctx.concat(part(dk, 0), part(dk, dk)), part(group_v, 2 * dk))
        return qkv, part(group_v, 2 * dk + group_v)

    def gates(self, ctx: Context, x: Tensor) -> tuple[Tensor, Tensor]:
        c = self.cfg
        r = c.heads_per_key
        ba = self.ssm_ba(ctx, x)                                                   # [2*Hv, T]: per q/k head, r of each
        beta = ctx.reshape(common.head_views(ctx, ba, r, c.n_k_heads, 2 * r, 0), (c.n_v_heads, -1))
        alpha = ctx.reshape(common.head_views(ctx, ba, r, c.n_k_heads, 2 * r, r), (c.n_v_heads, -1))
        return ctx.sigmoid(beta), self.log_decay(ctx, alpha)

    def key_heads(self, ctx: Context, q: Tensor) -> Tensor:
        """[Dk, Hv, T]: each q/k head of q [Dk, Hk, T] repeated Hv/Hk times in place."""
        c = self.cfg
        flat = ctx.reshape(q, (c.head_k_dim, -1))                                  # [Dk, Hk*T]
        out = flat
        for _ in range(c.heads_per_key - 1):
            out = ctx.concat(out, flat)                                            # [j*Dk, Hk*T]
        return ctx.reshape(out, (c.head_k_dim, c.n_v_heads, -1))


@dataclass(eq=False)
class Block(common.DeltaNetHybridBlock):
    linear: GroupedDeltaNet = module()
    mlp: common.GatedSharedExpertMoE = module()


@register("qwen3next")
@dataclass(eq=False)
class Qwen3Next(common.Decoder):
    Config = Qwen3NextConfig

    rope_freqs: None = None
    layers: list[Block] = blocks("blk")          # the config's n_layer: the nextn blocks are left out

    def shift_keys(self, ctx, k, positions, layer, n_ctx_seq=None):
        raise ModelError("qwen3next keeps recurrent states, which cannot be shifted")
