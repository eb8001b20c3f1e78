"""The C heap under a loader: `limit_arenas` and `map_large_blocks` once, `trim_heap`
when pages pile up.

Why: decoding a batch allocates and frees tens of MB of C heap (DALI's per-run buffers
on its own threads, Pillow's full-size images, the uint8 batch before normalization),
and glibc keeps freed memory for reuse in an arena per thread, up to 8 per core. Each
arena kept its own share of that working set: on 2 cores, with 2 loader threads and
DALI on the CPU, the heap held 150-220 MB free at the epoch's peak.

`limit_arenas` caps the arenas at one per core (glibc's ``M_ARENA_MAX``), so threads
share freed pages instead of each keeping its own; it acts on arenas made afterwards,
so `ImagePipeline` calls it when it is made (or unpickled in a worker process), before
the loader's threads start. A ``MALLOC_ARENA_MAX`` in the environment (glibc's own
setting, read at process start) is the user's choice and is left as it is: that is
the opt-out.

`map_large_blocks` fixes glibc's mmap threshold (``M_MMAP_THRESHOLD``) at
`MMAP_THRESHOLD`: a block that large is mapped on its own and unmapped when freed, on
whichever thread frees it. glibc's own threshold starts at 128 KiB and rises to the size
of each mapped block freed, up to 32 MiB, after which a loader's compressed row groups,
decoded pages and batches come from the arenas and stay resident once freed: the heap
held 100-150 MB free at the epoch's peak on the throttled-store benchmarks
(benchmarks/results/peers-2026-12-07-memory.md). Set by a loader's workers; a
``MALLOC_MMAP_THRESHOLD_`` in the environment (glibc's own setting) is the opt-out, as
for the arenas. Not where images are decoded (`leave_mapping`, from `ImagePipeline`):
the buffers DALI makes every batch (9.6 MB at 224 px and batch 64) are then mapped
afresh each time, 97 page faults an image against 10-30 and 15-20% more CPU, for
~90 MB less at the epoch's peak; raising the threshold above them kept the CPU and
gave the memory back to the heap.

Why not ``malloc_trim`` after every batch: it hands back every free page, so the next
batch faults the same working set in again; DALI on the CPU then took ~18% more CPU
per image (~105 page faults an image against ~22). `trim_heap` runs after each batch
but trims only when the resident pages malloc holds free grew past `TRIM_GROWTH` since
the last trim: a guard against a heap that fragments without bound, not a per-batch
cost (benchmarks/results/images-vs-dali.md). Elsewhere than glibc (musl, macOS) both
do nothing.

Why a loader's workers look only every `CHECK_BYTES` faulted in (`check_heap`): the
look itself (``mallinfo2``) walks every free chunk of every arena, 0.1-6 ms on a
fragmented heap, and after every token batch it cost 0.2-0.7 s CPU an epoch; free
pages pile up mostly as pages are first faulted in, so the process's page faults (one
``getrusage``) say when a look can find something; a look at least every `CHECK_S`
catches the rest (memory in use freed, which faults nothing in; huge pages, 2 MiB a
fault).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import sys
import threading
import time
from typing import Any

# Free resident heap let stand between trims: above the working set of one DALI
# pipeline at 224 px and batch 64 (~35 MB) plus the row groups a loader reads ahead,
# which come and go every few batches. What it counts as free also holds memory others
# map (DALI's own buffers): at 64 MB DALI epochs trimmed often enough to fault 75 pages
# an image against 30.
TRIM_GROWTH = 256 << 20
ARENA_ENV = "MALLOC_ARENA_MAX"
_M_ARENA_MAX = -8  # glibc's mallopt parameter number
# Blocks at least this large are mapped on their own (see the module's docstring): above
# what DALI takes per image and batch, below a compressed or decoded row group.
MMAP_THRESHOLD = 4 << 20
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"
_M_MMAP_THRESHOLD = -3

# Bytes faulted in between two looks at the heap by `check_heap`: a quarter of the
# guard, so a look skipped lets resident memory grow by at most that much.
CHECK_BYTES = 64 << 20
# Seconds after which `check_heap` looks even without faults: memory freed that was in
# use piles up free pages without one fault, and a huge page is one fault for 2 MiB.
CHECK_S = 1.0

_libc: Any = None
_looked = False
_arenas_limited = False
_mapping_fixed = False
_floor: int | None = None  # the least idle bytes seen since the last trim
# This process's page faults at the calling thread's last `check_heap` look: per thread,
# so a look on one worker thread does not take the count of what another's task, not yet
# freed, faulted in.
_looked_at = threading.local()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``: uordblks is bytes allocated, hblkhd bytes mmapped."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def _find() -> Any:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        if hasattr(libc, "mallinfo2"):  # glibc >= 2.33
            libc.mallinfo2.argtypes, libc.mallinfo2.restype = [], _MallInfo2
    except (OSError, AttributeError):
        return None
    return libc


def _lib() -> Any:
    global _libc, _looked
    if not _looked:
        _libc, _looked = _find(), True
    return _libc


def limit_arenas(arenas: int | None = None) -> bool:
    """Cap glibc's malloc arenas at `arenas` (default: one per core, at least 2), once
    per process, unless ``MALLOC_ARENA_MAX`` is set in the environment; True if this
    call set the cap."""
    global _arenas_limited
    libc = _lib()
    if _arenas_limited or libc is None or os.environ.get(ARENA_ENV):
        return False
    if arenas is None:
        from iolib.base.resources import cpu_count

        arenas = max(2, cpu_count())
    _arenas_limited = bool(libc.mallopt(_M_ARENA_MAX, arenas))
    return _arenas_limited


def map_large_blocks(threshold: int = MMAP_THRESHOLD) -> bool:
    """Map blocks of at least `threshold` bytes on their own, so they go back to the OS
    when freed (glibc's ``M_MMAP_THRESHOLD``, which also stops glibc raising it), once
    per process, unless ``MALLOC_MMAP_THRESHOLD_`` is set in the environment; True if
    this call set it."""
    global _mapping_fixed
    libc = _lib()
    if _mapping_fixed or libc is None or os.environ.get(MMAP_ENV):
        return False
    _mapping_fixed = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    return _mapping_fixed


def leave_mapping() -> None:
    """Keep glibc's own mmap threshold in this process: `map_large_blocks` does nothing
    afterwards. For image decoding (see the module's docstring)."""
    global _mapping_fixed
    _mapping_fixed = True  # decided: nothing to fix


def tune_heap() -> None:
    """`limit_arenas` and `map_large_blocks`, each once: what a loader's threads and
    decoders need before they allocate."""
    limit_arenas()
    map_large_blocks()


def resident_bytes() -> int:
    """This process's resident set in bytes (/proc/self/statm; 0 where unreadable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _reading() -> tuple[int, int]:
    """(anonymous resident bytes, of which idle): see `idle_bytes`; (0, 0) where
    unreadable."""
    libc = _lib()
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        resident, shared = int(fields[1]) * _PAGE, int(fields[2]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0, 0
    if libc is None or not hasattr(libc, "mallinfo2"):
        return resident - shared, resident
    info = libc.mallinfo2()
    return resident - shared, resident - shared - info.uordblks - info.hblkhd


def idle_bytes() -> int:
    """Anonymous resident bytes not allocated by malloc: the heap's free pages still
    resident, plus memory others map (a near-constant); where glibc has no
    ``mallinfo2``, the whole resident set. 0 where unreadable."""
    return _reading()[1]


def trim_heap(growth: int = TRIM_GROWTH) -> bool:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim(0)``) when the
    resident bytes malloc holds free grew by more than `growth` since the last trim
    (0: every call); True if it trimmed. False where there is no such call."""
    global _floor
    libc = _lib()
    if libc is None:
        return False
    resident, idle = _reading()
    if _floor is not None and growth > 0:
        _floor = min(_floor, idle)  # pages given back since (large blocks, by glibc)
        if idle - _floor <= growth:
            return False
    libc.malloc_trim(0)
    resident_after, idle_after = _reading()
    # Another thread's batch freed just after the trim is idle afterwards but is growth,
    # not floor: left as the floor, it stays resident while batches reuse it without a
    # fault that would make a look. What the trim gave back, taken from the idle bytes
    # before it, leaves such a free out; a block faulted in meanwhile inflates that
    # estimate instead, and the reading after leaves it out: the lesser of the two.
    _floor = min(idle_after, idle - max(0, resident - resident_after))
    return True


def check_heap(every: int | None = None) -> bool:
    """`trim_heap` if at least `every` bytes (default `CHECK_BYTES`) were faulted in by
    this process since this thread's last look, or `CHECK_S` passed (the first call
    looks); True if it trimmed. Costs one ``getrusage`` otherwise: a loader's workers
    call it after every task."""
    if _lib() is None:
        return False
    import resource  # not on Windows, where `_lib()` is None

    every = CHECK_BYTES if every is None else every
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    now = time.monotonic()
    seen = getattr(_looked_at, "faults", None)
    # Fewer than last time: a forked child, whose counts start again.
    if (
        seen is not None
        and 0 <= (faults - seen) * _PAGE < every
        and now - _looked_at.when < CHECK_S
    ):
        return False
    _looked_at.faults, _looked_at.when = faults, now
    return trim_heap(TRIM_GROWTH)
