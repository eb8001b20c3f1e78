"""The reads of one reader in order of need, cancellable: `FetchPool`.

Why one pool for both readers (`ParquetReader`, the token reader): the read a batch waits
for must not queue behind read-ahead, and a loader that is closed, dropped or left by a
`break` must stop reading. Reads are "needed" (a batch waits on them) or "ahead"; an ahead
read starts only while no needed read is queued, running or led by a batch's own thread
(`needing`), so the link serves the batch the loop waits for first. `cancel()` drops
every queued read-ahead (a waiter on one wakes and reads it itself if still wanted);
read-ahead on the wire finishes, and its bytes are counted apart
(`bytes_after_cancel`): they belong to no batch of a live loader. Needed reads are not
dropped: a batch being assembled finishes, as a local read does (another loader may
share the source, and its batch must not fail).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any

from iolib.forks import reset_after_fork
from iolib.storage import take_counters

IDLE_S = 1.0  # a thread with nothing to start waits this long, then exits
NEED, AHEAD = 0, 1
_LIVE: weakref.WeakSet[FetchPool] = weakref.WeakSet()


class FetchPool:
    """At most `threads` reads at once, needed ones first, at most `ahead_threads` of
    them read-ahead. Threads start on submit and exit when idle (nothing outlives the
    reads). `deposit(read, retries)` receives what a read counted (bytes and retries of
    its thread) unless it was cancelled meanwhile."""

    def __init__(
        self,
        threads: int,
        name: str,
        deposit: Callable[[int, int], None],
        ahead_threads: int | None = None,
    ) -> None:
        self.threads, self.name = max(1, threads), name
        # Weakly: the reader owns its pool, and a cycle would keep a dropped reader's
        # cache until the cycle collector ran.
        self._deposit = weakref.WeakMethod(deposit) if hasattr(deposit, "__self__") else None
        self._plain_deposit = None if self._deposit is not None else deposit
        self.ahead_threads = self.threads if ahead_threads is None else max(1, ahead_threads)
        self._after_fork()
        reset_after_fork(self)
        _LIVE.add(self)

    def _after_fork(self) -> None:
        """A forked child has none of its parent's threads or reads."""
        self._cv = threading.Condition(threading.Lock())
        self._queue: list[list[Any]] = []  # [class, priority, seq, fn, future, live]
        self._entries: dict[Future, list[Any]] = {}
        self._flights: dict[Hashable, Future] = {}  # keyed reads queued or running
        self._seq = itertools.count()
        self._running = {NEED: 0, AHEAD: 0}
        self._needing = 0  # needed reads led by callers' own threads (`needing`)
        self._idle = 0
        self._workers: list[threading.Thread] = []
        self.generation = 0
        self._closed = False  # idle threads exit at once (the reader is gone or closed)
        self.bytes_after_cancel = 0
        self.cancels = 0

    # -- submitting ------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[[], Any],
        *,
        ahead: bool = False,
        priority: int = 0,
        key: Hashable | None = None,
    ) -> Future:
        """Run `fn` on a pool thread: a needed read before any ahead one, and within a
        class by `priority` (a batch number: the batch waited on first), then in order.
        With `key`, one read however many ask: a read of `key` in flight is shared
        (`flight`) until `fn` returns."""
        future: Future = Future()
        entry = [AHEAD if ahead else NEED, priority, next(self._seq), fn, future, True]
        with self._cv:
            self._closed = False
            if key is not None:
                found = self._flights.get(key)
                if found is not None:
                    return found
                self._flights[key] = future
            self._push(entry)
            self._grow()
            self._cv.notify()
        if key is not None:
            future.add_done_callback(partial(self._landed, key))
        return future

    def flight(self, key: Hashable, *, need: bool = False, priority: int = 0) -> Future | None:
        """The read of `key` queued or running, if any; `need`: a batch waits on it now,
        so a queued read-ahead becomes a needed read (`promote`)."""
        with self._cv:
            found = self._flights.get(key)
        if found is not None and need:
            self.promote(found, priority)
        return found

    def in_flight(self) -> list[Hashable]:
        """Keys of the reads queued or running."""
        with self._cv:
            return list(self._flights)

    def _landed(self, key: Hashable, future: Future) -> None:
        """A keyed read ended (or was cancelled): the next ask reads again."""
        with self._cv:
            if self._flights.get(key) is future:
                del self._flights[key]

    def promote(self, future: Future, priority: int = 0) -> None:
        """A batch now waits on `future`: if it is still queued as read-ahead, it becomes a
        needed read (a waiter on a gated read-ahead would otherwise wait for ever)."""
        with self._cv:
            entry = self._entries.get(future)
            if entry is None or not entry[5] or entry[0] == NEED:
                return
            entry[5] = False
            self._push([NEED, priority, entry[2], entry[3], future, True])
            self._cv.notify()

    @contextlib.contextmanager
    def needing(self) -> Iterator[None]:
        """A needed read on the caller's own thread: no read-ahead starts meanwhile."""
        with self._cv:
            self._needing += 1
        try:
            yield
        finally:
            with self._cv:
                self._needing -= 1
                self._cv.notify_all()

    def cancel(self) -> int:
        """Drop every queued read-ahead (its future is cancelled: waiters wake); those
        already running finish, counted in `bytes_after_cancel`. Returns how many were
        dropped."""
        with self._cv:
            dropped = [e for e in self._queue if e[5] and e[0] == AHEAD]
            for entry in dropped:
                entry[5] = False
                self._entries.pop(entry[4], None)
            self.generation += 1
            self.cancels += 1
            self._cv.notify_all()
        for entry in dropped:
            entry[4].cancel()
        return len(dropped)

    def close(self) -> None:
        """Cancel the read-ahead and let idle threads exit now (a later submit starts
        them again)."""
        self.cancel()
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def pending(self) -> int:
        """Reads queued or running."""
        with self._cv:
            return sum(1 for e in self._queue if e[5]) + sum(self._running.values())

    # -- the threads -----------------------------------------------------------------------
    def _push(self, entry: list[Any]) -> None:
        heapq.heappush(self._queue, entry)
        self._entries[entry[4]] = entry

    def _grow(self) -> None:
        """One more thread if more reads wait than threads do (a thread waiting behind
        needed reads counts as waiting) and the cap allows (under the lock)."""
        self._workers = [t for t in self._workers if t.is_alive()]
        waiting = sum(1 for e in self._queue if e[5])
        if waiting > self._idle and len(self._workers) < self.threads:
            # Not a daemon: at exit the interpreter joins it after `cancel_all` emptied
            # the queue (a daemon killed inside a read can abort the process).
            used = {t.name for t in self._workers}
            name = next(f"{self.name}-{i}" for i in range(self.threads + 1)
                        if f"{self.name}-{i}" not in used)  # fmt: skip
            thread = threading.Thread(target=self._work, name=name)
            self._workers.append(thread)
            thread.start()

    def _startable(self) -> list[Any] | None:
        """The next read that may start now (under the lock), taken off the queue."""
        while self._queue and not self._queue[0][5]:
            heapq.heappop(self._queue)  # promoted or cancelled: its new entry is queued
        if not self._queue:
            return None
        head = self._queue[0]
        if head[0] == AHEAD and (
            self._running[NEED] or self._needing or self._running[AHEAD] >= self.ahead_threads
        ):
            return None  # the batch waited on has the link first
        heapq.heappop(self._queue)
        self._entries.pop(head[4], None)
        return head

    def _work(self) -> None:
        while True:
            with self._cv:
                entry = self._startable()
                if entry is None:
                    self._idle += 1
                    woken = self._cv.wait(IDLE_S)
                    self._idle -= 1
                    entry = self._startable()
                    if entry is None:
                        # Idle for IDLE_S, nothing queued: exit (woken early, wait again).
                        idle = not any(e[5] for e in self._queue)
                        if idle and (self._closed or not woken):
                            self._workers = [
                                t for t in self._workers if t is not threading.current_thread()
                            ]
                            return
                        continue
                kind, generation = entry[0], self.generation
                self._running[kind] += 1
            future: Future = entry[4]
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(entry[3]())
                except BaseException as exc:  # raised to whoever waits on the read
                    future.set_exception(exc)
            read, retries = take_counters()
            with self._cv:
                self._running[kind] -= 1
                late = kind == AHEAD and generation != self.generation
                if late:
                    self.bytes_after_cancel += read
                self._cv.notify_all()
            deposit = self._deposit() if self._deposit is not None else self._plain_deposit
            if not late and deposit is not None:
                deposit(read, retries)
            del entry, future, deposit


def cancel_all() -> None:
    """Cancel every pool's queued reads (at exit, before the interpreter joins threads)."""
    for pool in list(_LIVE):
        with contextlib.suppress(Exception):
            pool.cancel()


# Run before the interpreter joins its threads at exit (a process worker that exits, or
# the trainer): queued reads would otherwise all run first. Later registrations run first.
threading._register_atexit(cancel_all)  # type: ignore[attr-defined]
