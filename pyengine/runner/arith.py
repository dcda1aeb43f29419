"""Which of llama.cpp's arithmetic paths each token of a batch follows.

llama.cpp computes some products differently depending on the batch it runs:
a batch of one token multiplies attention rows with its row dot product (four
accumulators) where larger batches use tiles (one); its repacked Q4_K weights
multiply activation rows in 4-row tiles except the last `len % 4` rows of a
batch; and batches of 8 rows or more multiply the other k-quants with a tiled
product of their own.  The golden logits come from llama.cpp running one
sequence at a time in batches of up to 512 tokens (`LLAMA_UBATCH`), so to
match them bit for bit a token follows the path it would take there:

  - `lone`: the token would be a batch of its own;
  - `paths`: the matmul path bits of its activation row (csrc kernels.h
    PE_PATH_*): TILE4 in a 4-row tile, WIDE in a batch of 8 rows or more,
    MULTI in a batch of 2 rows or more (llamafile's float GEMM).

The engine derives both from the token's role (a prompt token at a position,
or a generated one), never from what else shares the batch, so a sequence's
numbers do not depend on its neighbours or on how its prompt was chunked.
Direct users of `Forward` get them from the batch's own shape.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass

import numpy as np

LLAMA_UBATCH = 512
PATH_TILE4, PATH_WIDE, PATH_MULTI = 1, 2, 4   # as PE_PATH_* in csrc/core/kernels.h


@dataclass(frozen=True)
class Arith:
    lone: np.ndarray    # int32 per token
    paths: np.ndarray   # int32 per token: PATH_* bits

    @staticmethod
    def concat(parts: list["Arith"]) -> "Arith":
        return Arith(np.concatenate([p.lone for p in parts]), np.concatenate([p.paths for p in parts]))


def _arith(index: np.ndarray, length: np.ndarray) -> Arith:
    """Row `index` of a llama.cpp batch of `length` rows (arrays per token)."""
    paths = (np.where(index < length - length % 4, PATH_TILE4, 0) | np.where(length >= 8, PATH_WIDE, 0)
             | np.where(length >= 2, PATH_MULTI, 0))
    return Arith((length == 1).astype(np.int32), paths.astype(np.int32))


def prompt_arith(positions: np.ndarray, prompt_len: int) -> Arith:
    """Prompt tokens at `positions` of a prompt of `prompt_len` tokens, which
    llama.cpp would run in batches of LLAMA_UBATCH."""
    positions = np.asarray(positions, np.int64)
    start = positions // LLAMA_UBATCH * LLAMA_UBATCH
    return _arith(positions - start, np.minimum(LLAMA_UBATCH, prompt_len - start))


@functools.lru_cache(maxsize=64)
def generated_arith(n: int) -> Arith:
    """Generated tokens: each is a batch of its own (read-only arrays, made once per n)."""
    arith = _arith(np.zeros(n, np.int64), np.ones(n, np.int64))
    arith.lone.flags.writeable = arith.paths.flags.writeable = False
    return arith


def batch_arith(seq_ids: np.ndarray) -> Arith:
    """Every sequence's tokens in this batch taken as one llama.cpp batch."""
    ids = np.asarray(seq_ids).tolist()   # plain ints: cheaper than numpy for the few tokens of a decode step
    counts = Counter(ids)
    if len(counts) == len(ids):   # one token per sequence: a decode step
        return generated_arith(len(ids))
    seen: dict[int, int] = {}
    index = np.empty(len(ids), np.int64)
    for t, s in enumerate(ids):
        index[t] = seen.get(s, 0)
        seen[s] = index[t] + 1
    return _arith(index, np.array([counts[s] for s in ids], np.int64))
