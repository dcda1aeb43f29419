"""Cell metadata of one cache group: which position of which sequences each cell holds.

A cell holds one token's keys and values (for every layer of its group), its
position, and the set of sequences that may attend to it, as a bit mask (up to
64 sequences).  A cell is free when no sequence uses it.  Sharing a cell
between sequences (a common prompt prefix) is just setting more bits.

Order rule: within every sequence, cell index grows with position.  The
native attention walks cells in index order with an online softmax, so the
order of a sequence's cells decides its rounding; keeping it equal to
position order makes a sequence's results independent of whatever else
lives in the cache (batch invariance).  Allocation therefore only takes free
cells above a sequence's last cell, and when there are none left above it
the table is compacted (used cells moved down, order kept) by the owner, who
also moves the K/V rows.
"""

from __future__ import annotations

import numpy as np

from pyengine import _core
from pyengine.errors import InvalidOptionError

MAX_SEQUENCES = 64
_ONE = np.uint64(1)


def seq_bit(seq_id: int) -> np.uint64:
    """The bit of sequence `seq_id` (0..63) in a cell's sequence set."""
    if isinstance(seq_id, bool) or not isinstance(seq_id, (int, np.integer)) \
            or not 0 <= int(seq_id) < MAX_SEQUENCES:
        raise InvalidOptionError(f"sequence ids must be integers in 0..{MAX_SEQUENCES - 1}, got {seq_id!r}")
    return _ONE << np.uint64(int(seq_id))


def seq_bits(seq_ids: np.ndarray) -> np.ndarray:
    """Bits of an array of sequence ids (validated)."""
    ids = np.asarray(seq_ids)
    if ids.size:
        # a decode step's few ids as Python ints: cheaper than numpy's reductions
        extremes = ids.ravel().tolist() if ids.size <= 16 else [ids.min(), ids.max()]
        if ids.dtype.kind not in "iu" or min(extremes) < 0 or max(extremes) >= MAX_SEQUENCES:
            raise InvalidOptionError(f"sequence ids must be integers in 0..{MAX_SEQUENCES - 1}")
    return np.left_shift(_ONE, ids.astype(np.uint64))


class CellTable:
    """Positions and sequence sets of `n_cells` cells."""

    def __init__(self, n_cells: int) -> None:
        self.n_cells = n_cells
        self.pos = np.full(n_cells, -1, np.int32)
        self.seq = np.zeros(n_cells, np.uint64)
        # every used cell lies below `top` (an upper bound, so scans of a
        # decode step cost the used part of the cache, not all of it)
        self.top = 0
        # sequence -> its highest cell (-1: none), a cache: an edit drops what it may change
        self._last: dict[int, int] = {}

    # ---- queries -------------------------------------------------------------

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.seq[: self.top]))

    @property
    def n_free(self) -> int:
        return self.n_cells - self.n_used

    @property
    def n_kv(self) -> int:
        """Cells an attention pass must look at: up to the last used one (most often the
        one just below `top`: no scan)."""
        if self.top and self.seq[self.top - 1]:
            return self.top
        used = np.flatnonzero(self.seq[: self.top])
        return int(used[-1]) + 1 if used.size else 0

    def cells_of(self, seq_id: int) -> np.ndarray:
        """Indices of the sequence's cells (ascending, hence in position order)."""
        return np.flatnonzero(self.seq[: self.top] & seq_bit(seq_id))

    def last_cell(self, seq_id: int) -> int:
        """The sequence's highest cell, -1 when it has none."""
        last = self._last.get(seq_id)
        if last is None:
            mine = self.cells_of(seq_id)
            last = self._last[seq_id] = int(mine[-1]) if mine.size else -1
        return last

    def positions_of(self, seq_id: int) -> np.ndarray:
        return self.pos[self.cells_of(seq_id)]

    def seq_ids(self) -> list[int]:
        """Sequences that hold at least one cell."""
        present = np.bitwise_or.reduce(self.seq) if self.n_cells else np.uint64(0)
        return [s for s in range(MAX_SEQUENCES) if int(present) >> s & 1]

    # ---- edits ---------------------------------------------------------------

    def clear(self) -> None:
        self.pos.fill(-1)
        self.seq.fill(0)
        self.top = 0
        self._last.clear()

    def plan(self, positions: np.ndarray, seq_ids: np.ndarray) -> np.ndarray | None:
        """Free cells for a batch, each sequence's above its last cell; None when
        the order rule needs a compaction first.  Nothing is recorded."""
        slots = np.empty(len(positions), np.int32)
        taken: list[int] = []   # cells given to earlier sequences of the batch, until `free` is made
        free = None             # the free map, made the first time a lone next cell will not do
        for sid, rows in rows_by_sequence(seq_ids).items():
            self._check_order(sid, positions[rows])
            start = self.last_cell(sid) + 1
            if free is None and len(rows) == 1:
                cell = self._free_cell_near(start, taken)
                if cell >= 0:
                    slots[rows[0]] = cell   # a decode step: a free cell just above
                    taken.append(cell)
                    continue
            if free is None:
                free = self.seq == 0
                free[taken] = False
            avail = np.flatnonzero(free[start:])[: len(rows)] + start
            if avail.size < len(rows):
                return None
            slots[rows] = avail
            free[avail] = False
        return slots

    def plan_decode(self, ids: list[int], positions: list[int]) -> list[int] | None:
        """plan() for a decode step (one token of each of distinct valid sequences, as
        Python ints), when every token finds a free cell just above its sequence's last:
        the cells plan() gives then, with its checks made on Python ints (after a forward
        pass numpy's calls on a cold interpreter cost ~50-100 us a step); None (nothing
        done) for anything else, which plan() then decides."""
        cells: list[int] = []
        for sid, position in zip(ids, positions):
            last = self.last_cell(sid)
            if last >= 0 and position <= self.pos[last]:
                return None   # plan() says why
            cell = self._free_cell_near(last + 1, cells)
            if cell < 0:
                return None
            cells.append(cell)
        return cells

    def record_decode(self, cells: list[int], ids: list[int], positions: list[int]) -> None:
        """record() of plan_decode()'s cells."""
        for cell, sid, position in zip(cells, ids, positions):
            self.pos[cell] = position
            self.seq[cell] = seq_bit(sid)
            self._last[sid] = cell   # above the sequence's last: plan_decode took it so
        self.top = max(self.top, max(cells) + 1)

    def _free_cell_near(self, start: int, taken: list[int]) -> int:
        """The lowest free cell in [start, start + 8) not yet given, or -1.  Sequences
        decoding side by side take turns at the top of the cache, so the cell right
        above a sequence's last is often another's: a few probes find the one the free
        map would, without building it."""
        for cell in range(start, min(start + 8, self.n_cells)):
            if self.seq[cell] == 0 and cell not in taken:
                return cell
        return -1

    def _check_order(self, sid: int, positions: np.ndarray) -> None:
        """A sequence's positions in a batch increase and follow its cached ones."""
        if positions.size > 1 and np.any(np.diff(positions) <= 0):
            raise InvalidOptionError(f"sequence {sid}: positions in a batch must increase")
        last = self.last_cell(sid)
        if last >= 0 and positions[0] <= self.pos[last]:
            raise InvalidOptionError(
                f"sequence {sid}: position {positions[0]} is not after its cached "
                f"position {self.pos[last]} (remove the tail first)")

    def record(self, slots: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        self.pos[slots] = positions
        self.seq[slots] = seq_bits(seq_ids)
        if len(slots):
            self.top = max(self.top, int(slots.max()) + 1)
        for sid, rows in rows_by_sequence(seq_ids).items():
            if sid in self._last:
                self._last[sid] = max(self._last[sid], int(slots[rows].max()))

    def compaction(self) -> np.ndarray:
        """Old indices of the used cells in their new order (compaction keeps order)."""
        return np.flatnonzero(self.seq)

    def rebuild(self, order: np.ndarray, bits: np.ndarray) -> None:
        """New layout: cell i takes old cell order[i]'s position with sequence set bits[i]."""
        n = len(order)
        pos = self.pos[order]
        self.clear()
        self.pos[:n] = pos
        self.seq[:n] = bits
        self.top = n

    def remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> int:
        """Drop the sequence from its cells at positions [p0, p1); returns cells freed."""
        bit = seq_bit(seq_id)
        sel = (self.seq & bit) != 0
        sel &= self.pos >= p0
        if p1 is not None:
            sel &= self.pos < p1
        before = self.n_used
        self.seq[sel] &= ~bit
        self.pos[self.seq == 0] = -1
        last = self._last.get(int(seq_id))
        if last is not None and last >= 0 and not self.seq[last] & bit:   # (a window's low end keeps it)
            del self._last[int(seq_id)]
        return before - self.n_used

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Let `dst` (which must hold no cell) attend the cells of `src` at positions [p0, p1)."""
        if self.cells_of(dst).size:
            raise InvalidOptionError(f"sequence {dst} must be empty before a prefix is copied into it")
        sel = (self.seq & seq_bit(src)) != 0
        sel &= (self.pos >= p0) & (self.pos < p1)
        self.seq[sel] |= seq_bit(dst)
        self._last.pop(int(dst), None)

    def shared_cells(self, seq_id: int, p0: int) -> np.ndarray:
        """The sequence's cells at positions >= p0 that other sequences also use."""
        bit = seq_bit(seq_id)
        mine = (self.seq & bit) != 0
        return np.flatnonzero(mine & (self.pos >= p0) & ((self.seq & ~bit) != 0))

    def unshare_order(self, seq_id: int, cells: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A rebuild that splits each given cell in two adjacent cells: one for the other
        sequences, one (a copy) for `seq_id` alone.  Order is kept for everyone."""
        bit = seq_bit(seq_id)
        used = np.flatnonzero(self.seq)
        split = np.isin(used, cells)
        reps = np.where(split, 2, 1)
        order = np.repeat(used, reps)
        bits = np.repeat(self.seq[used], reps)
        first = np.cumsum(reps) - reps                 # where each used cell lands
        bits[first[split]] &= ~bit                     # the others keep the first copy
        bits[first[split] + 1] = bit                   # the sequence gets the second
        return order, bits

    def shift(self, seq_id: int, p0: int, delta: int) -> np.ndarray:
        """Add delta to the sequence's positions >= p0; its cells there must be its own.
        Returns the cells moved."""
        bit = seq_bit(seq_id)
        cells = np.flatnonzero(((self.seq & bit) != 0) & (self.pos >= p0))
        if np.any(self.seq[cells] != bit):
            raise InvalidOptionError("cannot shift positions of cells other sequences share")
        self.pos[cells] += delta
        return cells

    # ---- masks ---------------------------------------------------------------

    def fill_mask(self, out: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray,
                  n_kv: int, window: int = 0, causal: bool = True, alibi: bool = False, chunk: int = 0) -> None:
        """out[t, c] = 0 where token t may attend cell c, else -inf (first n_kv cells):
        the cell holds the token's sequence at a position not after the token's (and,
        with a window, less than `window` positions before it; with a chunk, in the
        token's own chunk of `chunk` positions: p - p % chunk or later).  One native
        loop over the (token, cell) pairs (pe_kv_mask).

        causal=False (an encoder): every cell of the token's sequence, before or after
        it; a window is then symmetric, |distance| <= window // 2 (llama.cpp's
        LLAMA_SWA_TYPE_SYMMETRIC).  alibi: a visible cell holds -|distance| instead of 0,
        which the attention scales by each head's slope."""
        if not causal or alibi:
            self._fill_mask_numpy(out, np.asarray(positions, np.int64), seq_bits(seq_ids), n_kv, window,
                                  causal, alibi, chunk)
            return
        _core.kv_mask(out, np.ascontiguousarray(positions, np.int32), seq_bits(seq_ids), self.pos, self.seq,
                      n_kv, window, chunk)

    def _fill_mask_numpy(self, out: np.ndarray, positions: np.ndarray, bits: np.ndarray, n_kv: int,
                         window: int, causal: bool, alibi: bool, chunk: int = 0) -> None:
        """An encoder's batch is computed once, not per decode step: numpy serves."""
        visible = (self.seq[None, :n_kv] & bits[:, None]) != 0                    # [T, n_kv]
        ahead = positions[:, None] - self.pos[None, :n_kv].astype(np.int64)       # token's position - cell's
        distance = np.abs(ahead)
        if causal:
            visible &= ahead >= 0
            if window > 0:
                visible &= ahead < window
            if chunk > 0:
                visible &= self.pos[None, :n_kv] >= (positions - positions % chunk)[:, None]
        elif window > 0:
            visible &= distance <= window // 2
        seen = -distance.astype(np.float32) if alibi else np.float32(0)
        out[:len(positions), :n_kv] = np.where(visible, seen, np.float32(-np.inf))


def rows_by_sequence(seq_ids: np.ndarray) -> dict[int, list[int]]:
    """Each sequence's rows of a batch, sequences in order of first appearance."""
    rows: dict[int, list[int]] = {}
    for row, sid in enumerate(np.asarray(seq_ids).tolist()):
        rows.setdefault(sid, []).append(row)
    return rows
