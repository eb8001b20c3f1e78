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

Thread lifetime: the threads are daemons that exit after `IDLE_S` without work, so none
blocks the interpreter's exit or a worker process's; an exit hook drops every queued read
and waits a bounded time for those on the wire (a daemon still inside a read while the
interpreter finalizes can abort the process). `cancel()` and `release()` may run from a
finalizer or `__del__`, on any thread, even one inside this pool's lock: they never
wait for a lock; the queue is pruned by the next pool thread that takes it.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from iolib.base.forks import reset_after_fork
from iolib.storage import take_counters

IDLE_S = 1.0  # a thread with nothing to start waits this long, then exits
CLOSE_JOIN_S = 2.0  # close() waits at most this for the reads on the wire
EXIT_JOIN_S = 10.0  # at exit, all pools together wait at most this for their reads
WAKE_S = 0.05  # a cancel waits at most this for the lock to wake idle threads
NEED, AHEAD = 0, 1
Priority = int | tuple[int, int]  # a batch number, or (epoch, batch number)
_LIVE: weakref.WeakSet[FetchPool] = weakref.WeakSet()
_exiting = False
_current = threading.local()  # `need`: whether this pool thread's read is a needed one


def running_needed() -> bool:
    """Whether the read running on this thread is one a batch waits for: a pool
    thread's needed (or promoted) read, or any read on a caller's own thread."""
    return getattr(_current, "need", True)


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
        self._pid = os.getpid()
        self._cv = threading.Condition(threading.Lock())
        # [class, priority, seq, fn, future, live, generation submitted in]
        self._queue: list[list[Any]] = []
        self._entries: dict[Future, list[Any]] = {}
        self._flights: dict[Hashable, Future] = {}  # keyed reads queued or running
        self._alias: dict[Future, Future] = {}  # a key's future -> the read that brings it
        self._shares: dict[Future, dict[Hashable, Future]] = {}  # that read -> its keys'
        self._seq = itertools.count()
        self._running = {NEED: 0, AHEAD: 0}
        self._needing = 0  # needed reads led by callers' own threads (`needing`)
        self._idle = 0
        self._workers: list[threading.Thread] = []  # those that take reads
        self._started: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # to join
        # Cancels are numbered without a lock (a finalizer may ask for one): queued
        # read-ahead of an earlier generation than `generation` is dropped once a thread
        # holding the lock sees `_pruned` behind it.
        self._tickets = itertools.count(1)
        self.generation = self._pruned = 0
        self._drop_needed = False  # at exit: needed reads go too (nobody waits any more)
        self._closed = False  # idle threads exit at once (the reader is gone or closed)
        self.bytes_after_cancel = 0

    @property
    def cancels(self) -> int:
        """How many times the queued read-ahead was cancelled."""
        return self.generation

    # -- submitting ------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[[], Any],
        *,
        ahead: bool = False,
        priority: Priority = 0,
        key: Hashable | None = None,
    ) -> Future:
        """Run `fn` on a pool thread: a needed read before any ahead one, and within a
        class by `priority` ((epoch, batch), or a batch number: epoch 0; the batch waited
        on first, so the next epoch's read-ahead never passes this one's last batches),
        then in order.
        With `key`, one read however many ask: a read of `key` in flight is shared
        (`flight`) until `fn` returns."""
        future: Future = Future()
        if _exiting:  # no new threads once the exit hook ran: needed reads run here
            return _inline(future, fn, ahead)
        entry = [AHEAD if ahead else NEED, _rank(priority), next(self._seq), fn, future, True,
                 self.generation]  # fmt: skip
        with self._cv:
            dropped = self._prune()
            self._closed = False
            found = self._flights.get(key) if key is not None else None
            if found is None:
                if key is not None:
                    self._flights[key] = future
                self._push(entry)
                self._grow()
                self._cv.notify()
        _cancel(dropped)
        if found is not None:
            return found
        if key is not None:
            future.add_done_callback(partial(self._landed, key))
        return future

    def submit_many(
        self,
        fn: Callable[[list[Hashable]], dict[Hashable, Any]],
        keys: Sequence[Hashable],
        *,
        ahead: bool = False,
        priority: Priority = 0,
    ) -> dict[Hashable, Future]:
        """One read for several keys (one request that brings neighbouring row groups'
        bytes too): `fn(led)` gets the keys it leads, in order, and returns {key: value}
        (a value that is an exception is raised to that key's waiters; a key left out
        gets None). It leads the keys not in flight and, for a needed read, those whose
        read is a read-ahead still queued (`queued_ahead`) of none but these keys: that
        read is dropped, and their waiters get this one's values. Each led key is a
        flight (`flight`, `promote`) until `fn` returns; a key read otherwise keeps its
        own read. Returns every key's future."""
        out: dict[Hashable, Future] = {}
        led: list[Hashable] = []
        fresh: list[Hashable] = []  # led keys not in flight before
        runner: Future = Future()
        dropped: list[Future] = []
        taken: set[Hashable] = set()
        wanted = set(keys)
        with self._cv:
            for key in keys:
                found = self._flights.get(key)
                if found is None:
                    found = self._flights[key] = Future()
                    fresh.append(key)
                elif key not in taken:
                    if ahead or _exiting or not self._takeable(found, wanted):
                        out[key] = found
                        continue
                    # Its queued read is dropped (all of whose keys this one leads).
                    before = self._alias.pop(found)
                    self._entries.pop(before)[5] = False
                    taken.update(self._shares.pop(before))
                    dropped.append(before)
                led.append(key)
                out[key] = found
            if led:
                self._shares[runner] = {key: out[key] for key in led}
            if led and not _exiting:
                # Queued under the same lock as the flights: a waiter that promotes one
                # finds the read it belongs to.
                for key in led:
                    self._alias[out[key]] = runner
                dropped += self._prune()
                self._closed = False
                self._push([AHEAD if ahead else NEED, _rank(priority), next(self._seq),
                            partial(fn, led), runner, True, self.generation])  # fmt: skip
                self._grow()
                self._cv.notify()
        _cancel(dropped)  # a taken read's keys are this one's now: its cancel reaches none
        for key in fresh:
            out[key].add_done_callback(partial(self._landed, key))
        if led:
            runner.add_done_callback(self._share)
            if _exiting:  # no new threads once the exit hook ran: needed reads run here
                _inline(runner, partial(fn, led), ahead)
        return out

    def _takeable(self, future: Future, keys: set[Hashable]) -> bool:
        """Whether `future` is a key of a read-ahead still queued whose keys are all among
        `keys` (under the lock)."""
        runner = self._alias.get(future)
        entry = None if runner is None else self._entries.get(runner)
        return (
            entry is not None
            and entry[5]
            and entry[0] == AHEAD
            and self._shares.get(runner, {}).keys() <= keys
        )

    def queued_ahead(self, future: Future) -> bool:
        """Whether `future` (a key's, from `submit_many`) is a read-ahead not started yet:
        a needed `submit_many` of its keys takes it over, with its neighbours."""
        with self._cv:
            runner = self._alias.get(future)
            keys = self._shares.get(runner, {}) if runner is not None else {}
            return self._takeable(future, set(keys))

    def _share(self, runner: Future) -> None:
        """A read of several keys ended: each key's future gets its value (none when a
        needed read took its keys over and it was cancelled)."""
        with self._cv:
            futures = self._shares.pop(runner, {})
            for future in futures.values():
                if self._alias.get(future) is runner:
                    del self._alias[future]
        if runner.cancelled():
            _cancel(list(futures.values()))
            return
        error = runner.exception()
        values = {} if error is not None else (runner.result() or {})
        for key, future in futures.items():
            value = error if error is not None else values.get(key)
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)

    def flight(self, key: Hashable, *, need: bool = False, priority: Priority = 0) -> Future | None:
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

    def promote(self, future: Future, priority: Priority = 0) -> None:
        """A batch now waits on `future`: if it is still queued as read-ahead, it becomes a
        needed read (a waiter on a gated read-ahead would otherwise wait for ever)."""
        with self._cv:
            future = self._alias.get(future, future)  # a key of a read of several
            entry = self._entries.get(future)
            if entry is None or not entry[5] or entry[0] == NEED:
                return
            entry[5] = False
            self._push([NEED, _rank(priority), entry[2], entry[3], future, True, entry[6]])
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

    def cancel(self) -> None:
        """Drop every queued read-ahead (its future is cancelled: waiters wake); those
        already running finish, counted in `bytes_after_cancel`. Safe from a finalizer:
        it waits for no lock (a pool thread drops the reads if the lock is taken)."""
        self.generation = next(self._tickets)
        self._wake()

    def release(self) -> None:
        """The owner is gone (a finalizer calls this): cancel, and idle threads exit."""
        self._closed = True
        self.cancel()

    def close(self, join_s: float = CLOSE_JOIN_S) -> None:
        """Cancel the read-ahead, let idle threads exit now and wait up to `join_s` for
        the reads on the wire (a later submit starts threads again)."""
        self.release()
        self.join(join_s)

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for this pool's threads to exit; whether they did."""
        deadline = time.monotonic() + timeout
        me = threading.current_thread()
        with self._cv:  # a submit on another thread may add one meanwhile (`_grow`)
            threads = [t for t in self._started if t is not me]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)

    def pending(self) -> int:
        """Reads queued or running."""
        with self._cv:
            return sum(1 for e in self._queue if e[5]) + sum(self._running.values())

    def _wake(self) -> None:
        """Prune the queue and wake idle threads, unless the lock is not free at once (it
        may be this very thread's): then a pool thread prunes within IDLE_S."""
        if not self._cv.acquire(timeout=WAKE_S):
            return
        try:
            dropped = self._prune()
            self._cv.notify_all()
        finally:
            self._cv.release()
        _cancel(dropped)

    # -- the threads -----------------------------------------------------------------------
    def _prune(self) -> list[Future]:
        """Take the cancelled reads off the queue (under the lock); their futures are
        cancelled by the caller once it let go of the lock (their callbacks take the
        readers' locks)."""
        generation = self.generation
        if generation == self._pruned and not self._drop_needed:
            return []
        self._pruned = generation
        dropped = []
        for entry in self._queue:
            if entry[5] and entry[6] < generation and (entry[0] == AHEAD or self._drop_needed):
                entry[5] = False
                self._entries.pop(entry[4], None)
                dropped.append(entry[4])
        return dropped

    def _push(self, entry: list[Any]) -> None:
        heapq.heappush(self._queue, entry)
        self._entries[entry[4]] = entry

    def _grow(self) -> None:
        """One more thread if more reads wait than threads do (a thread waiting behind
        needed reads counts as waiting) and the cap allows (under the lock)."""
        self._workers = [t for t in self._workers if t.is_alive()]
        waiting = sum(1 for e in self._queue if e[5])
        if waiting > self._idle and len(self._workers) < self.threads:
            used = {t.name for t in self._workers}
            name = next(f"{self.name}-{i}" for i in range(self.threads + 1)
                        if f"{self.name}-{i}" not in used)  # fmt: skip
            thread = threading.Thread(target=self._work, name=name, daemon=True)
            self._workers.append(thread)
            self._started.add(thread)
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

    def _next(self) -> tuple[list[Any], int] | None:
        """The next read for this thread and the cancel generation it starts in, waiting
        up to IDLE_S for one; None: exit."""
        dropped: list[Future] = []
        try:
            with self._cv:
                while True:
                    dropped += self._prune()
                    entry = self._startable()
                    if entry is not None:
                        self._running[entry[0]] += 1
                        # Read with the read taken: a cancel after it makes this read late.
                        return entry, self.generation
                    queued = any(e[5] for e in self._queue)
                    if not queued and self._closed:
                        break
                    self._idle += 1
                    woken = self._cv.wait(IDLE_S)
                    self._idle -= 1
                    if not woken and not any(e[5] for e in self._queue):
                        break  # idle for IDLE_S with nothing queued
                self._workers = [t for t in self._workers if t is not threading.current_thread()]
                return None
        finally:
            _cancel(dropped)

    def _work(self) -> None:
        while True:
            taken = self._next()
            if taken is None:
                return
            entry, generation = taken
            kind, future = entry[0], entry[4]
            _current.need = kind == NEED
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
            # Nothing of the read kept while idle: its closure may hold a dropped reader.
            del taken, entry, future, deposit


def _rank(priority: Priority) -> tuple[int, int]:
    """(epoch, batch) of a priority; a bare batch number is of epoch 0."""
    return priority if isinstance(priority, tuple) else (0, priority)


def _cancel(futures: list[Future]) -> None:
    """Cancel reads no pool thread will take up, and notify them as cancelled:
    `concurrent.futures.wait` and `as_completed` count a cancelled future done only
    once notified (a pool thread notifies those it takes; these it never will)."""
    for future in futures:
        if future.cancelled() or not future.cancel():
            continue  # cancelled before (notified with it), or running or done
        future.set_running_or_notify_cancel()


def _inline(future: Future, fn: Callable[[], Any], ahead: bool) -> Future:
    """A read asked for after the exit hook ran: read-ahead is refused, a needed read
    runs on the caller's thread."""
    if ahead:
        _cancel([future])
        return future
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
    return future


@atexit.register
def stop_at_exit() -> None:
    """Drop every pool's queued reads and wait (bounded) for those on the wire, before
    the interpreter finalizes: a daemon thread still inside a read then can abort it.
    Registered after the storage helpers' hook, so it runs before it (last in, first)."""
    global _exiting
    _exiting = True
    pools = [p for p in list(_LIVE) if p._pid == os.getpid()]
    for pool in pools:
        pool._drop_needed = True
        pool.release()
    deadline = time.monotonic() + EXIT_JOIN_S
    for pool in pools:
        pool.join(max(0.0, deadline - time.monotonic()))
