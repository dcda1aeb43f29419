"""Small layers: each holds bound weights and adds a few ops to a Context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pyengine import _core
from pyengine.ml.context import F32, Context, Tensor


@dataclass(eq=False)
class Weight:
    """One GGUF tensor, used in place: raw blocks of `type`, GGML-ordered shape."""

    name: str
    type: int
    shape: tuple[int, ...]
    data: np.ndarray  # uint8 view over the mmap, or a float32 array after a fix-up

    def to_f32(self) -> "Weight":
        """The same tensor as float32 values (for small tensors: norms, biases)."""
        if self.type == F32:
            return self
        n = int(np.prod(self.shape))
        values = _core.dequantize(self.type, np.ascontiguousarray(self.data).reshape(-1), n, True)
        return Weight(self.name, F32, self.shape, values)


@dataclass(eq=False)
class Linear:
    """y = W x (+ b).  W is [in, out] in GGML order."""

    weight: Weight
    bias: Weight | None = None

    PARTS = {"weight": True, "bias": False}
    F32_PARTS = ("bias",)
    INTERLEAVE = True   # only multiplied: the weight may be stored in the ISA's faster layout

    def __call__(self, ctx: Context, x: Tensor) -> Tensor:
        return linears(ctx, (self,), x)[0]


def linears(ctx: Context, layers: Sequence[Linear], x: Tensor) -> list[Tensor]:
    """Several projections of one input (q, k and v; gate and up): every product first,
    then the biases, so that the products run back to back on one quantized copy of x
    (the core runs such a run without barriers between them)."""
    ys = [ctx.mul_mat(ctx.weight(layer.weight), x) for layer in layers]
    return [y if layer.bias is None else ctx.add(y, ctx.weight(layer.bias)) for layer, y in zip(layers, ys)]


@dataclass(eq=False)
class RMSNorm:
    weight: Weight

    PARTS = {"weight": True}
    F32_PARTS = ("weight",)

    def __call__(self, ctx: Context, x: Tensor, eps: float) -> Tensor:
        return ctx.rms_norm(x, ctx.weight(self.weight), eps)


@dataclass(eq=False)
class Embedding:
    weight: Weight

    PARTS = {"weight": True}
    F32_PARTS = ()
    LOOKUP = True   # a few rows read per token: left in the file's mapping, not copied

    def __call__(self, ctx: Context, ids: Tensor) -> Tensor:
        return ctx.get_rows(ctx.weight(self.weight), ids)


@dataclass(eq=False)
class Param:
    """A bare tensor used directly by the model (rope factors, expert stacks)."""

    weight: Weight

    PARTS = {"weight": True}
    F32_PARTS = ()


@dataclass(eq=False)
class Experts:
    """A stack of expert matrices W [in, out, E] with an optional bias row per
    expert [out, E]: y[:, u, t] = W[ids[u, t]] x[:, u|0, t] (+ that expert's bias)."""

    weight: Weight
    bias: Weight | None = None

    PARTS = {"weight": True, "bias": False}
    F32_PARTS = ("bias",)
    INTERLEAVE = True   # only multiplied: the stack may be stored in the ISA's faster layout

    def __call__(self, ctx: Context, x: Tensor, ids: Tensor) -> Tensor:
        y = ctx.mul_mat_id(ctx.weight(self.weight), x, ids)
        return y if self.bias is None else ctx.add_id(y, ctx.weight(self.bias), ids)


@dataclass(eq=False)
class F32Param(Param):
    """A bare tensor the ops need as float32 (rope frequency factors)."""

    F32_PARTS = ("weight",)


def attention(ctx: Context, batch, layer: int, q: Tensor, k: Tensor, v: Tensor, *,
              n_head_kv: int, scale: float, softcap: float = 0.0, sinks: Tensor | None = None) -> Tensor:
    """Store this batch's k and v in the layer's cache, then attend q over it.

    q is [head_dim, n_head, T]; k and v are [head_dim * n_head_kv, T] (rows
    may be strided views); returns [head_dim * n_head, T].  sinks: F32
    [n_head] logits that join each head's softmax (Context.attn)."""
    inputs = batch.attn_inputs(layer)
    k_cache = ctx.set_rows(inputs.k, k, inputs.slots)
    v_cache = ctx.set_rows(inputs.v, v, inputs.slots)
    return ctx.attn(q, k_cache, v_cache, inputs.mask, inputs.kv_len, cell_pos=inputs.cell_pos,
                    n_head_kv=n_head_kv, scale=scale, softcap=softcap, sinks=sinks)


@dataclass(frozen=True)
class CacheSpec:
    """What one layer keeps in the KV cache: row sizes and its attention window."""

    k_dim: int
    v_dim: int
    window: int = 0  # sliding-window size in tokens; 0 = attends to everything
