"""Give the C heap's freed pages back to the OS once they pile up: `trim_heap`.

Why: decoding a batch allocates and frees tens of MB of C heap (Pillow's full-size
images, the uint8 batch before normalization, DALI's per-sample buffers on its own
threads), and glibc keeps freed memory in per-thread arenas for reuse. On the
throttled-store image benchmark those arenas held 45 MB (Pillow) to 130 MB (DALI on the
CPU) of free memory in the process's resident set (benchmarks/results/peers-images.md).

Why not ``malloc_trim`` after every batch: it hands back every free page, so the next
batch faults the same working set in again; DALI on the CPU then took ~18% more CPU per
image than untrimmed (~105 page faults an image against ~22). So the heap is trimmed
when the resident set has grown by more than `TRIM_GROWTH` since the last trim (or the
least it has been since): a batch's working set mostly stays for the next batch to
reuse, and what piles up beyond it still goes back (benchmarks/results/images-vs-dali.md).
Elsewhere than glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
from typing import Any

# Resident growth let stand between trims: above one DALI or Pillow batch's working set
# at 224 px and batch 64 (~20-30 MB), half the 130 MB the arenas held untrimmed.
TRIM_GROWTH = 64 << 20

_libc: Any = None
_looked = False
_floor: int | None = None  # the least resident bytes seen since the last trim
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _find() -> Any:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def resident_bytes() -> int:
    """This process's resident set in bytes (/proc/self/statm; 0 where unreadable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _lib() -> Any:
    global _libc, _looked
    if not _looked:
        _libc, _looked = _find(), True
    return _libc


def trim_heap(growth: int = TRIM_GROWTH) -> bool:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim(0)``) when the
    resident set grew by more than `growth` bytes since the last trim (0: every call);
    True if it trimmed. False where there is no such call."""
    global _floor
    libc = _lib()
    if libc is None:
        return False
    if _floor is not None and growth > 0:
        resident = resident_bytes()
        _floor = min(_floor, resident)  # large buffers freed since went straight back
        if resident - _floor <= growth:
            return False
    libc.malloc_trim(0)
    _floor = resident_bytes()
    return True
