"""How fast: a worker pool, a reorder buffer and a bounded prefetch depth.

The consumer's ``next()`` tops the pipeline up to ``depth`` batches (submitted but not
yet handed over), then waits for batch ``k``. Workers finish in any order; results wait
in a reorder buffer keyed by batch number, so one slow worker never blocks the others'
finished work from being buffered, and batches still come out in plan order. The
content of batch ``k`` depends only on its task, so ``depth`` and the worker count can
change while iterating: that changes pace and memory, never content.

Workers are threads by default (pyarrow, fsspec and DALI release the GIL). Process
workers serve GIL-bound Python datasets; each has its own task queue (round-robin) so a
worker that dies is known by the batches it held, and is reported rather than waited on.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

from iolib.errors import ConfigError, WorkerDied, WorkerError, require_non_negative_int

log = logging.getLogger(__name__)
WorkerMode = Literal["thread", "process"]
_POLL_S = 0.05  # how often a waiting consumer checks for dead workers and timeouts


class _Stop:
    """Sentinel asking one worker to exit."""


def _thread_worker(
    wid: int, fn: Callable, todo: queue.Queue, deliver: Callable, init: Callable | None
) -> None:
    if init is not None:
        init(wid)
    while True:
        item = todo.get()
        if isinstance(item, _Stop):
            return
        generation, number, task = item
        deliver(generation, number, fn(task))


def _process_worker(wid: int, fn: Callable, todo: Any, done: Any, init: Callable | None) -> None:
    if init is not None:
        init(wid)
    while True:
        item = todo.get()
        if item is None:
            return
        generation, number, task = item
        done.put((generation, number, fn(task)))


_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines not closed yet


@atexit.register
def _close_live_engines() -> None:
    """At exit, stop the workers of an epoch left mid-way: a daemon worker thread still
    inside pyarrow while the interpreter finalizes can abort it ("terminate called
    without an active exception"), seen about once in 15 runs of a script that exits
    after saving its state_dict mid-epoch. (pyarrow's own IO threads were the other
    cause: see ParquetSource._read_row_group.)"""
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine.close(timeout=5.0)


class Engine:
    """Runs ``fn(task)`` for each task of an epoch on workers; yields results in order.

    ``fn`` must not raise: it returns its result or an error object (see fetcher.Failure);
    the engine only moves results. ``workers=0`` runs tasks inline in ``next()``.
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
    ) -> None:
        require_non_negative_int("num_workers", workers)
        if mode not in ("thread", "process"):
            raise ConfigError(f"`worker_mode` must be 'thread' or 'process'. Found: {mode!r}.")
        self.fn, self.mode, self.timeout = fn, mode, timeout
        self.mp_context, self.worker_init_fn, self.sizeof = mp_context, worker_init_fn, sizeof
        self._depth = max(1, depth)
        self._target_workers = workers
        self._cv = threading.Condition()
        self._ready: dict[int, Any] = {}  # the reorder buffer: batch number -> result
        self._ready_bytes: dict[int, int] = {}
        self._generation = 0
        self._tasks: Sequence[Any] = ()
        # Batch numbers count on across sequences joined by `follow`: the current sequence
        # holds numbers base .. base + len(tasks) - 1, the following one the next ones.
        self._base = self._submitted = self._next = 0
        self._make_following: Callable[[], Sequence[Any]] | None = None
        self._following: Sequence[Any] | None = None
        self._threads: list[threading.Thread] = []
        self._todo: queue.Queue = queue.Queue()
        self._procs: list[Any] = []  # [process, task queue, retiring]
        self._held: dict[int, int] = {}  # batch number -> process slot (process mode)
        self._done_q: Any = None
        self._rr = 0
        self._closed = False
        _LIVE.add(self)

    # -- knobs ---------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return self._depth

    @property
    def workers(self) -> int:
        return self._target_workers

    def set_depth(self, depth: int) -> None:
        """Change how many batches may be in flight or ready; takes effect at once."""
        self._depth = max(1, int(depth))

    def set_workers(self, workers: int) -> None:
        """Grow or shrink the pool while iterating (not to or from 0)."""
        workers = max(1, int(workers)) if self._target_workers else 0
        self._target_workers = workers
        if self._started:
            self._resize()

    @property
    def _started(self) -> bool:
        return bool(self._threads or self._procs)

    def bytes_in_flight(self) -> int:
        """Bytes held by finished batches waiting in the reorder buffer."""
        with self._cv:
            return sum(self._ready_bytes.values())

    def batches_ready(self) -> int:
        with self._cv:
            return len(self._ready)

    # -- epochs --------------------------------------------------------------------------
    def start(self, tasks: Sequence[Any]) -> None:
        """Begin a new sequence of tasks; results of an abandoned one are discarded."""
        if self._closed:
            raise RuntimeError("engine is closed")
        with self._cv:
            self._generation += 1
            self._ready.clear()
            self._ready_bytes.clear()
            self._held.clear()
        self._drain_todo()
        self._tasks, self._base, self._submitted, self._next = tasks, 0, 0, 0
        self._make_following = self._following = None
        if self._target_workers and not self._started:
            self._resize()

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
        if self._next >= self._base + len(self._tasks):
            raise StopIteration
        begin = time.perf_counter()
        if not self._target_workers:
            result = self.fn(self._task(self._next))
        else:
            self._top_up()
            result = self._wait_for(self._next)
        self._next += 1
        if self._target_workers:
            self._top_up()
        return result, time.perf_counter() - begin

    def _top_up(self) -> None:
        while self._submitted - self._next < self._depth:
            if self._submitted >= self._submittable():
                break
            number = self._submitted
            item = (self._generation, number, self._task(number))
            if self.mode == "thread":
                self._todo.put(item)
            else:
                slot = self._pick_process()
                self._held[number] = slot
                self._procs[slot][1].put(item)
            self._submitted += 1

    def _deliver(self, generation: int, number: int, result: Any) -> None:
        size = self.sizeof(result)
        with self._cv:
            if generation == self._generation:
                self._ready[number] = result
                self._ready_bytes[number] = size
                self._held.pop(number, None)
                self._cv.notify_all()

    def _wait_for(self, number: int) -> Any:
        shown = number - self._base  # the batch's number within its epoch
        deadline = time.monotonic() + self.timeout if self.timeout > 0 else None
        while True:
            if self._closed:
                raise RuntimeError(
                    f"The loader's workers were stopped while batch {shown} was awaited."
                )
            if self.mode == "process":
                self._collect()
            with self._cv:
                if number in self._ready:
                    self._ready_bytes.pop(number)
                    return self._ready.pop(number)
                if self.mode == "thread":
                    self._cv.wait(_POLL_S)
                    if number in self._ready:
                        continue
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerError(
                    f"Timed out after {self.timeout:g} s waiting for batch {shown} "
                    f"(`timeout` argument); {len(self._ready)} later batches were ready.",
                    stage="wait",
                    batch=shown,
                )
            if self.mode == "process":
                self._check_processes()

    # -- threads -------------------------------------------------------------------------
    def _resize(self) -> None:
        if self.mode == "thread":
            alive = [t for t in self._threads if t.is_alive()]
            for wid in range(len(alive), self._target_workers):
                thread = threading.Thread(
                    target=_thread_worker,
                    args=(wid, self.fn, self._todo, self._deliver, self.worker_init_fn),
                    name=f"iolib-worker-{wid}",
                    daemon=True,
                )
                thread.start()
                alive.append(thread)
            for _ in range(len(alive) - self._target_workers):
                self._todo.put(_Stop())  # an idle worker takes it and exits
            self._threads = alive
        else:
            self._resize_processes()

    def _drain_todo(self) -> None:
        stops = 0
        while True:
            try:
                item = self._todo.get_nowait()
            except queue.Empty:
                break
            stops += isinstance(item, _Stop)
        for _ in range(stops):
            self._todo.put(_Stop())
        for proc in self._procs:
            while True:
                try:
                    proc[1].get_nowait()
                except (queue.Empty, OSError, ValueError):
                    break

    # -- processes -----------------------------------------------------------------------
    def _context(self) -> Any:
        import torch.multiprocessing as mp

        if self.mp_context is None or isinstance(self.mp_context, str):
            return mp.get_context(self.mp_context)
        return self.mp_context

    def _resize_processes(self) -> None:
        ctx = self._context()
        if self._done_q is None:
            self._done_q = ctx.Queue()
        active = [p for p in self._procs if not p[2]]
        for wid in range(len(active), self._target_workers):
            todo = ctx.Queue()
            proc = ctx.Process(
                target=_process_worker,
                args=(len(self._procs), self.fn, todo, self._done_q, self.worker_init_fn),
                name=f"iolib-worker-{wid}",
                daemon=True,
            )
            proc.start()
            self._procs.append([proc, todo, False])
            active.append(self._procs[-1])
        for entry in active[self._target_workers :]:
            entry[2] = True  # retiring: no new tasks; it exits after the ones it holds
            entry[1].put(None)

    def _pick_process(self) -> int:
        slots = [i for i, p in enumerate(self._procs) if not p[2]]
        self._rr = (self._rr + 1) % len(slots)
        return slots[self._rr]

    def _collect(self) -> None:
        try:
            generation, number, result = self._done_q.get(timeout=_POLL_S)
        except queue.Empty:
            return
        except (EOFError, ConnectionError, OSError) as exc:
            # A result whose sender died cannot be unpickled (torch passes tensors by file
            # descriptor through the sender); its batch stays held, so the liveness check
            # reports the dead worker.
            log.debug("lost a result from a dead worker: %s", exc)
            return
        self._deliver(generation, number, result)

    def _check_processes(self) -> None:
        with self._cv:
            held = dict(self._held)
        for slot, (proc, _, _) in enumerate(self._procs):
            lost = sorted(n for n, s in held.items() if s == slot)
            if lost and not proc.is_alive():
                self._collect()  # its last result may still be in the pipe
                with self._cv:
                    if any(n in self._held for n in lost):
                        raise WorkerDied(
                            f"Process worker {proc.name} (pid {proc.pid}) exited with code "
                            f"{proc.exitcode} while holding batches {lost}. A negative code is "
                            "the signal that killed it (e.g. -9: out of memory or SIGKILL).",
                            stage="worker",
                            batch=lost[0],
                        )

        for proc, _, retiring in self._procs:
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
        """Stop every worker; never blocks longer than about `timeout` seconds."""
        if self._closed:
            return
        self._closed = True
        with self._cv:
            self._generation += 1
            self._ready.clear()
            self._ready_bytes.clear()
        self._drain_todo()
        for _ in self._threads:
            self._todo.put(_Stop())
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for _proc, todo, retiring in self._procs:
            if not retiring:
                with contextlib.suppress(OSError, ValueError):
                    todo.put(None)
        for proc, todo, _ in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            todo.cancel_join_thread()
            todo.close()
        if self._done_q is not None:
            self._done_q.cancel_join_thread()
            self._done_q.close()
        self._threads, self._procs = [], []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nobody to report to
            self.close(timeout=1.0)
