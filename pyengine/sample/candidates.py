"""The candidate set every sampler works on: token ids with their logits, maybe sorted.

Samplers narrow the set (keep a subset of positions) or rewrite logits in place. Ties in
any ordering are broken by position, which for the full vocabulary means by lower token
id, so every result is deterministic.
"""

from __future__ import annotations

import numpy as np

from pyengine import _core

# Below this many candidates a plain stable sort is cheaper than anything clever.
_SMALL = 4096
# Up to this many of a big vocabulary's float32 logits, the k best come from one native
# pass (_core.top_k: it inserts each newcomer into its ordered list, so k stays small).
_NATIVE_K = 256
# Sample roughly this many logits to guess a top-k threshold on big vocabularies.
_SAMPLE_TARGET = 2048


class Candidates:
    """Token ids and logits (parallel numpy arrays); `sorted` means logits descend."""

    __slots__ = ("ids", "logits", "sorted", "identity")

    def __init__(self, ids: np.ndarray, logits: np.ndarray, *, sorted: bool = False,
                 identity: bool = False) -> None:
        self.ids = ids            # int64 [n]: token ids
        self.logits = logits      # float32 [n]: owned by the candidates, free to rewrite
        self.sorted = sorted      # logits in descending order
        self.identity = identity  # ids == arange(n): position i holds token i

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def keep(self, positions: np.ndarray, *, sorted: bool) -> None:
        """Narrow the set to `positions` (in that order)."""
        self.ids = self.ids[positions]
        self.logits = self.logits[positions]
        self.sorted = sorted
        self.identity = False

    def keep_prefix(self, count: int) -> None:
        """Narrow a sorted set to its first `count` entries."""
        self.ids = self.ids[:count]
        self.logits = self.logits[:count]
        self.identity = False

    def sort(self) -> None:
        """Order by descending logit (stable: ties keep their current order)."""
        if not self.sorted:
            self.keep(np.argsort(-self.logits, kind="stable"), sorted=True)

    def probs(self) -> np.ndarray:
        """Softmax of the current logits (float64; -inf entries get probability 0)."""
        return softmax(self.logits)

    def positions_of(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, which): positions of those `tokens` present; `which` indexes `tokens`."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if self.identity:
            inside = np.flatnonzero((tokens >= 0) & (tokens < len(self)))
            return tokens[inside], inside
        if len(self) == 0 or tokens.size == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        order = np.argsort(self.ids, kind="stable")
        sorted_ids = self.ids[order]
        slots = np.minimum(np.searchsorted(sorted_ids, tokens), len(sorted_ids) - 1)
        which = np.flatnonzero(sorted_ids[slots] == tokens)
        return order[slots[which]], which


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax in float64; -inf logits get probability 0."""
    values = logits.astype(np.float64)
    top = values.max() if values.size else 0.0
    if not np.isfinite(top):
        # every entry is -inf: fall back to uniform so callers never see NaN
        return np.full(values.shape, 1.0 / max(values.size, 1))
    weights = np.exp(values - top)
    return weights / weights.sum()


def log_partition(logits: np.ndarray) -> float:
    """log(sum(exp(logits))), stable; the exponentials in float32 for speed on big vocabularies."""
    top = float(logits.max())
    if not np.isfinite(top):
        return top
    return top + float(np.log(np.sum(np.exp(logits - np.float32(top)), dtype=np.float64)))


def top_k_positions(logits: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest logits, in descending order, ties to the lower position
    (the logits hold no NaN: the chain refuses those).

    Avoids a full sort: one native pass for a few of a big vocabulary's float32 logits,
    else (and argpartition's cost on 262k entries) a threshold guessed from a strided
    sample, keeping everything above it and sorting only those.
    """
    n = logits.shape[0]
    if k >= n:
        return np.argsort(-logits, kind="stable")
    if k <= 0:
        return np.empty(0, np.int64)
    if n > _SMALL and k <= _NATIVE_K and logits.dtype == np.float32 and logits.flags.c_contiguous:
        return _core.top_k(logits, k)
    if n > _SMALL and k * 16 < n:
        chosen = _threshold_select(logits, k)
        if chosen is not None:
            return chosen
    return _partition_select(logits, k)


def _threshold_select(logits: np.ndarray, k: int) -> np.ndarray | None:
    n = logits.shape[0]
    stride = max(n // _SAMPLE_TARGET, 1)
    sample = logits[::stride]
    # the k-th best overall is expected near rank k/stride of the sample: aim a bit above
    rank = min(sample.shape[0], k // stride + 8)
    threshold = np.partition(sample, sample.shape[0] - rank)[sample.shape[0] - rank]
    if not np.isfinite(threshold):
        return None
    above = np.flatnonzero(logits >= threshold)
    if above.shape[0] < k or above.shape[0] > max(8 * _SAMPLE_TARGET, 64 * k):
        return None
    return above[_best_in_order(logits[above], k)]


def _partition_select(logits: np.ndarray, k: int) -> np.ndarray:
    return _best_in_order(logits, k)


def _best_in_order(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, descending, ties to the lower index."""
    if k >= values.shape[0]:
        return np.argsort(-values, kind="stable")
    part = np.argpartition(-values, k - 1)[:k]
    kth = values[part].min()
    # strictly better ones are certainly in; fill up with the lowest indices equal to the k-th
    better = np.flatnonzero(values > kth)
    equal = np.flatnonzero(values == kth)[: k - better.shape[0]]
    chosen = np.concatenate([better, equal])
    return chosen[np.argsort(-values[chosen], kind="stable")]
