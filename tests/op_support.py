"""What the op tests share: random float32 inputs drawn from a module's own generator (so
each module keeps its seed and its draws), and a graph output computed and read back."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def f32_drawer(rng: np.random.Generator) -> Callable[..., np.ndarray]:
    """f32(*shape, scale=1.0): a float32 array of `shape`, standard normal times scale, from `rng`."""
    def f32(*shape, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    return f32


def computed(ctx, out):
    """Mark `out` as ctx's output, compute the graph and read `out` back."""
    ctx.set_output(out)
    ctx.compute()
    return ctx.read(out)
