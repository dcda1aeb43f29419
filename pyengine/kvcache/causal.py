"""The causal KV cache: per-layer K/V rows in cells, with cell metadata.

Each cell holds one token's keys and values for every layer, plus its
position and the set of sequences (a bit mask) that may attend to it.  The
attention mask of a batch is derived from that metadata, so several
sequences can share one cache and a sequence can be cut or dropped by
clearing its bits.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.ml.nn import CacheSpec

MAX_SEQUENCES = 64
_NEG_INF = np.float32(-np.inf)


class KVCache:
    def __init__(self, layout: Sequence[CacheSpec], n_cells: int) -> None:
        if not isinstance(n_cells, int) or n_cells < 1:
            raise InvalidOptionError(f"context size must be a positive integer, got {n_cells!r}")
        self.layout = list(layout)
        self.n_cells = n_cells
        # F16 rows, stored as uint16 so numpy never converts them by accident
        self.k = [np.zeros((n_cells, s.k_dim), np.uint16) for s in self.layout]
        self.v = [np.zeros((n_cells, s.v_dim), np.uint16) for s in self.layout]
        self.pos = np.full(n_cells, -1, np.int32)
        self.seq = np.zeros(n_cells, np.uint64)
        self.windows = sorted({s.window for s in self.layout})

    # ---- metadata ----------------------------------------------------------

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.seq))

    @property
    def n_kv(self) -> int:
        """Cells an attention pass must look at: up to the last used one."""
        used = np.flatnonzero(self.seq)
        return int(used[-1]) + 1 if used.size else 0

    def clear(self) -> None:
        self.pos.fill(-1)
        self.seq.fill(0)

    def allocate(self, positions: np.ndarray, seq_ids: np.ndarray) -> np.ndarray:
        """Claim one free cell per token (lowest first) and record its metadata."""
        free = np.flatnonzero(self.seq == 0)
        n = len(positions)
        if n > free.size:
            raise ContextLengthError(
                f"the KV cache is full: {n} new tokens need cells but only {free.size} of "
                f"{self.n_cells} are free (raise num_ctx)")
        slots = free[:n].astype(np.int32)
        self.pos[slots] = positions
        self.seq[slots] = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        return slots

    def remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        """Drop positions [p0, p1) of a sequence; cells no sequence uses become free."""
        bit = np.uint64(1) << np.uint64(seq_id)
        sel = (self.seq & bit) != 0
        sel &= self.pos >= p0
        if p1 is not None:
            sel &= self.pos < p1
        self.seq[sel] &= ~bit
        self.pos[self.seq == 0] = -1

    def seq_positions(self, seq_id: int) -> np.ndarray:
        bit = np.uint64(1) << np.uint64(seq_id)
        return np.sort(self.pos[(self.seq & bit) != 0])

    # ---- masks -------------------------------------------------------------

    def fill_mask(self, out: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray,
                  n_kv: int, window: int = 0) -> None:
        """out[t, c] = 0 where token t may attend cell c, else -inf (first n_kv cells)."""
        pos = self.pos[:n_kv]
        bits = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        visible = (self.seq[:n_kv][None, :] & bits[:, None]) != 0
        visible &= pos[None, :] <= positions[:, None]
        if window:
            visible &= (positions[:, None] - pos[None, :]) < window
        t = len(positions)
        np.copyto(out[:t, :n_kv], np.where(visible, np.float32(0), _NEG_INF))
