"""One reader's read-ahead machinery, shared by `ParquetReader` and the token reader:
`ReadAhead`.

Why one component: both readers read blocks (row groups) along a plan the loader gives
them, on a pool of threads that serves the batch waited on first (`FetchPool`); both
must stop reading when their loader is closed, dropped or left, keep nothing a read
brings in after the reader was closed, count what their helper threads read in the batch
that takes it over, and let the threads go with the reader.
Each reader keeps what differs: how a block is read and decoded, and its cache's policy.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from iolib.base.forks import reset_after_fork
from iolib.sources.fetch_pool import FetchPool, running_needed


class ReadAhead:
    """A reader's fetch pool (made on first use, released when this object is
    collected), the bytes and retries its threads read (`take_io`), cancellation
    (`cancel`: queued read-ahead dropped; a batch begun before it reads nothing more
    ahead: `begin`, `paused`) and closes (`close`: a read keeps what it brings only in
    the cache it started with, `opened`, `kept_since`).

    `threads`: reads at once (a number, or a function asked when the pool is made);
    `ahead_threads`: at most that many of them read-ahead (all when None)."""

    def __init__(
        self, name: str, threads: int | Callable[[], int], ahead_threads: int | None = None
    ) -> None:
        self.name, self._threads, self._ahead_threads = name, threads, ahead_threads
        self._after_fork()
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """A forked worker has none of its parent's threads, nor their reads' counts."""
        self._lock = threading.Lock()
        self._pool: FetchPool | None = None
        self._io = (0, 0)  # bytes and retries read by pool threads, not in a batch yet
        # Cancels are numbered: a batch remembers the number it began under (`begin`), so
        # a cancel stops the read-ahead of the batches then in progress (those of the
        # loader that was left) and not that of a batch another loader begins after it.
        self._cancels = self._resumed = 0
        self._began = threading.local()
        self._closes = 0  # `opened`

    @property
    def started(self) -> FetchPool | None:
        """The pool if one was made (no threads are started to look)."""
        return self._pool

    def pool(self) -> FetchPool:
        """The pool, made on first use."""
        if self._pool is None:
            threads = self._threads() if callable(self._threads) else self._threads
            pool = FetchPool(threads, self.name, self.deposit, ahead_threads=self._ahead_threads)
            with self._lock:
                if self._pool is None:
                    self._pool = pool
                    weakref.finalize(self, pool.release)  # its idle threads go with it
        return self._pool

    def deposit(self, read: int, retries: int) -> None:
        """Bytes and retries read on a thread that makes no batch: the next batch counts
        them."""
        with self._lock:
            self._io = (self._io[0] + read, self._io[1] + retries)

    def take_io(self) -> tuple[int, int]:
        """Bytes and retries deposited since the last take."""
        with self._lock:
            io, self._io = self._io, (0, 0)
        return io

    def begin(self) -> None:
        """The calling thread starts a batch: it may read ahead until the next `cancel`."""
        self._began.ticket = self._cancels

    @property
    def paused(self) -> bool:
        """Whether the batch on this thread began before the latest `cancel` (its pass
        was left: it reads nothing ahead). A thread that never said `begin` is paused
        from a cancel until the next plan (`resume`)."""
        ticket = getattr(self._began, "ticket", None)
        return (self._resumed if ticket is None else ticket) != self._cancels

    def cancel(self) -> None:
        """Drop the queued read-ahead (reads on the wire finish: `bytes_after_close`);
        the batches in progress read nothing more ahead (`paused`), batches begun later
        do (another loader's on the same source, or the next pass's). Safe from a
        finalizer (no lock is waited for)."""
        self._cancels += 1
        pool = self._pool
        if pool is not None:
            pool.cancel()

    def resume(self) -> None:
        """A new plan: read-ahead may start again on threads that never said `begin`."""
        self._resumed = self._cancels

    @property
    def opened(self) -> int:
        """The reader's closes so far: a read notes it when it starts, and keeps what it
        read only while `kept_since` that note (a close drops the cache it started with:
        what lands afterwards belongs to no loader)."""
        return self._closes

    def kept_since(self, opened: int) -> bool:
        """Whether a read that started at `opened` may keep what it read: no `close`
        since. Asked under the reader's lock, which its close takes to drop the cache
        after counting the close, so a read that kept something kept it before the drop."""
        return self._closes == opened

    def close(self) -> None:
        """Cancel, and let the threads go (a bounded wait for reads on the wire); reads
        that land afterwards keep nothing (`kept_since`). The reader drops its cache
        after this, under its lock."""
        self._closes += 1
        self.cancel()
        pool = self._pool
        if pool is not None:
            pool.close()

    @staticmethod
    def needed() -> bool:
        """Whether the read on this thread is one a batch waits for (`running_needed`):
        a large one is then read in parallel pieces."""
        return running_needed()

    def bytes_after_close(self) -> int:
        """Read-ahead bytes that arrived after a cancel (in this process)."""
        pool = self._pool
        return pool.bytes_after_cancel if pool is not None else 0
