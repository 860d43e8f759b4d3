"""Freed tensor memory goes back to the operating system (glibc's malloc, which torch's CPU tensors use).

glibc serves a block of at least its mmap threshold with a mapping of its own, unmapped when freed;
but each time such a block is freed it raises the threshold to that block's size (up to 32 MiB), so
later blocks of that size come from the heap, and a freed heap block stays in the process's resident
memory. A float64 check casts weights block by block and frees its values step by step: under the
sliding threshold GPT-2 124M's `check --mode fast` held 0.3 to 0.7 GB of freed blocks at its peak
(docs/benchmarks.md). Setting the threshold fixes it where it is: at glibc's own starting value."""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 128 << 10  # glibc's default, no longer raised by frees
_ENV = "MALLOC_MMAP_THRESHOLD_"  # glibc's own setting: a user's choice is left alone


def hold_mmap_threshold() -> bool:
    """Keep glibc's mmap threshold fixed for this process; False where it was not set (not glibc, or
    the user set it through the environment)."""
    if _ENV in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: another libc's mallopt numbers differ
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False
