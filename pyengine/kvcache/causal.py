"""The causal KV cache: K/V rows in cells, grouped by attention window.

Layers that attend to everything share one group of `n_cells` cells.  Layers
with a sliding window get a group of their own, which can be much smaller:
a sequence only keeps the cells its window (plus a margin for prefix reuse)
can still see, and `slide` frees the rest.  Each group has its own cell
metadata (cells.py) and K/V buffers, so a token lands in a different cell in
each group; the batch graph gets slots, a mask and a KV length per group.

Sliding groups reuse their cells like a ring, except that a wrap is replaced
by a compaction: the order rule of cells.py (cell order = position order
within a sequence) is what makes results independent of the batch, and a
wrapping ring would break it.

A layout may hold layers of other kinds (a hybrid model's recurrent layers,
kvcache/cache.py): they get no group, and None for their K/V.

K/V rows are F16 by default, or Q8_0 blocks with kv_type="q8_0" (rows.py:
storage, conversions, the option and its environment default).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from pyengine import hugepages
from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.kvcache.cells import MAX_SEQUENCES, CellTable, seq_bit
from pyengine.kvcache.rows import DEFAULT_KV_TYPE, FORMATS, KV_TYPES, RowFormat, row_format
from pyengine.ml.nn import CacheSpec, first_visible

# rotate(layers, rows, delta): rows[i] is float32 [n, k_dim] of layers[i]; returns the
# rows re-roped by `delta` positions.
Rotator = Callable[[Sequence[int], Sequence[np.ndarray], int], Sequence[np.ndarray]]


@dataclass(eq=False)
class CacheGroup:
    """Layers that share cell metadata: one window (sliding, or chunks), one cell
    table, K/V per layer."""

    window: int
    chunked: bool
    layers: list[int]
    cells: CellTable
    k: dict[int, np.ndarray] = field(default_factory=dict)
    v: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def n_cells(self) -> int:
        return self.cells.n_cells

    def first_visible(self, pos: int) -> int:
        return first_visible(pos, self.window, self.chunked)

    def move(self, order: np.ndarray) -> None:
        """K/V rows follow a rebuild: new row i is old row order[i]."""
        n = len(order)
        for buffers in (self.k, self.v):
            for rows in buffers.values():
                rows[:n] = rows[order]


class KVCache:
    """Cells for several sequences (up to 64), grouped by attention window."""

    def __init__(self, layout: Sequence[CacheSpec], n_cells: int, *,
                 window_cells: Mapping[int, int] | None = None, kv_type: str | None = "f16",
                 head_dim: int | None = None) -> None:
        """kv_type: "f16" or "q8_0" (None: $PYENGINE_KV_CACHE_TYPE, else f16).  head_dim,
        when given, is checked against the type's block size (attention reads a head's
        slice of a row as whole blocks); a type that came from the environment and does
        not fit falls back to f16 instead."""
        if isinstance(n_cells, bool) or not isinstance(n_cells, int) or n_cells < 1:
            raise InvalidOptionError(f"context size must be a positive integer, got {n_cells!r}")
        self.format: RowFormat = row_format(kv_type)
        if kv_type is None and head_dim is not None and head_dim % self.format.block:
            # an environment default the model cannot use falls back to F16, as Ollama's does
            self.format = FORMATS[DEFAULT_KV_TYPE]
        self.kv_type = self.format.name
        self.layout = list(layout)
        if not self.layout:
            raise InvalidOptionError("the cache layout has no layers")
        if head_dim is not None:
            self.format.check_dim(head_dim, "this model's head_dim")
        self.n_cells = n_cells
        self.groups: list[CacheGroup] = []
        self.layer_group: list[CacheGroup | None] = []   # None: a layer another cache kind holds
        by_window: dict[tuple[int, bool], CacheGroup] = {}
        for i, spec in enumerate(self.layout):
            if not isinstance(spec, CacheSpec):
                self.layer_group.append(None)
                continue
            kind = (spec.window, spec.chunked and spec.window > 0)
            group = by_window.get(kind)
            if group is None:
                size = n_cells if not spec.window else _window_size(spec.window, n_cells, window_cells)
                group = CacheGroup(*kind, [], CellTable(size))
                by_window[kind] = group
                self.groups.append(group)
            group.layers.append(i)
            self.layer_group.append(group)
        if not self.groups:
            raise InvalidOptionError("the cache layout has no attention layers")
        attending = [i for i, group in enumerate(self.layer_group) if group is not None]
        tables = iter(self.format.tables([(self.layer_group[i].n_cells, dim) for i in attending
                                          for dim in (self.layout[i].k_dim, self.layout[i].v_dim)]))
        for i in attending:
            group = self.layer_group[i]
            group.k[i], group.v[i] = next(tables), next(tables)
        # per layer its K and V rows (None for a layer that is not attention)
        self.k = [group.k[i] if group is not None else None for i, group in enumerate(self.layer_group)]
        self.v = [group.v[i] if group is not None else None for i, group in enumerate(self.layer_group)]
        self.prefault = hugepages.Prefault(self.buffers())   # stepped by the engine when idle
        self.epoch = 0   # bumped by clear(), so holders of bookkeeping notice

    # ---- queries -------------------------------------------------------------

    @property
    def type_id(self) -> int:
        """The native type of the K/V rows (for the graph's cache tensors)."""
        return self.format.type_id

    @property
    def nbytes(self) -> int:
        """Bytes of all K/V buffers."""
        return sum(rows.nbytes for rows in self.buffers())

    def buffers(self) -> list[np.ndarray]:
        """Every K and V table."""
        return [rows for rows in self.k + self.v if rows is not None]

    @property
    def windows(self) -> list[int]:
        return [g.window for g in self.groups]

    @property
    def n_used(self) -> int:
        """Used cells summed over the groups (0 means the cache is empty)."""
        return sum(g.cells.n_used for g in self.groups)

    @property
    def n_kv(self) -> int:
        return self.groups[0].cells.n_kv

    def seq_positions(self, seq_id: int) -> np.ndarray:
        """Positions the sequence holds in the first (widest) group."""
        return self.groups[0].cells.positions_of(seq_id)

    def seq_ids(self) -> list[int]:
        present: set[int] = set()
        for g in self.groups:
            present.update(g.cells.seq_ids())
        return sorted(present)

    def usable_prefix(self, seq_id: int, n: int) -> int:
        """The largest p <= n such that a sequence continuing at position p finds every
        cell it needs of `seq_id`'s positions [0, p) in every group (0 if none)."""
        p = n
        for g in self.groups:
            pos = g.cells.positions_of(seq_id)
            if pos.size == 0 or pos[0] > 0 and not g.window:
                return 0
            if np.any(np.diff(pos) != 1):
                return 0   # holes: only after edits the engine never makes; do not trust them
            p = min(p, int(pos[-1]) + 1)
        for g in self.groups:
            if g.window and p > 0 and g.first_visible(p) < int(g.cells.positions_of(seq_id)[0]):
                return 0
        return max(p, 0)

    # ---- edits ---------------------------------------------------------------

    def clear(self) -> None:
        for g in self.groups:
            g.cells.clear()
        self.epoch += 1

    def allocate(self, positions: np.ndarray, seq_ids: np.ndarray) -> list[np.ndarray]:
        """Claim a cell per token in every group; the slots per group."""
        positions = np.asarray(positions, np.int32)
        seq_ids = np.asarray(seq_ids, np.int64)
        decode = _decode_step(positions, seq_ids)
        plans = []
        for g in self.groups:
            if len(positions) > g.cells.n_free:
                raise ContextLengthError(
                    f"the KV cache is full: {len(positions)} new tokens need cells but only "
                    f"{g.cells.n_free} of {g.n_cells} are free (raise num_ctx)")
            slots = g.cells.plan_decode(*decode) if decode else None
            if slots is None:
                slots = g.cells.plan(positions, seq_ids)
            if slots is None:
                self._compact(g)
                slots = g.cells.plan(positions, seq_ids)
                if slots is None:    # cannot happen after a compaction: all free cells are on top
                    raise ContextLengthError("the KV cache has no room left for this batch")
            plans.append(slots)
        for g, slots in zip(self.groups, plans):
            if isinstance(slots, list):   # plan_decode's cells, recorded on Python ints too
                g.cells.record_decode(slots, *decode)
            else:
                g.cells.record(slots, positions, seq_ids)
        return [np.asarray(slots, np.int32) for slots in plans]

    def remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        """Drop positions [p0, p1) of a sequence; cells no sequence uses become free."""
        for g in self.groups:
            g.cells.remove(seq_id, p0, p1)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Let `dst` (empty) attend `src`'s cells of positions [0, n) in every group."""
        for g in self.groups:
            g.cells.copy(src, dst, 0, n)

    def slide(self, seq_id: int, next_pos: int, margin: int = 0) -> None:
        """Free the sliding-window (or past chunks') cells of a sequence that a token at
        `next_pos` or later can no longer see, except the last `margin` of them."""
        for g in self.groups:
            end = g.first_visible(next_pos) - margin
            if g.window and end > 0:   # (no position below 0: nothing to free before that)
                g.cells.remove(seq_id, 0, end)

    def shift(self, seq_id: int, n_keep: int, n_discard: int, rotate: Rotator) -> None:
        """Context shift: drop positions [n_keep, n_keep + n_discard) of the sequence,
        move the later ones down by n_discard and re-rotate their keys."""
        if n_keep < 0 or n_discard <= 0:
            raise InvalidOptionError(f"bad context shift: keep {n_keep}, discard {n_discard}")
        first_moved = n_keep + n_discard
        for g in self.groups:
            g.cells.remove(seq_id, n_keep, first_moved)
            shared = g.cells.shared_cells(seq_id, first_moved)
            if shared.size:
                if shared.size > g.cells.n_free:
                    raise ContextLengthError("the KV cache has no room to shift a shared sequence")
                order, bits = g.cells.unshare_order(seq_id, shared)
                g.move(order)
                g.cells.rebuild(order, bits)
            cells = np.flatnonzero(((g.cells.seq & seq_bit(seq_id)) != 0) & (g.cells.pos >= first_moved))
            if cells.size:
                self._rotate_keys(g, cells, -n_discard, rotate)
            g.cells.shift(seq_id, first_moved, -n_discard)

    def compact(self) -> None:
        """Move every group's used cells to the bottom (order kept)."""
        for g in self.groups:
            self._compact(g)

    # ---- internals -----------------------------------------------------------

    @staticmethod
    def _compact(g: CacheGroup) -> None:
        order = g.cells.compaction()
        bits = g.cells.seq[order].copy()
        g.move(order)
        g.cells.rebuild(order, bits)

    def _rotate_keys(self, g: CacheGroup, cells: np.ndarray, delta: int, rotate: Rotator) -> None:
        """Decode the keys to float32, re-rope them, store them back in the cache's type
        (for Q8_0 a second rounding, as llama.cpp's shift of a quantized cache has)."""
        fmt = self.format
        rows = [fmt.decode(g.k[layer][cells], self.layout[layer].k_dim) for layer in g.layers]
        rotated = rotate(g.layers, rows, delta)
        for layer, new in zip(g.layers, rotated):
            g.k[layer][cells] = fmt.encode(np.asarray(new, np.float32))


def _decode_step(positions: np.ndarray, seq_ids: np.ndarray) -> tuple[list[int], list[int]] | None:
    """(sequence ids, positions) as Python ints when the batch is a decode step's: a
    few tokens, each of its own valid sequence; else None."""
    if not 0 < len(seq_ids) <= 16:
        return None
    ids = seq_ids.tolist()
    if len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= MAX_SEQUENCES:
        return None
    return ids, positions.tolist()


def _window_size(window: int, n_cells: int, window_cells: Mapping[int, int] | None) -> int:
    size = (window_cells or {}).get(window, n_cells)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InvalidOptionError(f"cells for window {window} must be a positive integer, got {size!r}")
    return min(size, n_cells)


__all__ = ["KVCache", "CacheGroup", "KV_TYPES", "MAX_SEQUENCES", "Rotator"]
