"""Handing memory that a big load has freed back to the system."""

from __future__ import annotations

import ctypes
import functools
import sys


@functools.lru_cache(maxsize=1)
def _glibc_trim() -> object | None:
    """glibc's ``malloc_trim``, or None on other systems."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, for one)
        return None


def give_back_freed_memory() -> None:
    """Hand memory that Python and numpy have freed back to the system, where the C library
    allows it (glibc on Linux: ``malloc_trim``). glibc keeps freed blocks of under a few MB for
    its own reuse, and a load that frees thousands of small arrays (each file's) while it
    allocates a few big ones (the run's) would otherwise hold both. Nothing elsewhere."""
    trim = _glibc_trim()
    if trim is not None:
        trim(0)
