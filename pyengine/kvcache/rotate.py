"""Re-rotating cached keys for a context shift.

RoPE by position a followed by RoPE by position d equals RoPE by a + d, so
keys that move d positions are roped once more with every position set to d.
The cache hands the rows over as float32 (decoded from F16 or Q8_0), they go
through a small graph built for the shift (shifts are rare, so the graph is
not kept) and the cache stores them back in its own type (kvcache/rows.py).

How a layer ropes is the model's business: `model.rope_for_layer(ctx, x,
positions, layer)` when the model has it, else the config's `layer_rope`
(per-layer bases), else the config's `rope` with the model's frequency
factors when it has them -- asked of `cfg.rotation_only()`, since the keys
already carry the rope's magnitude (attention factor, YaRN's mscale).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pyengine.errors import ModelError
from pyengine.ml.context import Backend, Context, Tensor


class KeyRotator:
    """Callable for KVCache.shift: re-ropes K rows of the given layers by `delta`."""

    def __init__(self, model, backend: Backend) -> None:
        self.model = model
        self.backend = backend
        self.head_dim = model.cfg.head_dim

    def __call__(self, layers: Sequence[int], rows: Sequence[np.ndarray], delta: int) -> list[np.ndarray]:
        ctx = Context(self.backend)
        outputs: list[Tensor] = []
        keep = []
        for layer, x in zip(layers, rows):
            x = np.ascontiguousarray(x, np.float32)
            n, k_dim = x.shape
            if k_dim % self.head_dim:
                raise ModelError(f"layer {layer}: key rows of {k_dim} values are not whole heads of {self.head_dim}")
            positions = np.full(n, delta, np.int32)
            keep += [x, positions]
            heads = ctx.input(x, f"k.{layer}", (self.head_dim, k_dim // self.head_dim, n))
            pos = ctx.input(positions, f"pos.{layer}")
            out = self._rope(ctx, heads, pos, layer)
            ctx.set_output(out)
            outputs.append(out)
        ctx.compute()
        return [ctx.read(out).reshape(x.shape) for out, x in zip(outputs, rows)]

    def _rope(self, ctx: Context, x: Tensor, positions: Tensor, layer: int) -> Tensor:
        model, cfg = self.model, self.model.cfg.rotation_only()
        hook = getattr(model, "rope_for_layer", None)
        if hook is not None:
            return hook(ctx, x, positions, layer)
        factors = getattr(model, "rope_freqs", None)
        ff = ctx.weight(factors.weight) if factors is not None else None
        layer_rope = getattr(cfg, "layer_rope", None)
        if layer_rope is not None:
            return layer_rope(ctx, x, positions, layer, ff)
        return cfg.rope(ctx, x, positions, freq_factors=ff)
