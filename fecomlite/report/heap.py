"""Heap tuning for a short command that works through large arrays (`fecomlite report`).

A report of a million calls makes and drops hundreds of arrays of a few MB. glibc's malloc
gives each of them fresh pages from the kernel (mmap above its threshold, and the top of the
heap trimmed as soon as it is free), and the first touch of a fresh page costs more system
time than the arithmetic on it (~1.7 ms a MB on a shared VM). Kept for reuse instead, a freed
array's pages serve the next one: ~35 % fewer page faults at 1 M calls. Only for a process
that ends soon after: a long-lived one (the server) would keep its peak memory.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h: free heap top kept up to this many bytes
M_MMAP_THRESHOLD = -3  # allocations from this size on are mmapped (glibc's maximum: 32 MiB)
KEEP_BYTES = 1 << 30
MMAP_FROM = 32 << 20


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse (see the module); whether it did (not
    on another C library or system, where nothing changes)."""
    if sys.platform != "linux":
        return False
    try:
        glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
        mallopt = ctypes.CDLL(None).mallopt if glibc else None  # musl has none of these
    except (ValueError, OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_FROM)) and bool(
        mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))
