"""Per-request timeouts: a storage call runs on a helper thread that can be abandoned.

Why a thread: a stuck read inside pyarrow or a C client cannot be interrupted, only
left behind; the caller gets a TimeoutError and retries on a fresh helper.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from iolib.storage.counters import count_helper_cpu

T = TypeVar("T")


class _Helper:
    """One thread that runs a worker's storage calls, so a stuck call can be abandoned.

    Each calling thread keeps its own helper (thread-local), so per-thread state of the
    callee (open Parquet handles) is reused across calls. A helper whose call timed out
    is retired: it exits when that call returns, and the caller gets a fresh helper."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.owner = threading.current_thread()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.retired = False
        self.thread = threading.Thread(target=self._run, name="iolib-io", daemon=True)
        self.thread.start()
        _ALL.add(self)

    def _run(self) -> None:
        while not self.retired:
            try:
                fn, box, done = self.jobs.get(timeout=_HELPER_IDLE_S)
            except queue.Empty:
                if not self.owner.is_alive():  # its worker is gone: so is the helper
                    return
                continue
            if fn is None:
                return
            with _BUSY_LOCK:
                _BUSY.add(self)
            cpu = time.thread_time()
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller, never lost
                box.append((False, exc))
            finally:
                # The caller's stage counts this thread's CPU too (CPU-bound reads).
                box.append(time.thread_time() - cpu)
                with _BUSY_LOCK:
                    _BUSY.discard(self)
            done.set()
            # An idle helper must not keep the last call alive: its closure holds the
            # caller's source, whose caches would outlive the loader that dropped it.
            del fn, box, done

    def alive(self) -> bool:
        return self.pid == os.getpid() and not self.retired and self.thread.is_alive()


_HELPERS = threading.local()
_ALL: weakref.WeakSet[_Helper] = weakref.WeakSet()  # every helper of this process
_BUSY: set[_Helper] = set()  # helpers inside a call (an abandoned stuck one included)
_BUSY_LOCK = threading.Lock()
_EXIT_WAIT_S = 10.0
_exiting = False


def _after_fork() -> None:
    """A forked child has none of the parent's helpers: nothing is busy, and the lock
    a helper held at the fork would stay held."""
    global _BUSY_LOCK
    _BUSY_LOCK = threading.Lock()
    _BUSY.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


@atexit.register
def stop_helpers() -> None:
    """At exit, stop every helper and give calls still running (a timed-out read) a
    bounded time to return. A daemon thread that wakes while the interpreter finalizes
    aborts the process ("terminate called without an active exception"): idle helpers
    wake every _HELPER_IDLE_S, and did so in 3 of 12 runs of a script that exits right
    after an epoch (0 of 12 with the wake-ups off)."""
    global _exiting
    _exiting = True  # calls from now on run inline: no new helper threads
    deadline = time.monotonic() + _EXIT_WAIT_S
    helpers = [h for h in list(_ALL) if h.pid == os.getpid() and h.thread.is_alive()]
    for helper in helpers:
        helper.jobs.put((None, None, None))
    for helper in helpers:
        helper.thread.join(max(0.0, deadline - time.monotonic()))


def live_helper_threads() -> list[threading.Thread]:
    """This process's helper threads still running (what the exit hook must stop)."""
    return [h.thread for h in list(_ALL) if h.pid == os.getpid() and h.thread.is_alive()]


_HELPER_IDLE_S = 0.5  # how often an idle helper checks that its caller still exists


def call_with_timeout(fn: Callable[[], T], timeout_s: float | None, what: str) -> T:
    if timeout_s is None or _exiting:
        return fn()
    helper = getattr(_HELPERS, "helper", None)
    if helper is None or not helper.alive():  # first call, or forked into a new process
        helper = _HELPERS.helper = _Helper()
    box: list[tuple[bool, Any]] = []
    done = threading.Event()
    helper.jobs.put((fn, box, done))
    if not done.wait(timeout_s):
        helper.retired = True
        helper.jobs.put((None, None, None))  # lets it exit once the stuck call returns
        _HELPERS.helper = None
        raise TimeoutError(f"no answer within {timeout_s:g} s (RetryPolicy.timeout_s)")
    (ok, value), cpu = box
    box.clear()  # an error left in it would keep this frame (a cycle, see below)
    count_helper_cpu(cpu)
    if ok:
        return value
    try:
        raise value
    finally:
        del value  # else error -> traceback -> this frame -> error: a cycle kept until GC
