"""Re-rotating cached keys for a context shift.

RoPE by position a followed by RoPE by position d equals RoPE by a + d, so
keys that move d positions are roped once more with every position set to d
(M-RoPE: d in the three streams a token's position moves, 0 in the fourth, which
every token holds at 0; llama.cpp's shift turns the fourth stream's pairs too).
The cache hands the rows over as float32 (decoded from F16 or Q8_0), they go
through a small graph built for the shift (shifts are rare, so the graph is
not kept) and the cache stores them back in its own type (kvcache/rows.py).

How a layer ropes is the model's business: its `shift_keys` (the model
protocol, models/common.py) builds the re-rotation of one layer's keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from pyengine.errors import ModelError
from pyengine.ml.context import Backend, Context, Tensor

if TYPE_CHECKING:
    from pyengine.models.common import CausalLM


class KeyRotator:
    """Callable for KVCache.shift: re-ropes K rows of the given layers by `delta`.
    n_ctx_seq: the context one sequence may fill, for models whose RoPE depends on
    it (Phi-3's LongRoPE); the forward graphs must have been built for the same."""

    def __init__(self, model: CausalLM, backend: Backend, n_ctx_seq: int | None = None) -> None:
        self.model = model
        self.backend = backend
        # a model whose cached rows are not whole key heads (MLA's latent + rope row) says
        # how wide a piece its shift_keys takes
        self.head_dim = getattr(model, "shift_head_dim", None) or model.cfg.head_dim
        self.n_ctx_seq = n_ctx_seq

    def __call__(self, layers: Sequence[int], rows: Sequence[np.ndarray], delta: int) -> list[np.ndarray]:
        ctx = Context(self.backend)
        outputs: list[Tensor] = []
        keep = []
        for layer, x in zip(layers, rows):
            x = np.ascontiguousarray(x, np.float32)
            n, k_dim = x.shape
            if k_dim % self.head_dim:
                raise ModelError(f"layer {layer}: key rows of {k_dim} values are not whole heads of {self.head_dim}")
            positions = shift_positions(n, delta, getattr(self.model.cfg, "ROPE_STREAMS", 1))
            keep += [x, positions]
            heads = ctx.input(x, f"k.{layer}", (self.head_dim, k_dim // self.head_dim, n))
            pos = ctx.input(positions, f"pos.{layer}")
            out = self.model.shift_keys(ctx, heads, pos, layer, self.n_ctx_seq)
            ctx.set_output(out)
            outputs.append(out)
        ctx.compute()
        return [ctx.read(out).reshape(x.shape) for out, x in zip(outputs, rows)]


def shift_positions(n: int, delta: int, streams: int) -> np.ndarray:
    """int32 positions that move n keys by delta: [n], or [n, 4] for M-RoPE's streams."""
    if streams == 1:
        return np.full(n, delta, np.int32)
    out = np.zeros((n, streams), np.int32)
    out[:, :3] = delta
    return out
