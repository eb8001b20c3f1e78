"""The state an engine's workers share with it, and the thread that reads process results.

Kept apart from the Engine on purpose: worker threads, the result reader and the
finalizer hold a ``Pool``, never the engine, so an engine dropped without ``close()`` is
freed by reference counting and its finalizer stops the workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from iolib.engine.workers import Fatal, Ready, Retired, Stop

log = logging.getLogger(__name__)
# How often the reader re-checks the workers it waits on (new ones, shutdown).
POLL_S = 0.05


class Pool:
    """What the workers, the result reader and the finalizer share: never the Engine,
    so an engine (and its loader) dropped without close() is collected, and its
    finalizer stops the workers."""

    def __init__(self, sizeof: Callable[[Any], int]) -> None:
        self.pid = os.getpid()  # a fork inherits this object: only its creator stops it
        self.sizeof = sizeof
        self.cv = threading.Condition()
        self.ready: dict[int, Any] = {}  # the reorder buffer: batch number -> result
        self.ready_bytes: dict[int, int] = {}
        self.generation = 0
        self.fatal: Fatal | None = None  # the first worker death, raised by the consumer
        self.threads: list[threading.Thread] = []
        self.stops_pending = 0  # Stop sentinels queued and not yet taken by a thread
        self.inits_pending = 0  # threads started that have not finished worker_init_fn
        self.todo: queue.Queue = queue.Queue()
        self.procs: list[list[Any]] = []  # [process, task queue, retiring]
        self.held: dict[int, int] = {}  # batch number -> process slot (process mode)
        self.done_q: Any = None
        self.stopping: Any = None  # a multiprocessing Event: process workers stop at once
        # A multiprocessing Value: process workers skip tasks of a generation up to it (a
        # pass left: tasks still in their queues' pipes are not wanted).
        self.left: Any = None
        self.reader: threading.Thread | None = None
        self.reading = False  # the reader holds a message it has not delivered yet
        self.closed = False

    def deliver(self, generation: int, number: int, result: Any) -> None:
        size = self.sizeof(result)
        with self.cv:
            if generation == self.generation:
                self.ready[number] = result
                self.ready_bytes[number] = size
                self.held.pop(number, None)
                self.cv.notify_all()

    def report(self, message: Any) -> None:
        """A worker thread ran its worker_init_fn (Ready), took a Stop, or died (Fatal)."""
        with self.cv:
            if isinstance(message, Ready):
                self.inits_pending -= 1
            elif isinstance(message, Stop):
                self.stops_pending -= 1
            elif self.fatal is None:
                self.fatal = message
            self.cv.notify_all()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop every worker and the reader; join what was started. Idempotent; does
        nothing in a process that inherited this pool by fork."""
        if self.closed or os.getpid() != self.pid:
            return
        self.closed = True
        with self.cv:
            self.generation += 1
            self.ready.clear()
            self.ready_bytes.clear()
            self.cv.notify_all()
        drain(self.todo)
        for _ in self.threads:
            self.todo.put(Stop())
        deadline = time.monotonic() + timeout
        if self.stopping is not None:
            self.stopping.set()
        for _proc, todo, _ in self.procs:
            with contextlib.suppress(OSError, ValueError):
                todo.put(None)
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for proc, _, _ in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        if self.reader is not None:  # before closing what it waits on: it sees `closed`
            self.reader.join(max(1.0, deadline - time.monotonic()))
        for proc, todo, _ in self.procs:
            _close_queue(todo)
            with contextlib.suppress(ValueError):
                proc.close()  # its sentinel's file descriptor
        if self.done_q is not None:
            _close_queue(self.done_q)
        self.threads, self.procs, self.reader = [], [], None


def _close_queue(q: Any, timeout: float = 1.0) -> None:
    """Close both ends of a multiprocessing queue's pipe now; its readers are gone.

    Queue.close() leaves that to its feeder thread, once it has written what it holds: a
    feeder blocked on a full pipe that no worker reads any more would never get there,
    so what it holds is dropped and the pipe read empty here first (before close(),
    after which the feeder may close the pipe under a reader). A queue this process
    never put into has no feeder: its pipe stayed open until the queue was collected."""
    feeder = q._thread
    if feeder is not None:
        with q._notempty:
            q._buffer.clear()  # tasks not written yet: nobody will run them
        with contextlib.suppress(OSError, EOFError):
            while q._reader.poll(0.01):
                q._reader.recv_bytes()
    q.close()
    if feeder is None:
        for end in (q._reader, q._writer):
            end.close()
    else:
        feeder.join(timeout)  # it closes both ends once it has taken the close sentinel


def drain(todo: Any) -> None:
    while True:
        try:
            todo.get_nowait()
        except (queue.Empty, OSError, ValueError):
            return


def read_results(pool: Pool, done_q: Any) -> None:
    """The result reader (process mode): delivers each result into the reorder buffer
    as soon as it arrives, and wakes the consumer when a worker process exits, so the
    consumer waits for neither a poll interval nor a liveness check."""
    seen_dead: set[int] = set()
    while not pool.closed:
        with pool.cv:
            procs = [p for p, _, _ in pool.procs]
        sentinels = {p.sentinel: p for p in procs if p.sentinel not in seen_dead}
        try:
            ready = connection.wait([done_q._reader, *sentinels], timeout=POLL_S)
        except (OSError, ValueError):  # closed under us: shutting down
            return
        if any(r is not done_q._reader for r in ready):
            seen_dead.update(r for r in ready if r is not done_q._reader)
            with pool.cv:
                pool.cv.notify_all()
        if done_q._reader not in ready or pool.closed:
            continue
        pool.reading = True
        try:
            message = done_q.get()
            if isinstance(message, Fatal):
                pool.report(message)
            elif isinstance(message, Retired):
                # Every result it sent came before this and has been received (its
                # tensors' file descriptors too, fetched from it while unpickling): it
                # may exit now.
                with contextlib.suppress(OSError, ValueError):
                    pool.procs[message.wid][1].put(None)
            else:
                pool.deliver(*message)
            del message
        except (EOFError, ConnectionError, OSError, ValueError) as exc:
            # A result whose sender died cannot be unpickled (torch passes tensors by file
            # descriptor through the sender); its batch stays held, so the liveness check
            # reports the dead worker.
            log.debug("lost a result from a dead worker: %s", exc)
        finally:
            pool.reading = False
