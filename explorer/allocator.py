"""Memory the app has freed goes back to the system (glibc's malloc; elsewhere these do nothing).

The mmap threshold is held where glibc starts (engine/run/allocator.py, as every command does): each
freed mapped block would otherwise raise it, and later blocks of that size come from heaps that
keep what is freed. Small blocks still come from those heaps, one per thread that allocates, and a
long session of workers leaves them holding freed memory: `trim` hands it back.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

from engine.run.allocator import hold_mmap_threshold

__all__ = ["hold_mmap_threshold", "trim", "resident_bytes"]


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        libc.gnu_get_libc_version  # noqa: B018 - glibc only
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def trim() -> None:
    """What glibc's heaps hold free, back to the system."""
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)


def resident_bytes() -> int:
    """The process's resident memory now (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
