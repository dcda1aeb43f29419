"""Sequence slots: the 64 sequence ids of the cache, and what each one holds.

A slot is live while a request runs in it; when the request ends its cells
stay (an idle slot) so a later prompt that starts the same way can reuse
them, until cells run short and the least recently used idle slot is
evicted.  A new request takes the slot (idle or live) whose cached tokens
share the longest usable prefix with its prompt: an idle slot is taken
over, a live one's prefix cells are shared into a fresh slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pyengine.kvcache import MAX_SEQUENCES, Cache


@dataclass(eq=False)
class Slot:
    """One sequence id of the cache: the live sequence running in it, or (idle) the
    tokens its last sequence left in its cells."""

    id: int
    tokens: list[int] = field(default_factory=list)   # left in the cells when idle, position order
    valid: int = 0          # leading tokens whose K/V equal a fresh computation (as Sequence.valid)
    seq: object = None      # the live sequence (with .cached() -> tokens, valid), or None when idle
    last_used: int = 0

    @property
    def live(self) -> bool:
        return self.seq is not None

    def cached(self) -> tuple[list[int], int]:
        """The tokens in the slot's cells and how many leading ones a prompt may reuse."""
        return self.seq.cached() if self.seq is not None else (self.tokens, self.valid)


class SlotTable:
    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self.slots = [Slot(i) for i in range(MAX_SEQUENCES)]
        self._clock = 0
        self._epoch = cache.epoch

    def touch(self, slot: Slot) -> None:
        self._clock += 1
        slot.last_used = self._clock

    def check_epoch(self) -> None:
        """The cache was cleared behind the engine's back (a benchmark): forget idle contents."""
        if self.cache.epoch != self._epoch:
            self._epoch = self.cache.epoch
            for slot in self.slots:
                if not slot.live:
                    slot.tokens, slot.valid = [], 0

    def idle_with_cells(self) -> list[Slot]:
        return sorted((s for s in self.slots if not s.live and s.tokens), key=lambda s: s.last_used)

    def evict(self, slot: Slot) -> None:
        self.cache.remove(slot.id)
        slot.tokens, slot.valid = [], 0

    def evict_lru(self, among: set[int] | None = None) -> bool:
        """Evict the least recently used idle slot (one of the ids `among`, when given);
        whether there was one.  The cache's `reserve` calls it until it has room."""
        idle = self.idle_with_cells()
        if among is not None:
            idle = [s for s in idle if s.id in among]
        if not idle:
            return False
        self.evict(idle[0])
        return True

    def best_prefix(self, prompt: list[int], leave: int = 1) -> tuple[Slot | None, int]:
        """The slot sharing the longest reusable prefix with the prompt (leaving at
        least its last `leave` tokens to compute), idle slots first on ties."""
        limit = len(prompt) - leave
        best, best_n = None, 0
        head = np.asarray(prompt[:limit], np.int64)
        for slot in sorted(self.slots, key=lambda s: (s.live, -s.last_used)):
            tokens, valid = slot.cached()
            n_max = min(valid, limit)
            if n_max <= best_n:
                continue
            cached = np.asarray(tokens[:n_max], np.int64)
            differ = np.flatnonzero(cached != head[:n_max])
            common = int(differ[0]) if differ.size else n_max
            if common <= best_n:
                continue
            usable = self.cache.usable_prefix(slot.id, common)
            if usable > best_n:
                best, best_n = slot, usable
        return best, best_n

    def free_slot(self) -> Slot:
        """A slot that is not live: an empty one, else the least recently used idle one (evicted)."""
        empty = [s for s in self.slots if not s.live and not s.tokens]
        if empty:
            return empty[0]
        slot = self.idle_with_cells()[0]
        self.evict(slot)
        return slot

    def live_cells(self) -> int:
        """Cells (summed over groups) that at least one live sequence uses."""
        mask = np.uint64(0)
        for s in self.slots:
            if s.live:
                mask |= np.uint64(1) << np.uint64(s.id)
        return sum(int(np.count_nonzero(g.cells.seq & mask)) for g in self.cache.groups)
