"""Whether this process has sent a batch's first reads: work a loader starts with that
would compete with them for the GIL waits until they are out.

Why: building the image decoder while the first batch's bytes are read hides it, but
importing and building DALI is ~0.6 s of mostly Python on its own thread, and the
worker threads that send the first requests waited behind it. On a throttled S3
(40 ms, 5 MB/s a connection) the first batch's requests went out 0.55 s late
(benchmarks/results/2026-12-07-s11-first-batch.md).
"""

from __future__ import annotations

import threading

from iolib.base.forks import reset_after_fork


class _FirstReads:
    def __init__(self) -> None:
        self._after_fork()

    def _after_fork(self) -> None:
        # A forked worker sends its own first reads; the parent's say nothing of them.
        self.sent = threading.Event()


_FIRST = _FirstReads()
reset_after_fork(_FIRST)


def reads_sent() -> None:
    """Say that a batch's reads are on the wire, or already done (a check after the
    first time)."""
    if not _FIRST.sent.is_set():
        _FIRST.sent.set()


def reads_were_sent() -> bool:
    """Whether this process has sent a batch's reads."""
    return _FIRST.sent.is_set()


def after_first_reads(timeout_s: float) -> bool:
    """Wait until this process sent a batch's reads, at most `timeout_s`; True if it
    did."""
    return _FIRST.sent.wait(timeout_s)
