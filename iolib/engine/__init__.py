"""How fast: a worker pool, a reorder buffer and a bounded prefetch depth.

The consumer's ``next()`` tops the pipeline up to ``depth`` batches (submitted but not
yet handed over), then waits for batch ``k``. Workers finish in any order; results wait
in a reorder buffer keyed by batch number, so one slow worker never blocks the others'
finished work from being buffered, and batches still come out in plan order. The
content of batch ``k`` depends only on its task, so ``depth`` and the worker count can
change while iterating: that changes pace and memory, never content.

Workers are threads by default (pyarrow, fsspec and DALI release the GIL), started
lazily: no more than there are batches in flight. Process workers serve GIL-bound Python
datasets; each has its own task queue (round-robin) so a worker that dies is known by the
batches it held, and is reported rather than waited on. A reader thread moves process
results into the reorder buffer as they land and wakes the consumer when a worker exits.
What runs inside a worker (torch's hygiene, get_worker_info, errors) is in workers.py.

Lifecycle: the workers, the reader and the finalizer share a ``Pool``, never the engine,
so an engine dropped without ``close()`` is freed by reference counting and its finalizer
(``multiprocessing.util.Finalize``: also at exit, also in a child process) stops them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.util import Finalize
from typing import Any, Literal

from iolib.base.shutdown import register_stopper
from iolib.engine.pool import Pool, drain, read_results
from iolib.engine.workers import (
    CANCEL,
    RETIRE,
    Stop,
    WorkerSetup,
    install_thread_worker_info,
    process_worker,
    thread_worker,
)
from iolib.errors import ConfigError, WorkerDied, WorkerError, require_non_negative_int

WorkerMode = Literal["thread", "process"]
# How often a waiting consumer checks for dead workers and its timeout when nothing
# wakes it: results and worker deaths wake it at once (pool.read_results).
_POLL_S = 0.05
_GRACE_S = 2.0  # how long a dead process's last messages may take to be read


class Engine:
    """Runs ``fn(task)`` for each task of an epoch on workers; yields results in order.

    ``fn`` must not raise: it returns its result or an error object (see fetcher.Failure);
    the engine only moves results. ``workers=0`` runs tasks inline in ``next()``.

    ``worker_info_dataset`` and ``base_seed`` fill ``get_worker_info()`` in the workers
    (its ``dataset`` and ``seed = base_seed + worker id``); process workers also seed
    torch, ``random`` and numpy from them once, as torch's workers do.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        *,
        workers: int,
        depth: int,
        mode: WorkerMode = "thread",
        mp_context: Any = None,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        sizeof: Callable[[Any], int] = lambda result: 0,
        worker_info_dataset: Any = None,
        base_seed: int = 0,
    ) -> None:
        require_non_negative_int("num_workers", workers)
        require_non_negative_int("base_seed", base_seed)
        if mode not in ("thread", "process"):
            raise ConfigError(f"`worker_mode` must be 'thread' or 'process'. Found: {mode!r}.")
        self.fn, self.mode, self.timeout = fn, mode, timeout
        self.mp_context, self.worker_init_fn = mp_context, worker_init_fn
        self.worker_info_dataset, self.base_seed = worker_info_dataset, base_seed
        self._depth = max(1, depth)
        self._target_workers = workers
        self._tasks: Sequence[Any] = ()
        # Batch numbers count on across sequences joined by `follow`: the current sequence
        # holds numbers base .. base + len(tasks) - 1, the following one the next ones.
        self._base = self._submitted = self._next = 0
        self._make_following: Callable[[], Sequence[Any]] | None = None
        self._following: Sequence[Any] | None = None
        self._rr = 0
        self._started = False
        self._pool = Pool(sizeof)
        # Stops the workers when the engine is dropped without close(), and at exit
        # before multiprocessing terminates daemon children: also in a child process
        # (multiprocessing.Process), where atexit handlers never run.
        self._finalizer = Finalize(self, self._pool.shutdown, exitpriority=10)
        _LIVE.add(self._pool)

    # -- knobs ---------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return self._depth

    @property
    def workers(self) -> int:
        return self._target_workers

    @property
    def _closed(self) -> bool:
        return self._pool.closed

    def worker_pids(self) -> list[int]:
        """The pids of the process workers alive now, by worker slot (for `stats()`: a
        script or a test can watch or signal them)."""
        with self._pool.cv:
            procs = [entry[0] for entry in self._pool.procs]
        return [proc.pid for proc in procs if proc.is_alive()]

    def worker_threads(self) -> list[int]:
        """The native ids of the worker threads alive now (for `stats()`)."""
        with self._pool.cv:
            threads = list(self._pool.threads)
        return [t.native_id for t in threads if t.is_alive() and t.native_id is not None]

    def set_depth(self, depth: int) -> None:
        """Change how many batches may be in flight or ready; takes effect at once."""
        self._depth = max(1, int(depth))

    def set_workers(self, workers: int) -> None:
        """Grow or shrink the pool while iterating (not to or from 0)."""
        workers = max(1, int(workers)) if self._target_workers else 0
        self._target_workers = workers
        if self._started:
            self._resize()

    def bytes_in_flight(self) -> int:
        """Bytes held by finished batches waiting in the reorder buffer."""
        with self._pool.cv:
            return sum(self._pool.ready_bytes.values())

    def batches_ready(self) -> int:
        with self._pool.cv:
            return len(self._pool.ready)

    # -- epochs --------------------------------------------------------------------------
    def start(self, tasks: Sequence[Any]) -> None:
        """Begin a new sequence of tasks; results of an abandoned one are discarded."""
        if self._closed:
            raise RuntimeError("engine is closed")
        pool = self._pool
        with pool.cv:
            pool.generation += 1
            pool.ready.clear()
            pool.ready_bytes.clear()
            pool.held.clear()
        self._drain_todo()
        self._tasks, self._base, self._submitted, self._next = tasks, 0, 0, 0
        self._rr = 0  # each pass starts at worker 0, as torch's iterator does
        self._make_following = self._following = None
        if self._target_workers and not self._started:
            self._started = True
            self._resize()

    def cancel(self) -> None:
        """The pass was left (a `break`, an iterator dropped): the tasks no worker took
        yet are dropped, and process workers drop their source's queued reads. Only a
        new sequence (`start`) follows: this one's dropped tasks never come. Does
        nothing in a process that inherited this engine by fork (its parent's workers)."""
        if os.getpid() != self._pool.pid:
            return
        self._drain_todo()
        self._make_following = self._following = None
        if self.mode == "process" and self._pool.left is not None:
            self._pool.left.value = self._pool.generation
            for _proc, todo, retiring in self._pool.procs:
                if not retiring:
                    todo.put(CANCEL)

    def follow(self, make_tasks: Callable[[], Sequence[Any]]) -> None:
        """Queue the sequence that comes next (the next epoch): once every task of this
        one is submitted, `make_tasks()` is called and its tasks are submitted too, so its
        first batches are ready when it starts (`advance`) instead of being awaited
        behind an empty pipeline."""
        self._make_following, self._following = make_tasks, None

    def advance(self) -> Sequence[Any]:
        """Make the followed sequence current, keeping what was already read of it;
        call once this one is consumed. Returns its tasks."""
        if self._next < self._base + len(self._tasks) or self._make_following is None:
            raise RuntimeError("advance() needs a followed sequence and this one consumed")
        following = self._following
        if following is None:
            following = self._make_following()
        self._base += len(self._tasks)
        self._tasks, self._make_following, self._following = following, None, None
        return following

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def consumed(self) -> bool:
        """Every result of the current sequence was taken (`advance` may follow)."""
        return self._next >= self._base + len(self._tasks)

    def _task(self, number: int) -> Any:
        """The task numbered `number`: of this sequence, else of the followed one."""
        k = number - self._base
        if k < len(self._tasks):
            return self._tasks[k]
        assert self._following is not None  # _top_up made it before submitting from it
        return self._following[k - len(self._tasks)]

    def _submittable(self) -> int:
        """How many numbers exist to submit: this sequence's, and the followed one's."""
        end = self._base + len(self._tasks)
        if self._submitted >= end and self._make_following is not None:
            if self._following is None:
                self._following = self._make_following()
            end += len(self._following)
        return end

    def next(self) -> tuple[Any, float]:
        """The next result in order and the seconds the consumer waited for it."""
        begin = time.perf_counter()
        result = self.take()
        return result, time.perf_counter() - begin

    def take(self) -> Any:
        """The next result in order; StopIteration after the sequence's last."""
        k = self._next - self._base
        tasks = self._tasks
        if not self._target_workers:
            # Inline: the task runs here, in order, and nothing is read ahead (no follow).
            if k >= len(tasks):
                raise StopIteration
            result = self.fn(tasks[k])
            self._next += 1
            return result
        if k >= len(tasks):
            self._check_inits()
            raise StopIteration
        self._top_up()
        result = self._wait_for(self._next)
        self._next += 1
        self._top_up()
        return result

    def _check_inits(self) -> None:
        """A worker_init_fn that failed while the other threads did all the work still
        fails the epoch, as in torch (where every worker inits before its batches)."""
        pool = self._pool
        if self.mode != "thread":
            return
        deadline = time.monotonic() + self.timeout if self.timeout > 0 else None
        with pool.cv:
            while (
                pool.inits_pending > 0
                and pool.fatal is None
                and any(t.is_alive() for t in pool.threads)
            ):
                left = _POLL_S if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    raise WorkerError(
                        f"DataLoader timed out after {self.timeout:g} seconds (`timeout`) "
                        "waiting for a worker's worker_init_fn to finish at the epoch's end.",
                        stage="wait",
                    )
                pool.cv.wait(min(left, _POLL_S))
            if pool.fatal is not None:
                raise pool.fatal.error.rebuild()

    def _top_up(self) -> None:
        pool = self._pool
        while self._submitted - self._next < self._depth:
            if self._submitted >= self._submittable():
                break
            number = self._submitted
            item = (pool.generation, number, self._task(number))
            if self.mode == "thread":
                pool.todo.put(item)
            else:
                slot = self._pick_process()
                with pool.cv:
                    pool.held[number] = slot
                pool.procs[slot][1].put(item)
            self._submitted += 1
        if self.mode == "thread":
            self._grow_threads()

    def _wait_for(self, number: int) -> Any:
        pool = self._pool
        shown = number - self._base  # the batch's number within its epoch
        deadline = time.monotonic() + self.timeout if self.timeout > 0 else None
        while True:
            with pool.cv:
                if pool.closed:
                    raise RuntimeError(
                        f"The loader's workers were stopped while batch {shown} was awaited."
                    )
                if pool.fatal is not None:  # a dead worker fails the epoch as soon as known
                    raise pool.fatal.error.rebuild()
                if number in pool.ready:
                    pool.ready_bytes.pop(number)
                    return pool.ready.pop(number)
                left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
                if left > 0:
                    pool.cv.wait(left)  # a result, a worker's death or a Stop wakes it
                if number in pool.ready or pool.fatal is not None:
                    continue
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerError(
                    f"DataLoader timed out after {self.timeout:g} seconds (`timeout`) waiting "
                    f"for batch {shown}; {len(pool.ready)} later batches were ready.",
                    stage="wait",
                    batch=shown,
                )
            if self.mode == "process":
                self._check_processes()

    def _setup(self, wid: int) -> WorkerSetup:
        return WorkerSetup(wid, self._target_workers, self.base_seed, self.worker_info_dataset)

    # -- threads -------------------------------------------------------------------------
    def _resize(self) -> None:
        if self.mode == "process":
            self._resize_processes()
            return
        install_thread_worker_info()
        pool = self._pool
        with pool.cv:
            working = sum(t.is_alive() for t in pool.threads) - pool.stops_pending
            surplus = working - self._target_workers
            pool.stops_pending += max(0, surplus)
        for _ in range(surplus):
            pool.todo.put(Stop())  # an idle worker takes it and exits
        self._grow_threads()

    def _grow_threads(self) -> None:
        """Start threads lazily: no more than there are batches in flight (at most
        `depth`), so a large worker count costs nothing until there is work for it."""
        pool = self._pool
        want = min(self._target_workers, self._submitted - self._next)
        with pool.cv:
            pool.threads = [t for t in pool.threads if t.is_alive()]
            working = len(pool.threads) - pool.stops_pending
        for _ in range(want - working):
            # The smallest id no live thread has: ids stay 0 .. workers - 1 as in torch
            # (a thread that took a Stop may still hold its id a moment).
            taken = {getattr(t, "iolib_wid", -1) for t in pool.threads}
            wid = next(i for i in range(len(taken) + 1) if i not in taken)
            setup = self._setup(wid)
            thread = threading.Thread(
                target=thread_worker,
                args=(setup, self.fn, pool.todo, pool.deliver, pool.report, self.worker_init_fn),
                name=f"iolib-worker-{wid}",
                daemon=True,
            )
            thread.iolib_wid = wid  # type: ignore[attr-defined]
            with pool.cv:
                pool.inits_pending += 1
            thread.start()
            with pool.cv:
                pool.threads.append(thread)

    def _drain_todo(self) -> None:
        pool = self._pool
        stops = 0
        while True:
            try:
                item = pool.todo.get_nowait()
            except queue.Empty:
                break
            stops += isinstance(item, Stop)
        for _ in range(stops):
            pool.todo.put(Stop())
        for proc in pool.procs:
            drain(proc[1])

    # -- processes -----------------------------------------------------------------------
    def _context(self) -> Any:
        import torch.multiprocessing as mp

        if self.mp_context is None or isinstance(self.mp_context, str):
            return mp.get_context(self.mp_context)
        return self.mp_context

    def _resize_processes(self) -> None:
        pool, ctx = self._pool, self._context()
        if pool.done_q is None:
            pool.done_q = ctx.Queue()
            # Results left unread at exit are worthless: never block an exit on them.
            pool.done_q.cancel_join_thread()
            pool.stopping = ctx.Event()
            pool.left = ctx.Value("q", -1)
            pool.reader = threading.Thread(
                target=read_results, args=(pool, pool.done_q), name="iolib-results", daemon=True
            )
            pool.reader.start()
        active = [p for p in pool.procs if not p[2]]
        for wid in range(len(active), self._target_workers):
            todo = ctx.Queue()
            todo.cancel_join_thread()  # tasks for a worker that is gone: drop them at exit
            slot = len(pool.procs)
            setup = WorkerSetup(
                slot, self._target_workers, self.base_seed, self.worker_info_dataset
            )
            proc = ctx.Process(
                target=process_worker,
                args=(
                    setup,
                    self.fn,
                    todo,
                    pool.done_q,
                    self.worker_init_fn,
                    pool.stopping,
                    pool.left,
                ),
                name=f"iolib-worker-{wid}",
                daemon=True,
            )
            try:
                proc.start()
            except (TypeError, AttributeError, pickle.PicklingError):
                # torch's warning, word for word: spawn and forkserver pickle the dataset
                # and worker_init_fn (a lambda or a local function cannot be).
                warnings.warn(
                    "Got pickle error when attempting to start a worker Process. This might "
                    "be because the worker Process arguments are not picklable (the dataset, "
                    "collate_fn, worker_init_fn): spawn and forkserver start methods need "
                    "them picklable. You can also try multiprocessing.set_start_method('fork').",
                    stacklevel=2,
                )
                raise
            with pool.cv:
                pool.procs.append([proc, todo, False])
            active.append(pool.procs[-1])
        for entry in active[self._target_workers :]:
            entry[2] = True  # retiring: no new tasks; it exits after the ones it holds
            entry[1].put(RETIRE)

    def _pick_process(self) -> int:
        slots = [i for i, p in enumerate(self._pool.procs) if not p[2]]
        slot = slots[self._rr % len(slots)]  # batch k to worker k mod n, as torch cycles
        self._rr += 1
        return slot

    def _settle(self) -> None:
        """Let the reader deliver what a dead worker sent before it died (its result, or
        the error that ended it), so the consumer reports that and not a bare exit code."""
        pool, end = self._pool, time.monotonic() + _GRACE_S
        while time.monotonic() < end and pool.fatal is None:
            with contextlib.suppress(OSError, ValueError):
                if not pool.reading and not pool.done_q._reader.poll(0):
                    return
            with pool.cv:
                pool.cv.wait(0.01)

    def _check_processes(self) -> None:
        pool = self._pool
        with pool.cv:
            holding = set(pool.held.values())
        # A retired worker that exited after its last batch is no news.
        if all(
            proc.is_alive() or (retiring and slot not in holding and proc.exitcode == 0)
            for slot, (proc, _, retiring) in enumerate(pool.procs)
        ):
            return
        self._settle()
        with pool.cv:
            if pool.fatal is not None:
                raise pool.fatal.error.rebuild()
            held = dict(pool.held)
        for slot, (proc, _, _) in enumerate(pool.procs):
            lost = sorted(n for n, s in held.items() if s == slot)
            if lost and not proc.is_alive():
                raise WorkerDied(
                    f"Process worker {proc.name} (pid {proc.pid}) exited with code "
                    f"{proc.exitcode} while holding batches {lost}. A negative code is "
                    "the signal that killed it (e.g. -9: out of memory or SIGKILL).",
                    stage="worker",
                    batch=lost[0],
                )
        for proc, _, retiring in pool.procs:
            # A worker killed while sending a result can hold the queue's lock and block
            # the others with no batch of its own: any abnormal exit is reported.
            if not retiring and not proc.is_alive() and proc.exitcode not in (0, None):
                raise WorkerDied(
                    f"Process worker {proc.name} (pid {proc.pid}) exited with code "
                    f"{proc.exitcode}. A negative code is the signal that killed it "
                    "(e.g. -9: out of memory or SIGKILL).",
                    stage="worker",
                    batch=self._next - self._base,
                )

    # -- shutdown ------------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Stop every worker and join every thread and process it started; never blocks
        longer than about `timeout` seconds. Does nothing in a process that inherited
        this engine by fork (those workers are its parent's children)."""
        if os.getpid() != self._pool.pid:
            return
        self._pool.shutdown(timeout)
        self._finalizer.cancel()


_LIVE: weakref.WeakSet[Pool] = weakref.WeakSet()  # pools whose engines may still run


def close_live_engines(timeout: float = 5.0) -> None:
    """Stop every engine's workers now (e.g. at exit, before a library's own exit hook
    finds their threads still running)."""
    for pool in list(_LIVE):
        with contextlib.suppress(Exception):
            pool.shutdown(timeout)


register_stopper(close_live_engines)
