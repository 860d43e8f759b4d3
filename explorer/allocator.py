"""Memory the app has freed goes back to the system (glibc's malloc; elsewhere these do nothing).

glibc serves a freed block's size from its heap next time: after a 19 MB block is freed, its
dynamic mmap threshold rises to 19 MB, and every later block up to that size comes from heaps
that are returned only from their top. On GPT-2 124M a float64 step trace left 0.48 GB resident
after everything it made was freed, a check 0.35 GB, and 500 monkey keys grew the app to 10x the
model's bytes (docs/benchmarks.md). A fixed threshold puts every block of `MMAP_THRESHOLD` or more
in its own mapping, unmapped when freed; `trim` hands back what the heaps have free.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 4 << 20  # blocks from 4 MiB (a 1024 x 1024 float32 matrix) are mapped on their own


@functools.lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def map_big_blocks() -> bool:
    """Big blocks in mappings of their own from now on, for the whole process; False where not glibc."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim() -> None:
    """What glibc's heaps hold free, back to the system."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def resident_bytes() -> int:
    """The process's resident memory now (0 where /proc is not there)."""
    import os

    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
