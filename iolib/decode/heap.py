"""Give the C heap's freed pages back to the OS after a decoded batch: `trim_heap`.

Why: decoding a batch allocates and frees tens of MB of C heap on the worker's thread
(Pillow's full-size images, the uint8 batch before normalization, DALI's per-sample
buffers on its own threads), and glibc keeps freed memory in per-thread arenas for
reuse. On the throttled-store image benchmark those arenas held 45 MB (Pillow) to
130 MB (DALI on the CPU) of free memory in the process's resident set; `malloc_trim`
after each batch returned it for ~4 ms a batch of 64 (benchmarks/results/peers-images.md).
Elsewhere than glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_looked = False


def _find() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_heap() -> bool:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim(0)``); False
    where there is no such call."""
    global _trim, _looked
    if not _looked:
        _trim, _looked = _find(), True
    if _trim is None:
        return False
    _trim(0)
    return True
