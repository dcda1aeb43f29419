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
class LayerNorm:
    """(x - mean) / sqrt(var + eps) * w, plus a bias where the file has one."""

    weight: Weight
    bias: Weight | None = None

    PARTS = {"weight": True, "bias": False}
    F32_PARTS = ("weight", "bias")

    def __call__(self, ctx: Context, x: Tensor, eps: float) -> Tensor:
        y = ctx.layer_norm(x, ctx.weight(self.weight), eps)
        return y if self.bias is None else ctx.add(y, ctx.weight(self.bias))


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
class F32Bias:
    """A bare float32 tensor stored as `{name}.bias` alone (llama.cpp's exp_probs_b:
    a bias on the experts' selection scores)."""

    bias: Weight

    PARTS = {"bias": True}
    F32_PARTS = ("bias",)


@dataclass(eq=False)
class F32Param(Param):
    """A bare tensor the ops need as float32 (rope frequency factors)."""

    F32_PARTS = ("weight",)


@dataclass(eq=False)
class BareF32Param(F32Param):
    """A float32 tensor whose GGUF name has no `.weight` part (Mamba's ssm_a, ssm_d)."""

    BARE = True


def attention(ctx: Context, batch, layer: int, q: Tensor, k: Tensor, v: Tensor, *,
              n_head_kv: int, scale: float, softcap: float = 0.0, sinks: Tensor | None = None,
              alibi_max_bias: float = 0.0) -> Tensor:
    """Store this batch's k and v in the layer's cache, then attend q over it.

    q is [head_dim, n_head, T]; k and v are [head_dim * n_head_kv, T] (rows
    may be strided views); returns [head_dim * n_head, T].  sinks: F32
    [n_head] logits that join each head's softmax (Context.attn).
    alibi_max_bias > 0: ALiBi (the runner's mask then holds distances;
    runner/forward.py)."""
    inputs = batch.attn_inputs(layer)
    k_cache = ctx.set_rows(inputs.k, k, inputs.slots)
    v_cache = ctx.set_rows(inputs.v, v, inputs.slots)
    return ctx.attn(q, k_cache, v_cache, inputs.mask, inputs.kv_len, cell_pos=inputs.cell_pos,
                    n_head_kv=n_head_kv, scale=scale, softcap=softcap, sinks=sinks,
                    alibi_max_bias=alibi_max_bias)


def latent_attention(ctx: Context, batch, layer: int, q: Tensor, kv: Tensor, *, v_dim: int, scale: float) -> Tensor:
    """Multi-head latent attention (MLA) over a compressed cache: store this batch's
    rows kv [k_dim, T] (the latent, then the roped key part) in the layer's K cache,
    then attend q [k_dim, H, T] over it as one KV head whose values are the first
    v_dim entries of each row (a view, nothing stored twice); returns [v_dim * H, T].
    The layer's V cache is not used (its CacheSpec says v_dim=0)."""
    inputs = batch.attn_inputs(layer)
    k_cache = ctx.set_rows(inputs.k, kv, inputs.slots)                            # [k_dim, C]
    k_dim, n_cells = k_cache.shape[0], k_cache.shape[1]
    type_id = ctx.graph.type_of(k_cache.id)
    v = ctx.view(k_cache, (v_dim, n_cells), (_core.block_bytes(type_id), _core.row_bytes(type_id, k_dim)))
    return ctx.attn(q, k_cache, v, inputs.mask, inputs.kv_len, cell_pos=inputs.cell_pos, n_head_kv=1, scale=scale)


@dataclass(frozen=True)
class CacheSpec:
    """What one layer keeps in the KV cache: row sizes and its attention window."""

    k_dim: int
    v_dim: int
    window: int = 0  # sliding-window size in tokens; 0 = attends to everything
    chunked: bool = False   # the window is a chunk: a token sees its chunk's earlier tokens


def first_visible(pos: int, window: int, chunked: bool) -> int:
    """The first position a token at `pos` sees through a sliding window of `window`
    tokens (its own included), or in its chunk of `window` positions; 0 for window 0."""
    if window <= 0:
        return 0
    return pos - pos % window if chunked else max(0, pos - window + 1)


@dataclass(frozen=True)
class RecurrentSpec:
    """What one recurrent layer keeps per sequence: a state of fixed size, whatever the
    context (kvcache/recurrent.py).  Two float32 parts, each one row per state: the
    convolution window (the last kernel-1 tokens' channels) and the SSM / delta-rule
    state; a layer without one of them gives it 0 values."""

    conv_dim: int
    state_dim: int


@dataclass(frozen=True)
class EncoderSpec:
    """What one cross-attention layer keeps per sequence: K/V rows computed once (an
    image's, an encoder prompt's) and read by every later token (kvcache/encoder.py).
    `n_rows`: the most rows one memory may have."""

    k_dim: int
    v_dim: int
    n_rows: int


# What one layer keeps in the cache, one of the kinds above (models' cache_layout()).
LayerCache = CacheSpec | RecurrentSpec | EncoderSpec
