"""Private memory in 2 MiB pages, where Linux gives them to madvised memory
(transparent huge pages in "madvise" or "always" mode).

The native core reads two streams that cross many pages each step: every weight once
per token, and the K and V rows of every cell a token attends to.  Through 4 KiB pages
each new page of such a stream costs a TLB miss and a page walk; in 2 MiB pages almost
none do.  On the VM this was measured on, a SmolLM2 decode step is ~10% faster with its
weights there, and attention over 1000 cells of a cache out of the CPU caches ~35%
faster with the K/V rows there.  Elsewhere (other systems, THP off) the same calls give
ordinary memory.

Also here, for the memory it hands out: how much the system has available
(available_memory), and faulting a block in while the engine is idle (Prefault)."""

from __future__ import annotations

import ctypes
import mmap
import sys

import numpy as np

HUGE_PAGE = 2 << 20
_MADV_POPULATE_WRITE = 23   # Linux 5.14: fault pages in writable, leaving what they hold


def available() -> bool:
    """Whether madvised anonymous memory can be backed by huge pages here."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def available_memory() -> int:
    """MemAvailable from /proc/meminfo in bytes; 0 where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def arena(size: int) -> tuple[mmap.mmap, int] | None:
    """`size` bytes of private anonymous memory madvised for huge pages, from a 2 MiB
    boundary: (buffer, start), or None where it cannot be had.  Nothing is resident until
    written, and what is read before is zero."""
    try:
        buf = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        start = -np.frombuffer(buf, np.uint8, count=1).ctypes.data % HUGE_PAGE
        buf.madvise(mmap.MADV_HUGEPAGE, start, len(buf) - start)
    except (OSError, ValueError, AttributeError):
        return None
    return buf, start


def zeros(nbytes: int) -> np.ndarray:
    """`nbytes` zero bytes (uint8) from a 64-byte boundary, in huge pages when there are
    to be had and the size spans one; the array keeps its memory alive."""
    if nbytes >= HUGE_PAGE and available():
        got = arena(nbytes)
        if got is not None:
            buf, start = got
            return np.frombuffer(buf, np.uint8, count=nbytes, offset=start)
    block = np.zeros(nbytes + 64, np.uint8)
    start = -block.ctypes.data % 64
    return block[start:start + nbytes]


class Prefault:
    """Faults in the memory under some arrays a piece at a time, leaving what it holds
    (so the engine may write it between pieces): `step` does one piece, on Linux 5.14's
    MADV_POPULATE_WRITE, and says whether any is left.

    The KV cache is written a few rows per step, and every page it has not touched yet
    faults inside a forward pass; llama.cpp clears its whole cache when it makes it.
    The engine calls `step` while it has nothing else to do, so that a server's cache is
    resident before its requests need it, and a one-shot run, never idle, spends nothing
    on pages it will not use (on the Intel VM a 2 MiB page the guest had not used before
    took ~4.5 ms to fault; four concurrent SmolLM2 generations on fresh cells spent a
    quarter of their graph time writing them).  Memory over half of what is available is
    left to fault lazily: a long context that is never filled should not push the system
    into swap."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self._keep = arrays
        page = mmap.PAGESIZE
        lo = min(a.ctypes.data for a in arrays)
        hi = max(a.ctypes.data + a.nbytes for a in arrays)
        self._next, self._end = -(-lo // page) * page, hi // page * page
        self._madvise = _madvise() if hi - lo <= available_memory() // 2 else None
        if self._madvise is None:
            self._next = self._end

    @property
    def done(self) -> bool:
        return self._next >= self._end

    def step(self) -> bool:
        """Fault in the next piece (2 MiB); False once nothing is left."""
        if self.done:
            return False
        size = min(HUGE_PAGE - self._next % HUGE_PAGE, self._end - self._next)
        try:
            failed = self._madvise(self._next, size, _MADV_POPULATE_WRITE) != 0
        except (OSError, ctypes.ArgumentError):   # the engine's loop must not die of it
            failed = True
        if failed:
            self._next = self._end   # e.g. a kernel before 5.14: the pages stay lazily faulted
            return False
        self._next += size
        return not self.done


def _madvise():
    """libc's madvise through ctypes (which lets go of the GIL in the call), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
