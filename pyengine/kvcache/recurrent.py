"""Recurrent state: what a recurrent layer (Mamba-2, gated delta rule, short conv)
keeps per sequence instead of K/V rows.

The state has a fixed size whatever the context: per layer a row of the
convolution window (conv_dim float32 values) and a row of the SSM / delta-rule
state (state_dim values).  Rows live in a pool of `n_rows` shared by the
layers: row r of every layer's tables belongs to the same (sequence, position).

A batch reads each sequence's state from one row and writes the new state to
another (the graph ops read their input state whole before writing, and two
rows keep that true whatever the ops' order).  So every step moves a sequence
to a fresh row; the row it left is freed, unless it was marked a checkpoint.

Checkpoints: a state cannot be cut back like K/V cells, so prefix reuse and
rollback resume from a state recorded at a position at or before the shared
prefix.  The engine marks the current state a checkpoint at the end of every
prompt chunk and of every turn; a sequence keeps at most `max_checkpoints`
(its oldest dropped first).

Row 0 is the empty state (all zeros, never written): a sequence without a
state starts from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pyengine.errors import ContextLengthError, InvalidOptionError
from pyengine.kvcache.cells import rows_by_sequence
from pyengine.ml.nn import RecurrentSpec

DEFAULT_CHECKPOINTS = 4
EMPTY_ROW = 0


@dataclass(eq=False)
class _State:
    """One row holding a sequence's state after its positions [0, pos)."""

    pos: int
    row: int
    kept: bool = False   # a checkpoint: kept when the sequence moves past it


@dataclass(frozen=True)
class StepRows:
    """What a batch's recurrent layers need: for each sequence of the batch (in order
    of first appearance) the row it reads its state from, the row its new state goes
    to and the batch row of its last token; for each token its sequence's index."""

    read: np.ndarray        # int32 [n_seqs]
    write: np.ndarray       # int32 [n_seqs]
    seq_last: np.ndarray    # int32 [n_seqs]
    token_seq: np.ndarray   # int32 [n_tokens]
    # int32 [n_seqs, 5]: per sequence {first token, token count, row read, row written,
    # position of the first token}, the `seqs` table the recurrent ops read (pe.h PE_SEQ_*)
    table: np.ndarray


class RecurrentState:
    """States of the recurrent layers of a layout, for up to 64 sequences."""

    def __init__(self, layout: Sequence[object], n_rows: int, max_checkpoints: int = DEFAULT_CHECKPOINTS) -> None:
        if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows < 2:
            raise InvalidOptionError(f"a recurrent state pool needs at least 2 rows, got {n_rows!r}")
        if isinstance(max_checkpoints, bool) or not isinstance(max_checkpoints, int) or max_checkpoints < 1:
            raise InvalidOptionError(f"checkpoints per sequence must be a positive integer, got {max_checkpoints!r}")
        self.layout = list(layout)
        self.layers = [i for i, spec in enumerate(self.layout) if isinstance(spec, RecurrentSpec)]
        if not self.layers:
            raise InvalidOptionError("the cache layout has no recurrent layers")
        self.n_rows = n_rows
        self.max_checkpoints = max_checkpoints
        # per layer its conv and state tables [n_rows, dim] (None: not recurrent, or no such part)
        self.conv: list[np.ndarray | None] = [self._table(spec, "conv_dim") for spec in self.layout]
        self.state: list[np.ndarray | None] = [self._table(spec, "state_dim") for spec in self.layout]
        self._states: dict[int, list[_State]] = {}   # per sequence, position order; the last is current
        self._free = list(range(n_rows - 1, EMPTY_ROW, -1))   # popped from the end: low rows first

    def _table(self, spec: object, part: str) -> np.ndarray | None:
        dim = getattr(spec, part, 0) if isinstance(spec, RecurrentSpec) else 0
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise InvalidOptionError(f"a recurrent layer's {part} must be an integer >= 0, got {dim!r}")
        return np.zeros((self.n_rows, dim), np.float32) if dim else None

    # ---- queries -------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.buffers())

    def buffers(self) -> list[np.ndarray]:
        return [t for t in self.conv + self.state if t is not None]

    @property
    def row_bytes(self) -> int:
        """Bytes of one state (one row of every table)."""
        return sum(t.shape[1] * t.itemsize for t in self.buffers())

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_used(self) -> int:
        return sum(len(states) for states in self._states.values())

    def seq_ids(self) -> list[int]:
        return sorted(self._states)

    def position(self, seq_id: int) -> int:
        """The position the sequence's current state has reached (0: none yet)."""
        states = self._states.get(seq_id)
        return states[-1].pos if states else 0

    def checkpoints(self, seq_id: int) -> list[int]:
        """Positions of the sequence's kept states, oldest first."""
        return [s.pos for s in self._states.get(seq_id, ()) if s.kept]

    def row_of(self, seq_id: int) -> int:
        """The row of the sequence's current state (the empty row when it has none)."""
        states = self._states.get(seq_id)
        return states[-1].row if states else EMPTY_ROW

    def usable_prefix(self, seq_id: int, n: int) -> int:
        """The largest p <= n at which the sequence holds a state (0 if none)."""
        return max((s.pos for s in self._states.get(seq_id, ()) if s.pos <= n), default=0)

    # ---- edits ---------------------------------------------------------------

    def clear(self) -> None:
        self._states.clear()
        self._free = list(range(self.n_rows - 1, EMPTY_ROW, -1))

    def allocate(self, positions: np.ndarray, seq_ids: np.ndarray) -> StepRows:
        """Give each sequence of the batch its read and write rows, and move it to the
        write row (its state after the batch).  A sequence's tokens must be one run of
        the batch, at the positions that follow its state."""
        by_seq = rows_by_sequence(seq_ids)
        if len(by_seq) > len(self._free):
            raise ContextLengthError(f"the recurrent state has {len(self._free)} free rows but the batch "
                                     f"has {len(by_seq)} sequences")
        plans = []
        pos = positions.tolist() if len(positions) <= 16 else None
        for sid, rows in by_seq.items():
            first, last = rows[0], rows[-1]
            if last - first + 1 != len(rows):
                raise InvalidOptionError(f"sequence {sid}: a recurrent model needs each sequence's tokens "
                                         "side by side in the batch")
            p0 = pos[first] if pos is not None else int(positions[first])
            states = self._states.get(sid)
            current = states[-1] if states else None
            at = current.pos if current else 0
            if p0 != at:
                raise InvalidOptionError(f"sequence {sid}: its recurrent state is at position {at}, the batch "
                                         f"continues at {p0} (remove back to a checkpoint first)")
            if len(rows) > 1 and np.any(np.diff(positions[first:last + 1]) != 1):
                raise InvalidOptionError(f"sequence {sid}: a recurrent state takes every position in order")
            plans.append((sid, current, p0 + len(rows), last))
        write = [self._free.pop() for _ in plans]   # before any row is freed: none is read and written
        for (sid, current, end, _), row in zip(plans, write):
            states = self._states.setdefault(sid, [])
            if current is not None and not current.kept:
                states.pop()
                self._free.append(current.row)
            states.append(_State(end, row))
        token_seq = np.empty(len(seq_ids), np.int32)
        for k, rows in enumerate(by_seq.values()):
            token_seq[rows[0]:rows[-1] + 1] = k
        read = [EMPTY_ROW if c is None else c.row for _, c, _, _ in plans]
        table = np.array([(rows[0], len(rows), r, w, end - len(rows))
                          for rows, r, w, (_, _, end, _) in zip(by_seq.values(), read, write, plans)], np.int32)
        return StepRows(np.array(read, np.int32), np.array(write, np.int32), np.array([p[3] for p in plans], np.int32),
                        token_seq, table.reshape(len(plans), 5))

    def checkpoint(self, seq_id: int) -> None:
        """Keep the sequence's current state when it moves on; the oldest checkpoint
        goes when it has more than max_checkpoints."""
        states = self._states.get(seq_id)
        if not states:
            return
        states[-1].kept = True
        kept = [s for s in states if s.kept]
        if len(kept) > self.max_checkpoints:
            self._drop(seq_id, kept[0])

    def remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        """Forget the sequence's states that hold a position >= p0 (all of them for p0 = 0):
        a state cannot lose a token in its middle, so p1 changes nothing."""
        states = self._states.get(seq_id)
        if not states:
            return
        for state in [s for s in states if s.pos > p0]:
            self._drop(seq_id, state)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Give `dst` (which holds no state) a copy of `src`'s state at position n."""
        if self._states.get(dst):
            raise InvalidOptionError(f"sequence {dst} must be empty before a prefix is copied into it")
        if n == 0:
            return
        source = next((s for s in self._states.get(src, ()) if s.pos == n), None)
        if source is None:
            raise InvalidOptionError(f"sequence {src} holds no recurrent state at position {n}")
        if not self._free:
            raise ContextLengthError("the recurrent state has no free row to copy a prefix into")
        row = self._free.pop()
        for table in self.buffers():
            table[row] = table[source.row]
        self._states[dst] = [_State(n, row, kept=True)]

    def drop_checkpoint(self) -> bool:
        """Free the oldest checkpoint (not a current state) of the sequence with the most
        states; whether there was one."""
        for sid in sorted(self._states, key=lambda s: -len(self._states[s])):
            states = self._states[sid]
            if len(states) > 1:
                self._drop(sid, states[0])
                return True
        return False

    def _drop(self, seq_id: int, state: _State) -> None:
        states = self._states[seq_id]
        states.remove(state)
        self._free.append(state.row)
        if not states:
            del self._states[seq_id]


__all__ = ["RecurrentState", "StepRows", "DEFAULT_CHECKPOINTS", "EMPTY_ROW"]
