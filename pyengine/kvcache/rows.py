"""How K/V rows are stored: the cache types and their conversions.

A cache row of `dim` values is held in one numpy row of raw storage:

- "f16": `dim` uint16 (the F16 bits; uint16 so numpy never converts them by
  accident).  The default, as in llama.cpp and Ollama.
- "q8_0": `dim / 32` Q8_0 blocks of 34 bytes (an F16 scale and 32 int8), as
  uint8 - 34/64 of the F16 size.  The native attention dots queries
  quantized to Q8_0 with the K blocks and dequantizes V rows (csrc/cpu/ops_attn.c).
  Every head's slice of a row must be whole blocks, so head_dim must be a
  multiple of 32.

Rows that Python changes (a context shift's re-rotation) are decoded to
float32 and encoded back with the native kernels of the active instruction
set, the ones the graph's set_rows writes with, so a re-rotated row is
quantized exactly as a freshly computed one would be.

The option's names follow llama.cpp's --cache-type-k/v values; like Ollama's
OLLAMA_KV_CACHE_TYPE, $PYENGINE_KV_CACHE_TYPE sets the default.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pyengine import _core, hugepages
from pyengine.errors import InvalidOptionError
from pyengine.ml.context import F16, Q8_0

KV_CACHE_TYPE_ENV = "PYENGINE_KV_CACHE_TYPE"
DEFAULT_KV_TYPE = "f16"


@dataclass(frozen=True)
class RowFormat:
    """One cache type: its native type id, block geometry and numpy storage."""

    name: str
    type_id: int
    block: int          # values per block
    block_bytes: int
    dtype: type         # numpy element of the stored rows

    def storage_width(self, dim: int) -> int:
        """Elements of `dtype` in a stored row of `dim` values."""
        return dim // self.block * self.block_bytes // np.dtype(self.dtype).itemsize

    def check_dim(self, dim: int, what: str) -> None:
        if dim % self.block:
            raise InvalidOptionError(
                f"kv_type {self.name!r} stores rows in blocks of {self.block} values, but {what} is {dim}; "
                f"use kv_type='f16' for this model")

    def tables(self, shapes: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """Zeroed row tables [n, storage_width(dim)] for the (n, dim) shapes, carved from
        one block of memory: in 2 MiB pages where there are to be had (hugepages.py; the
        rows a token attends to lie scattered over many 4 KiB pages otherwise), each
        table on a cache line."""
        itemsize = np.dtype(self.dtype).itemsize
        sizes = []
        for n, dim in shapes:
            self.check_dim(dim, "a cache row")
            sizes.append(n * self.storage_width(dim) * itemsize)
        block = hugepages.zeros(sum(_lines(size) for size in sizes))
        tables, offset = [], 0
        for (n, dim), size in zip(shapes, sizes):
            tables.append(block[offset:offset + size].view(self.dtype).reshape(n, self.storage_width(dim)))
            offset += _lines(size)
        return tables

    def decode(self, rows: np.ndarray, dim: int) -> np.ndarray:
        """Stored rows [n, width] -> float32 [n, dim]."""
        n = rows.shape[0]
        if self.name == "f16":
            return rows.view(np.float16).astype(np.float32)
        flat = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)
        return _core.dequantize(self.type_id, flat, n * dim, False).reshape(n, dim)

    def encode(self, x: np.ndarray) -> np.ndarray:
        """float32 [n, dim] -> stored rows [n, width]."""
        x = np.ascontiguousarray(x, np.float32)
        n, dim = x.shape
        if self.name == "f16":
            return x.astype(np.float16).view(np.uint16)
        blocks = _core.quantize(self.type_id, x.reshape(-1), False)
        return blocks.view(self.dtype).reshape(n, self.storage_width(dim))


FORMATS = {
    "f16": RowFormat("f16", F16, 1, 2, np.uint16),
    "q8_0": RowFormat("q8_0", Q8_0, 32, 34, np.uint8),
}
KV_TYPES = tuple(FORMATS)


def resolve_kv_type(kv_type: str | None) -> str:
    """The cache type to use: `kv_type`, or $PYENGINE_KV_CACHE_TYPE when it is None,
    else f16.  Names are case-insensitive (Q8_0 = q8_0)."""
    if kv_type is None:
        env = os.environ.get(KV_CACHE_TYPE_ENV, "").strip()
        if not env:
            return DEFAULT_KV_TYPE
        name = env.lower()
        if name not in FORMATS:
            raise InvalidOptionError(f"{KV_CACHE_TYPE_ENV}={env!r} is not a KV cache type: "
                                     f"use one of {', '.join(KV_TYPES)}")
        return name
    name = kv_type.strip().lower() if isinstance(kv_type, str) else None
    if name not in FORMATS:
        raise InvalidOptionError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
    return name


def row_format(kv_type: str | None) -> RowFormat:
    return FORMATS[resolve_kv_type(kv_type)]


__all__ = ["RowFormat", "FORMATS", "KV_TYPES", "KV_CACHE_TYPE_ENV", "DEFAULT_KV_TYPE",
           "resolve_kv_type", "row_format"]


def _lines(nbytes: int) -> int:
    """nbytes rounded up to whole 64-byte cache lines."""
    return (nbytes + 63) // 64 * 64
