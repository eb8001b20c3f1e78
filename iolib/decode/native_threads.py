"""CPU of native threads a library starts for us (DALI's thread pool), so the tuner
sees what a batch really costs: the calling thread's own CPU time misses work done
on a pool, and a tuner that reads that work as storage waiting adds workers that
only fight over the cores.

Linux only (per-thread CPU clocks by thread id); elsewhere nothing is counted.

Example:
    >>> with started_threads("[DALI]") as pool:
    ...     pass                       # build the pipeline here
    >>> before = cpu_seconds(pool.ids)  # names read now: late-named threads count
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_TASKS = "/proc/self/task"
# Builds are serialized so that the threads that appear during one belong to it.
_BUILD_LOCK = threading.Lock()
# A pool's threads name themselves as they start; after this long, a thread not named
# so is another library's, and its name is no longer read (ids is read every batch).
NAMING_S = 5.0


@dataclass
class Started:
    """Native threads that appeared while the block ran, and whose name starts with
    `prefix`. Names are read when `ids` is asked for (for `NAMING_S` after the block),
    not only when the block ends: a pool's threads may not have named themselves yet
    when its build returns (seen on a loaded machine), and a thread counted late beats
    one never counted."""

    prefix: str = ""
    candidates: tuple[int, ...] = ()
    confirmed: set[int] = field(default_factory=set)
    ended: float = 0.0  # time.monotonic() when the block ended

    @property
    def ids(self) -> tuple[int, ...]:
        if len(self.confirmed) < len(self.candidates):
            unnamed = [tid for tid in self.candidates if tid not in self.confirmed]
            self.confirmed.update(tid for tid in unnamed if _named(tid, self.prefix))
            if time.monotonic() - self.ended > NAMING_S:
                self.candidates = tuple(t for t in self.candidates if t in self.confirmed)
        return tuple(tid for tid in self.candidates if tid in self.confirmed)


def _task_ids() -> set[int]:
    try:
        return {int(name) for name in os.listdir(_TASKS)}
    except OSError:
        return set()


def _named(tid: int, prefix: str) -> bool:
    try:
        with open(f"{_TASKS}/{tid}/comm") as comm:
            return comm.read().startswith(prefix)
    except OSError:
        return False


@contextmanager
def started_threads(prefix: str = "") -> Iterator[Started]:
    """Record the native threads started inside the block whose name starts with
    `prefix` (a loader's own threads may start meanwhile: they count themselves)."""
    started = Started(prefix)
    with _BUILD_LOCK:
        before = _task_ids()
        yield started
        started.candidates = tuple(sorted(_task_ids() - before))
        started.ended = time.monotonic()


def _clock(tid: int) -> int:
    # Linux's per-thread scheduler clock: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED).
    return ((~tid) << 3) | 6


def cpu_seconds(ids: tuple[int, ...]) -> float:
    """CPU seconds the threads `ids` used so far (a thread that cannot be read, being
    gone, counts nothing)."""
    total = 0.0
    for tid in ids:
        try:
            total += time.clock_gettime(_clock(tid))
        except (OSError, OverflowError, ValueError):
            continue
    return total
