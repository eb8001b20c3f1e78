"""Which pyarrow memory pool the Parquet reads allocate from: `prefer_releasing_pool`
for `ParquetSource`, `prefer_token_pool` for packed token windows.

Why: pyarrow's wheels default to mimalloc, which keeps the pages a thread freed until
that same thread allocates again. The reader decodes row groups on fetch and read-ahead
threads that then go idle, and the row groups are freed on other threads (cache
eviction, the consumer dropping a batch), so those pages stay. On the throttled-store
image benchmark (benchmarks/bench_peers.py, 2,000 JPEGs in 1 MB row groups, a 32 MiB
cache) mimalloc held ~150 MB beyond what Arrow had allocated (peak PSS 764 MB against
593 MB with jemalloc). The system allocator (glibc) gives a large block back to the OS
when it is freed, whichever thread frees it: against jemalloc, packed token windows
streamed with a 128 MiB cache peaked at 346-396 MiB above the process's baseline
instead of 404-440, and DALI image epochs at 617 MB PSS instead of 655 (Pillow: the
same); 2026-12-06, benchmarks/results/outofcore.md and peers-images.md.

Packed token windows (`iolib.text`) keep the values Parquet's decode allocated as their
segments, freed by whichever thread evicts them: with mimalloc those pages stayed too
(peak RSS above the baseline with 2 thread workers and a 64 MiB cache: 190-308 MiB,
against 162-176 with jemalloc and 166-173 when segments were NumPy copies), while the
system allocator faults in fresh pages for every decode (packed windows inline 61-64 M
tokens/s, against 81-90 with jemalloc and 83-91 with mimalloc). So their reads take
jemalloc where pyarrow was built with it (its Linux wheels are), which gives back pages
freed on any thread after a short decay, and leave the pool as it is where it was not
(2026-12-07, benchmarks/results/2026-12-07-s13-packed-inline.md). Reads that copy a row
group out and drop it on the thread that decoded it (token-budget batches, the token
index) leave the pool as it is: mimalloc reuses that thread's pages there, where the
system allocator faulted in fresh ones for every decode (19 ms against 8 ms for a row
group of 1.2 M int32 tokens; 2026-12-06, benchmarks/results/outofcore.md).

The switch is process-wide (pyarrow has one default pool, and its Parquet reader takes
no other), made once, and only where the user chose nothing: an
``ARROW_DEFAULT_MEMORY_POOL`` in the environment (pyarrow's own setting) is kept, as is a
pool other than mimalloc set by `pyarrow.set_memory_pool`. Buffers allocated before the
switch return to the pool that made them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import pyarrow as pa

ENV = "ARROW_DEFAULT_MEMORY_POOL"
log = logging.getLogger("iolib.sources.parquet")
_lock = threading.Lock()
_decided: str | None = None


def prefer_releasing_pool() -> str:
    """Make the system allocator pyarrow's default pool where mimalloc is the default by
    no one's choice; return the backend in use. Cheap after the first call."""
    global _decided
    if _decided is not None:
        return _decided
    with _lock:
        if _decided is None:
            _decided = _decide()
    return _decided


def prefer_token_pool() -> str:
    """Make jemalloc pyarrow's default pool where mimalloc is the default by no one's
    choice and pyarrow has jemalloc; return the backend in use. Cheap after the first
    call (whichever of the two preferences comes first decides, once a process)."""
    global _decided
    if _decided is not None:
        return _decided
    with _lock:
        if _decided is None:
            _decided = _decide(_jemalloc)
    return _decided


def _jemalloc() -> pa.MemoryPool | None:
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without it (Windows wheels)
        return None


def _decide(choose: Callable[[], pa.MemoryPool | None] = pa.system_memory_pool) -> str:
    current = pa.default_memory_pool().backend_name
    if current != "mimalloc" or os.environ.get(ENV):
        return current
    pool = choose()
    if pool is None:
        return current
    pa.set_memory_pool(pool)
    log.info(
        "iolib: pyarrow's default memory pool is now %s (was mimalloc, which kept the "
        "row groups freed by other threads); set %s=mimalloc to keep it.",
        pool.backend_name,
        ENV,
    )
    return pool.backend_name
