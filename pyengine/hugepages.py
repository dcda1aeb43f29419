"""Private memory in 2 MiB pages, where Linux gives them to madvised memory
(transparent huge pages in "madvise" or "always" mode).

The native core reads two streams that cross many pages each step: every weight once
per token, and the K and V rows of every cell a token attends to.  Through 4 KiB pages
each new page of such a stream costs a TLB miss and a page walk; in 2 MiB pages almost
none do.  On the VM this was measured on, a SmolLM2 decode step is ~10% faster with its
weights there, and attention over 1000 cells of a cache out of the CPU caches ~35%
faster with the K/V rows there.  Elsewhere (other systems, THP off) the same calls give
ordinary memory.

Also here: what the memory it hands out needs around it, the memory available
(available_memory) and faulting a block in behind the engine (populate_in_background)."""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading

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


def populate_in_background(block: np.ndarray) -> threading.Thread | None:
    """Fault in the memory under `block` from a daemon thread, leaving its contents as
    they are (so the engine may write it meanwhile); None where this cannot be done.

    The KV cache is written a few rows per step, and every page it has not touched yet
    faults inside a forward pass; llama.cpp clears its whole cache when it makes it.
    Here the pages come in off the token path instead (on the Intel VM a 2 MiB page
    that the guest had not used before took ~4.5 ms to fault, and four concurrent
    SmolLM2 generations spent a quarter of their graph time writing new cells).  A block
    over half the memory available is left to fault lazily: a long context that is never
    filled should not push the system into swap.  The thread holds `block`, so its
    memory lives until the thread is done."""
    if not sys.platform.startswith("linux") or block.nbytes > available_memory() // 2:
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    page = mmap.PAGESIZE
    start = -(-block.ctypes.data // page) * page
    end = (block.ctypes.data + block.nbytes) // page * page
    if end <= start:
        return None

    def populate(_keep_alive: np.ndarray) -> None:
        # a chunk at a time: ctypes lets go of the GIL in each call
        for at in range(start, end, HUGE_PAGE):
            if madvise(at, min(HUGE_PAGE, end - at), _MADV_POPULATE_WRITE) != 0:
                return   # a kernel before 5.14: the pages stay lazily faulted

    thread = threading.Thread(target=populate, args=(block,), name="pyengine-prefault", daemon=True)
    thread.start()
    return thread
