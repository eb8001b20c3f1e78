"""Which pyarrow memory pool the Parquet reads allocate from: `prefer_releasing_pool`.

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

Not for row groups that are copied out and dropped on the thread that decoded them
(`ParquetSource.fetch_row_group`: packed token windows, token-budget batches, the token
index): there mimalloc reuses that thread's pages, and the system allocator faults in
fresh ones for every decode, 19 ms against 8 ms for a row group of 1.2 M int32 tokens
(packed windows streamed with a 128 MiB cache: 33.0 M tokens/s against 26.5 M at the
same peak RSS, 352 MiB against 349; 2026-12-06, benchmarks/results/outofcore.md).

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


def _decide() -> str:
    current = pa.default_memory_pool().backend_name
    if current != "mimalloc" or os.environ.get(ENV):
        return current
    pool = pa.system_memory_pool()
    pa.set_memory_pool(pool)
    log.info(
        "iolib: pyarrow's default memory pool is now the system allocator (was mimalloc, "
        "which kept the row groups freed by other threads); set %s=mimalloc to keep it.",
        ENV,
    )
    return pool.backend_name
