"""Image resampling as llama.cpp's mtmd does it (img_tool::resize_pillow): Pillow's
separable filters with 22-bit fixed-point weights, the horizontal pass first, each
pass rounded and clamped to uint8.

Pillow itself gives other pixels on some downscales (up to 3 levels apart on 619 of
the 2784 channel values of an 18x65 -> 16x58 bicubic resize, with the Pillow this
project runs), which moves a sensitive tower's embeddings past the 1e-3 bound; this follows
llama.cpp's code path step by step instead.  Each pass is a loop over the filter's
taps, vectorised over the pixels (the weights of output pixel i are nonzero on input
pixels start[i] .. start[i] + taps - 1 only).
"""

from __future__ import annotations

import math

import numpy as np

PRECISION_BITS = 32 - 8 - 2   # llama.cpp's and Pillow's: 8-bit pixels, 2 bits of headroom
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}
BICUBIC_A = -0.5              # Pillow's (GGML and PyTorch use -0.75)


def _filter(kind: str, x: float) -> float:
    x = abs(x)
    if kind == "bilinear":
        return 1.0 - x if x < 1.0 else 0.0
    a = BICUBIC_A
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return 0.0


def taps(n_in: int, n_out: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(input index int64 [n_out, k], fixed-point weight int64 [n_out, k]) of one axis;
    unused taps have weight 0 (and a valid index)."""
    scale = n_in / n_out
    filterscale = max(scale, 1.0)            # a downscale widens the filter against aliasing
    support = SUPPORT[kind] * filterscale
    k = int(math.ceil(support)) * 2 + 1
    index = np.zeros((n_out, k), np.int64)
    weight = np.zeros((n_out, k), np.int64)
    for out in range(n_out):
        center = (out + 0.5) * scale
        start = max(int(center - support + 0.5), 0)
        count = min(int(center + support + 0.5), n_in) - start
        values = [_filter(kind, (i + start - center + 0.5) / filterscale) for i in range(count)]
        total = sum(values)
        for i, value in enumerate(values):
            value = value / total if total != 0.0 else value
            # round half away from zero, then truncate (as the C cast does)
            weight[out, i] = int(value * (1 << PRECISION_BITS) + (-0.5 if value < 0 else 0.5))
            index[out, i] = start + i
    return index, weight


def _pass(pixels: np.ndarray, n_out: int, axis: int, kind: str) -> np.ndarray:
    """One axis of uint8 [h, w, 3] resampled to n_out (axis 1: the width, 0: the height)."""
    src = np.moveaxis(pixels, axis, 0).astype(np.int64)              # [n_in, other, 3]
    index, weight = taps(src.shape[0], n_out, kind)
    acc = np.full((n_out,) + src.shape[1:], 1 << (PRECISION_BITS - 1), np.int64)
    for t in range(index.shape[1]):
        acc += src[index[:, t]] * weight[:, t, None, None]
    return np.moveaxis(np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8), 0, axis)


def resize(rgb: np.ndarray, width: int, height: int, kind: str = "bicubic") -> np.ndarray:
    """uint8 RGB [h, w, 3] resampled to [height, width, 3] (`kind`: bilinear or bicubic)."""
    if kind not in SUPPORT:
        raise ValueError(f"unknown filter {kind!r} (known: {', '.join(SUPPORT)})")
    out = rgb
    if width != rgb.shape[1]:
        out = _pass(out, width, 1, kind)
    if height != rgb.shape[0]:
        out = _pass(out, height, 0, kind)
    return np.ascontiguousarray(out)
