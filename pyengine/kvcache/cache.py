"""The cache the runner talks to: one object over the kinds a model's layers keep.

A model declares per layer what it keeps (`cache_layout()`): a CacheSpec
(attention K/V: causal, or sliding with a window), a RecurrentSpec (a state of
fixed size per sequence) or an EncoderSpec (cross-attention rows computed once).
`Cache` gives each kind the layers that are its own (a hybrid model mixes
attention and recurrent layers; each layer is indexed by its place in the
model, whatever the kind) and answers the runner for all of them, as Ollama's
kvcache wrapper does: a sequence's positions, prefix reuse, edits, and
`reserve`, which makes room for a batch by evicting through the caller (the
runner knows which sequences are idle; the cache knows what is full).

Every kind answers the same questions (`CacheKind`); what one cannot do it
refuses: a recurrent state cannot shift, so `shift` raises ContextShiftError.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from pyengine import hugepages
from pyengine.errors import ContextLengthError, InvalidOptionError, UnsupportedError
from pyengine.kvcache.causal import KVCache, Rotator
from pyengine.kvcache.cells import MAX_SEQUENCES
from pyengine.kvcache.encoder import EncoderMemory
from pyengine.kvcache.recurrent import DEFAULT_CHECKPOINTS, RecurrentState, StepRows
from pyengine.kvcache.rows import FORMATS, row_format
from pyengine.ml.nn import CacheSpec, EncoderSpec, RecurrentSpec

# evict(among): drop one idle sequence's contents, one of `among` when given; whether one was
Evict = Callable[..., bool]


class ContextShiftError(UnsupportedError):
    """A context shift that the model's cache cannot make (a recurrent state holds every
    position it has seen; it cannot drop some of them)."""


class CacheKind(Protocol):
    """What every kind of cache answers, per sequence id (0..63)."""

    n_used: int

    def seq_ids(self) -> list[int]: ...

    def usable_prefix(self, seq_id: int, n: int) -> int: ...

    def remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None: ...

    def copy_prefix(self, src: int, dst: int, n: int) -> None: ...

    def clear(self) -> None: ...

    def buffers(self) -> list[np.ndarray]: ...


class Cache:
    """The kinds of cache a layout needs, composed per layer."""

    def __init__(self, layout: Sequence[object], *, attention: KVCache | None = None,
                 recurrent: RecurrentState | None = None, encoder: EncoderMemory | None = None) -> None:
        """Over kinds built for `layout` (see `build`)."""
        self.layout = list(layout)
        self.attention, self.recurrent, self.encoder = attention, recurrent, encoder
        self.kinds: list[CacheKind] = [k for k in (attention, recurrent, encoder) if k is not None]
        if not self.kinds:
            raise InvalidOptionError("the cache layout has no layers")
        self.format = attention.format if attention is not None else encoder.format if encoder is not None \
            else FORMATS["f16"]
        self.kv_type = self.format.name
        self.n_cells = attention.n_cells if attention is not None else 0
        self.prefault = attention.prefault if len(self.kinds) == 1 and attention is not None \
            else hugepages.Prefault(self.buffers())
        self._cleared = 0

    @property
    def epoch(self) -> int:
        """Changes with every clear() (of this cache or of its K/V cells), so holders of
        bookkeeping notice."""
        return self._cleared + (self.attention.epoch if self.attention is not None else 0)

    @classmethod
    def build(cls, layout: Sequence[object], n_cells: int, *, window_cells: Mapping[int, int] | None = None,
              kv_type: str | None = "f16", head_dim: int | None = None, state_rows: int = 2,
              max_checkpoints: int = DEFAULT_CHECKPOINTS, encoder_rows: int = 0) -> "Cache":
        """The kinds `layout` needs.  n_cells, window_cells, kv_type, head_dim: the attention
        layers' (KVCache); state_rows, max_checkpoints: the recurrent layers' pool
        (RecurrentState); encoder_rows: the cross-attention layers' pool (EncoderMemory;
        0: the largest memory a layer declares)."""
        layout = list(layout)
        for spec in layout:
            if not isinstance(spec, (CacheSpec, RecurrentSpec, EncoderSpec)):
                raise UnsupportedError(f"a layer keeps {spec!r}, which no cache kind holds")
        attention = KVCache(layout, n_cells, window_cells=window_cells, kv_type=kv_type, head_dim=head_dim) \
            if _has(layout, CacheSpec) else None
        recurrent = RecurrentState(layout, state_rows, max_checkpoints) if _has(layout, RecurrentSpec) else None
        encoder = None
        if _has(layout, EncoderSpec):
            fmt = attention.format if attention is not None else row_format(kv_type)
            if attention is None and kv_type is None and head_dim is not None and head_dim % fmt.block:
                fmt = FORMATS["f16"]   # as KVCache falls back from an environment default
            rows = encoder_rows or max(s.n_rows for s in layout if isinstance(s, EncoderSpec))
            encoder = EncoderMemory(layout, rows, fmt)
        return cls(layout, attention=attention, recurrent=recurrent, encoder=encoder)

    @classmethod
    def wrap(cls, cache: "Cache | KVCache") -> "Cache":
        """`cache` itself, or a Cache over a bare KVCache (built by a test or a tool)."""
        return cache if isinstance(cache, Cache) else cls(cache.layout, attention=cache)

    # ---- the attention kind's parts, which the batch graph binds ------------

    @property
    def groups(self):
        return self.attention.groups if self.attention is not None else []

    @property
    def layer_group(self):
        return self.attention.layer_group if self.attention is not None else [None] * len(self.layout)

    @property
    def k(self) -> list[np.ndarray | None]:
        return self.attention.k if self.attention is not None else [None] * len(self.layout)

    @property
    def v(self) -> list[np.ndarray | None]:
        return self.attention.v if self.attention is not None else [None] * len(self.layout)

    @property
    def type_id(self) -> int:
        return self.format.type_id

    @property
    def windows(self) -> list[int]:
        return self.attention.windows if self.attention is not None else []

    @property
    def n_kv(self) -> int:
        return self.attention.n_kv if self.attention is not None else 0

    # ---- queries -------------------------------------------------------------

    def buffers(self) -> list[np.ndarray]:
        return [t for kind in self.kinds for t in kind.buffers()]

    @property
    def nbytes(self) -> int:
        """Bytes of every kind's buffers: K/V cells, states with their checkpoint rows,
        encoder memory rows."""
        return sum(t.nbytes for t in self.buffers())

    @property
    def n_used(self) -> int:
        """Cells, state rows and memory rows in use (0 means the cache is empty)."""
        return sum(kind.n_used for kind in self.kinds)

    def seq_positions(self, seq_id: int) -> np.ndarray:
        return self.attention.seq_positions(seq_id) if self.attention is not None else np.zeros(0, np.int32)

    def seq_ids(self) -> list[int]:
        return sorted({sid for kind in self.kinds for sid in kind.seq_ids()})

    def usable_prefix(self, seq_id: int, n: int) -> int:
        """The largest p <= n at which a sequence continuing from `seq_id`'s contents finds
        all it needs in every kind: K/V cells for [0, p), a state at exactly p."""
        p = n
        if self.attention is not None:
            p = self.attention.usable_prefix(seq_id, p)
        if self.recurrent is not None and p > 0:
            p = self.recurrent.usable_prefix(seq_id, p)
            if self.attention is not None and p > 0 and self.attention.usable_prefix(seq_id, p) != p:
                return 0   # a sliding window that no longer reaches back from the checkpoint
        return p

    # ---- edits ---------------------------------------------------------------

    def clear(self) -> None:
        for kind in self.kinds:
            kind.clear()
        if self.attention is None:
            self._cleared += 1

    def allocate(self, positions: np.ndarray, seq_ids: np.ndarray) -> tuple[list[np.ndarray], StepRows | None]:
        """Book a batch: per attention group the cells of its tokens, and the recurrent
        rows each sequence reads and writes (None without recurrent layers)."""
        slots = self.attention.allocate(positions, seq_ids) if self.attention is not None else []
        rows = self.recurrent.allocate(positions, seq_ids) if self.recurrent is not None else None
        return slots, rows

    def remove(self, seq_id: int, p0: int = 0, p1: int | None = None) -> None:
        for kind in self.kinds:
            kind.remove(seq_id, p0, p1)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        for kind in self.kinds:
            kind.copy_prefix(src, dst, n)

    def slide(self, seq_id: int, next_pos: int, margin: int = 0) -> None:
        if self.attention is not None:
            self.attention.slide(seq_id, next_pos, margin)

    def checkpoint(self, seq_id: int) -> None:
        """Record the sequence's state where it is now (a prompt chunk's or a turn's end),
        for a later prefix or rollback to resume from (recurrent layers only)."""
        if self.recurrent is not None:
            self.recurrent.checkpoint(seq_id)

    @property
    def can_shift(self) -> bool:
        return self.recurrent is None

    def check_shift(self) -> None:
        """Raise ContextShiftError when this cache cannot shift a sequence's context."""
        if self.recurrent is not None:
            raise ContextShiftError("this model has recurrent layers, whose state cannot drop tokens: "
                                    "the context cannot shift (raise num_ctx, or start a new request)")

    def shift(self, seq_id: int, n_keep: int, n_discard: int, rotate: Rotator) -> None:
        """Context shift (KVCache.shift) in every kind; refused for recurrent layers."""
        self.check_shift()
        if self.attention is not None:
            self.attention.shift(seq_id, n_keep, n_discard, rotate)
        if self.encoder is not None:
            self.encoder.remove(seq_id, n_keep, n_keep + n_discard)

    def compact(self) -> None:
        if self.attention is not None:
            self.attention.compact()

    def reserve(self, n: int, evict: Evict, *, n_seqs: int = 1, shift: tuple[int, int] | None = None) -> None:
        """Make room for a batch of n tokens of n_seqs sequences (each takes a new state
        row in recurrent layers; n = 0: only those rows), calling evict() (which
        drops an idle sequence's contents, False when none is left) until every kind
        has it; ContextLengthError when it cannot.  With shift=(seq_id, first_moved):
        room for the copies a context shift of that sequence makes of the cells it
        shares from first_moved on; idle sharers of them are evicted first."""
        if shift is not None:
            self._reserve_shift(*shift, evict)
            return
        if self.attention is not None:
            for group in self.attention.groups:
                while group.cells.n_free < n:
                    if not evict():
                        raise ContextLengthError(f"the KV cache has {group.cells.n_free} free cells but the "
                                                 f"batch needs {n}")
        if self.recurrent is not None:
            while self.recurrent.n_free < n_seqs:
                if not evict() and not self.recurrent.drop_checkpoint():
                    raise ContextLengthError(f"the recurrent state has {self.recurrent.n_free} free rows but "
                                             f"the batch needs {n_seqs}")

    def _reserve_shift(self, seq_id: int, first_moved: int, evict: Evict) -> None:
        if self.attention is None:
            return
        groups = self.attention.groups
        sharers: set[int] = set()
        for group in groups:
            shared = group.cells.shared_cells(seq_id, first_moved)
            if shared.size:
                bits = int(np.bitwise_or.reduce(group.cells.seq[shared]))
                sharers.update(s for s in range(MAX_SEQUENCES) if bits >> s & 1 and s != seq_id)
        if sharers:
            while evict(among=sharers):
                pass
        for group in groups:
            while group.cells.n_free < group.cells.shared_cells(seq_id, first_moved).size:
                if not evict():
                    break   # shift() says what is missing


def _has(layout: Sequence[object], kind: type) -> bool:
    return any(isinstance(spec, kind) for spec in layout)


__all__ = ["Cache", "CacheKind", "ContextShiftError", "Evict"]
