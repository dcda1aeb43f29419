"""Encoder memory: K/V rows a cross-attention layer reads, computed once per
sequence (an image's, an encoder prompt's) and kept while the sequence lives.

A memory is a run of rows in a pool shared by the cross-attention layers (row r
of every layer's tables belongs to the same memory), attached at a position of
a sequence: the tokens from there on may attend it.  Sequences that share a
prefix holding the memory share its rows; the rows are freed when the last
sequence holding them drops that position.  Rows are stored like K/V rows
(kvcache/rows.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.kvcache.rows import RowFormat
from pyengine.ml.nn import EncoderSpec


@dataclass(eq=False)
class Memory:
    start: int          # first row
    n_rows: int
    at: int             # the position it is attached at
    holders: set[int] = field(default_factory=set)   # sequences that may attend it


class EncoderMemory:
    """Pooled rows of the cross-attention layers of a layout."""

    def __init__(self, layout: Sequence[object], n_rows: int, fmt: RowFormat) -> None:
        if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows < 1:
            raise InvalidOptionError(f"encoder memory rows must be a positive integer, got {n_rows!r}")
        self.layout = list(layout)
        self.layers = [i for i, spec in enumerate(self.layout) if isinstance(spec, EncoderSpec)]
        if not self.layers:
            raise InvalidOptionError("the cache layout has no cross-attention layers")
        self.format = fmt
        self.n_rows = n_rows
        tables = iter(fmt.tables([(n_rows, dim) for i in self.layers
                                  for dim in (self.layout[i].k_dim, self.layout[i].v_dim)]))
        self.k: list[np.ndarray | None] = [None] * len(self.layout)
        self.v: list[np.ndarray | None] = [None] * len(self.layout)
        for i in self.layers:
            self.k[i], self.v[i] = next(tables), next(tables)
        self.memories: list[Memory] = []

    # ---- queries -------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.buffers())

    def buffers(self) -> list[np.ndarray]:
        return [t for t in self.k + self.v if t is not None]

    @property
    def n_used(self) -> int:
        return sum(m.n_rows for m in self.memories)

    def seq_ids(self) -> list[int]:
        return sorted({sid for m in self.memories for sid in m.holders})

    def of(self, seq_id: int) -> list[Memory]:
        """The sequence's memories, by position."""
        return sorted((m for m in self.memories if seq_id in m.holders), key=lambda m: m.at)

    def rows_of(self, seq_id: int) -> np.ndarray:
        return np.concatenate([np.arange(m.start, m.start + m.n_rows) for m in self.of(seq_id)] or
                              [np.zeros(0, np.int64)]).astype(np.int32)

    # ---- edits ---------------------------------------------------------------

    def store(self, seq_id: int, at: int, k: Sequence[np.ndarray], v: Sequence[np.ndarray]) -> Memory:
        """Keep the memory whose float32 rows k[j], v[j] ([n, dim]) belong to the j-th
        cross-attention layer, attached to the sequence at position `at`."""
        if len(k) != len(self.layers) or len(v) != len(self.layers):
            raise InvalidOptionError(f"an encoder memory needs K and V rows for {len(self.layers)} layers")
        n = int(np.shape(k[0])[0]) if len(k) else 0
        for j, layer in enumerate(self.layers):
            spec = self.layout[layer]
            if np.shape(k[j]) != (n, spec.k_dim) or np.shape(v[j]) != (n, spec.v_dim):
                raise InvalidOptionError(f"layer {layer}: memory rows must be [{n}, {spec.k_dim}] and "
                                         f"[{n}, {spec.v_dim}]")
            if not 0 < n <= spec.n_rows:
                raise InvalidOptionError(f"layer {layer}: a memory has 1..{spec.n_rows} rows, got {n}")
        start = self._first_fit(n)
        for j, layer in enumerate(self.layers):
            self.k[layer][start:start + n] = self.format.encode(k[j])
            self.v[layer][start:start + n] = self.format.encode(v[j])
        memory = Memory(start, n, at, {seq_id})
        self.memories.append(memory)
        return memory

    def clear(self) -> None:
        self.memories.clear()

    def remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        """The sequence lets go of the memories attached in [p0, p1); a memory no sequence
        holds is freed."""
        for m in self.memories:
            if m.at >= p0 and (p1 is None or m.at < p1):
                m.holders.discard(seq_id)
        self.memories = [m for m in self.memories if m.holders]

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """`dst` shares the memories `src` holds attached before position n."""
        for m in self.memories:
            if src in m.holders and m.at < n:
                m.holders.add(dst)

    def fill_mask(self, out: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """out[t, r] = 0 where token t may attend row r (a memory of its sequence attached
        at or before its position), else -inf."""
        out[:len(seq_ids)] = -np.inf
        for m in self.memories:
            rows = np.isin(seq_ids, list(m.holders)) & (positions >= m.at)
            out[np.flatnonzero(rows), m.start:m.start + m.n_rows] = 0.0

    def _first_fit(self, n: int) -> int:
        start = 0
        for m in sorted(self.memories, key=lambda m: m.start):
            if m.start - start >= n:
                return start
            start = m.start + m.n_rows
        if self.n_rows - start < n:
            raise ContextLengthError(f"the encoder memory has no run of {n} free rows (of {self.n_rows})")
        return start


__all__ = ["EncoderMemory", "Memory"]
