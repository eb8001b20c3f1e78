"""What runs in each worker thread or process, and what it sets up first.

Mirrors torch's worker loop (``torch/utils/data/_utils/worker.py``) where a script can
see it: one intra-op thread per process worker (``torch.set_num_threads(1)``: a forked
child must not use the parent's OpenMP pool, or its first parallel op can deadlock);
torch, ``random`` and numpy seeded once from ``base_seed + worker id``;
``torch.utils.data.get_worker_info()``; a watchdog that ends a process worker whose
parent died; and any error that ends a worker, ``worker_init_fn``'s included, reaches
the consumer with its type, message and traceback (``RemoteError``, after torch's
``ExceptionWrapper``).

``fn(task)`` returns its errors as results (see fetcher.Failure); whatever escapes it
anyway (``SystemExit``, ``KeyboardInterrupt``, a bug) ends the worker and is reported
as a ``Fatal``.
"""

from __future__ import annotations

import os
import queue
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iolib.errors import WorkerDied, WorkerError

WATCH_S = 1.0  # how often a process worker idle on its queue checks that its parent lives
LINGER_S = 30.0  # how long a failed process worker waits to be stopped before it exits


_WORKER_STREAM = 0x574F524B45  # "WORKE": a stream of its own, apart from rng's


def worker_base_seed(seed: int) -> int:
    """The base of a loader's worker seeds (``get_worker_info().seed`` is base + id): a
    pure function of the loader's seed, where torch draws it from its generator.

    >>> worker_base_seed(0) == worker_base_seed(0) != worker_base_seed(1)
    True
    """
    import numpy as np

    words = np.random.SeedSequence([_WORKER_STREAM, seed]).generate_state(2, np.uint32)
    return (int(words[0]) << 30) | (int(words[1]) >> 2)  # 62 bits: base + id fits int64


class Stop:
    """Sentinel asking one worker thread to exit."""


class Ready:
    """A worker thread ran its worker_init_fn: nothing the epoch's end waits for."""


RETIRE = "retire"  # asks a process worker to retire once it has sent what it holds
CANCEL = "cancel"  # the pass was left: a process worker drops its source's queued reads


@dataclass(frozen=True)
class Retired:
    """A retiring process worker has sent its last result; it exits on the next None.
    It must not exit before: torch hands a tensor over by a file descriptor that the
    receiver fetches from the sender while unpickling, so a result whose sender has
    exited is lost."""

    wid: int


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker needs to know about itself: torch's WorkerInfo fields."""

    wid: int
    num_workers: int
    base_seed: int
    dataset: Any = None

    @property
    def seed(self) -> int:
        return self.base_seed + self.wid  # torch's rule: a pure function of (seed, id)


def _importable(kind: type) -> bool:
    """Whether pickle can send `kind` by reference (a module-level class)."""
    target: Any = sys.modules.get(kind.__module__)
    for part in kind.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is kind


class RemoteError:
    """An exception that ended a worker, sent to the consumer and rebuilt there.

    Keeps its type (by reference, when pickle can send it), message and traceback
    text; the live exception only within one process (thread workers)."""

    def __init__(self, exc: BaseException, where: str) -> None:
        self.exc_type: type | None = type(exc)
        self.type_name = type(exc).__name__
        self.fatal = not isinstance(exc, Exception)  # SystemExit, KeyboardInterrupt...
        self.message = str(exc)
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.where = where
        self.exception: BaseException | None = exc

    def __getstate__(self) -> dict[str, Any]:
        kind = self.exc_type
        keep = kind if kind is not None and _importable(kind) else None
        return {**self.__dict__, "exc_type": keep, "exception": None}

    def rebuild(self) -> BaseException:
        """The exception to raise in the consumer: the worker's own type with the message
        and the original traceback where it can be built from one message (as torch's
        ExceptionWrapper.reraise does); else WorkerError. What is not an Exception
        (SystemExit, KeyboardInterrupt) killed the worker: WorkerDied, never re-raised
        as itself, so the trainer is not exited or interrupted by it."""
        text = f"Caught {self.type_name} {self.where}.\nOriginal {self.traceback}"
        kind = self.exc_type
        if self.fatal:
            died = WorkerDied(
                f"The {self.where[3:]} died of {self.type_name}: "
                f"{self.message or '(no message)'}.\nOriginal {self.traceback}",
                stage="worker",
            )
            died.__cause__ = self.exception
            return died
        built: BaseException
        if kind is None:  # a type pickle could not send (a local class)
            built = WorkerError(text, stage="worker")
        elif kind is KeyError:
            from torch._utils import KeyErrorMessage

            built = KeyError(KeyErrorMessage(text))
        else:
            try:
                built = kind(text)
            except Exception:
                built = WorkerError(text, stage="worker")
        built.__cause__ = self.exception
        return built


@dataclass
class Fatal:
    """A worker ended: which one, and what ended it."""

    wid: int
    error: RemoteError


def give_back_heap() -> None:
    """After each task: the C heap's free pages back to the OS where they piled up past
    decode/heap.py's guard (``trim_heap``). Row groups, segments and batches are freed
    on other threads than the ones that made them, so glibc's arenas keep them, and an
    epoch's next row group is built beside them; the heap is looked at once every
    ``TRIM_CHECK_S`` at most, not after every task (a look takes arena locks)."""
    from iolib.decode.heap import TRIM_CHECK_S, TRIM_GROWTH, trim_heap

    trim_heap(TRIM_GROWTH, TRIM_CHECK_S)


def _where(kind: str, wid: int, stage: str) -> str:
    return f"in iolib worker {kind} {wid} ({stage})"


# -- get_worker_info in threads ------------------------------------------------------
_local = threading.local()
_patch_lock = threading.Lock()


def _thread_info(default: Any) -> Any:
    info = getattr(_local, "info", None)
    if info is None:
        return default
    # torch's default_collate stacks into shared memory when it finds worker info, to
    # pass the batch to another process. A thread's batch stays here: shared memory
    # would hold a file descriptor per batch and fill a container's small /dev/shm.
    try:
        caller = sys._getframe(2).f_globals.get("__name__")
    except ValueError:  # called from the bottom of a stack: not from collate
        return info
    return None if caller == "torch.utils.data._utils.collate" else info


def _lookup_code() -> Any:
    def get_worker_info():  # type: ignore[no-untyped-def]  # runs with torch's globals
        return _iolib_thread_info(_worker_info)  # noqa: F821

    return get_worker_info.__code__


def install_thread_worker_info() -> None:
    """Make ``torch.utils.data.get_worker_info()`` see thread workers' info.

    torch's function returns its module global ``_worker_info``: one value per process,
    which cannot tell threads apart. Its code is replaced (once, when the first thread
    worker starts) by a lookup that returns this thread's info where a thread worker set
    one, else the global exactly as before. Replacing the code, not the name, reaches
    every reference, ``from torch.utils.data import get_worker_info`` made earlier too."""
    import torch.utils.data._utils.worker as torch_worker

    with _patch_lock:
        if getattr(torch_worker, "_iolib_thread_info", None) is not None:
            return
        torch_worker._iolib_thread_info = _thread_info  # type: ignore[attr-defined]
        torch_worker.get_worker_info.__code__ = _lookup_code()


def _thread_worker_info(setup: WorkerSetup) -> Any:
    import numpy as np
    import torch
    from torch.utils.data._utils.worker import WorkerInfo

    seed = setup.seed
    try:
        from torch.utils.data._utils.worker import _RNG

        rng = _RNG(
            random.Random(seed), torch.Generator().manual_seed(seed), np.random.default_rng(seed)
        )
        return WorkerInfo(
            id=setup.wid,
            num_workers=setup.num_workers,
            seed=seed,
            dataset=setup.dataset,
            rng=rng,
            worker_method="thread",
        )
    except (ImportError, TypeError):  # an older torch: no per-thread fields
        return WorkerInfo(
            id=setup.wid, num_workers=setup.num_workers, seed=seed, dataset=setup.dataset
        )


def thread_worker(
    setup: WorkerSetup,
    fn: Callable[[Any], Any],
    todo: queue.Queue,
    deliver: Callable[[int, int, Any], None],
    report: Callable[[Any], None],
    init: Callable[[int], None] | None,
) -> None:
    """A worker thread: takes (generation, number, task), delivers fn(task). Whatever
    ends it other than a Stop is reported, so the consumer raises instead of waiting."""
    stage = "worker_init_fn"
    try:
        from iolib.decode.heap import tune_heap

        tune_heap()  # before the reads' threads allocate: see decode/heap.py
        _local.info = _thread_worker_info(setup)
        if init is not None:
            init(setup.wid)
        report(Ready())
        stage = "running a task"
        while True:
            item = todo.get()
            if isinstance(item, Stop):
                report(item)
                return
            generation, number, task = item
            deliver(generation, number, fn(task))
            del item, task
            give_back_heap()
    except BaseException as exc:  # any death is reported, never hangs
        report(Fatal(setup.wid, RemoteError(exc, _where("thread", setup.wid, stage))))
    finally:
        _local.info = None


# -- process workers ------------------------------------------------------------------
def _setup_process(setup: WorkerSetup) -> None:
    """What torch's worker loop does before its first task."""
    import numpy as np
    import torch
    import torch.utils.data._utils.worker as torch_worker
    from torch.utils.data._utils import signal_handling

    signal_handling._set_worker_signal_handlers()
    seed = setup.seed
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(torch_worker._generate_state(setup.base_seed, setup.wid))
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=setup.wid, num_workers=setup.num_workers, seed=seed, dataset=setup.dataset
    )


def process_worker(
    setup: WorkerSetup,
    fn: Callable[[Any], Any],
    todo: Any,
    done: Any,
    init: Callable[[int], None] | None,
    stopping: Any,
    left: Any = None,
) -> None:
    """A worker process: like thread_worker, and exits within WATCH_S of its parent's
    death (torch's ManagerWatchdog: the orphan is re-parented, getppid() changes),
    also from inside a task that never returns.
    Once `stopping` (an Event) is set it runs no more tasks (torch's done_event); a
    task of a generation up to `left` (a Value) was left with its pass: skipped."""
    import torch

    # The parent as this process sees it, read here as torch's watchdog does: under
    # forkserver it is the fork server (which exits with the trainer), not the trainer.
    parent = os.getppid()

    def orphaned() -> None:
        # Between tasks the loop below notices; a task that never returns (a read
        # stuck on storage) would keep the orphan alive, so a thread watches too. It
        # never waits on `stopping`: a multiprocessing Condition's set() waits for its
        # sleepers to wake, and a sleeper in an exited process never does.
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os._exit(1)

    threading.Thread(target=orphaned, name="iolib-watchdog", daemon=True).start()

    # First, before any torch op: one intra-op thread, as in torch's worker loop.
    torch.set_num_threads(1)
    from iolib.decode.heap import tune_heap

    tune_heap()  # before this worker's threads allocate: see decode/heap.py
    report_unsendable(done, fn, setup.wid)
    stage = "worker_init_fn"
    try:
        _setup_process(setup)
        if init is not None:
            init(setup.wid)
        stage = "running a task"
        while os.getppid() == parent and not stopping.is_set():
            try:
                item = todo.get(timeout=WATCH_S)
            except queue.Empty:
                continue
            if item is None or stopping.is_set():
                break
            if item == CANCEL:
                cancel = getattr(getattr(fn, "source", None), "cancel_reads", None)
                if cancel is not None:
                    cancel()
                continue
            if isinstance(item, str):  # RETIRE
                done.put(Retired(setup.wid))
                continue
            generation, number, task = item
            if left is not None and generation <= left.value:
                continue  # its pass was left (`Engine.cancel`): nobody waits for it
            done.put((generation, number, fn(task)))
            del item, task
            give_back_heap()
        if stopping.is_set() or os.getppid() != parent:
            # Nobody will read what is not sent yet: do not wait at exit to flush it.
            done.cancel_join_thread()
    except BaseException as exc:
        done.put(Fatal(setup.wid, RemoteError(exc, _where("process", setup.wid, stage))))
        _linger(todo, stopping, parent)
        sys.exit(1)  # an exit code, and no traceback printed by multiprocessing


def unpicklable_part(value: Any, path: str = "batch", depth: int = 0) -> tuple[str, type]:
    """Where in `value` pickling fails: the deepest container path and the type there
    (e.g. ("batch['meta'][0]", _thread.lock)), or (`path`, type(value)) at the top."""
    from multiprocessing.reduction import ForkingPickler

    if depth < 8:
        if isinstance(value, dict):
            items: Any = ((f"{path}[{k!r}]", v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
        else:
            items = ()
        for where, item in items:
            try:
                ForkingPickler.dumps(item)
            except Exception:
                return unpicklable_part(item, where, depth + 1)
    return path, type(value)


def unsendable_text(exc: BaseException, result: Any) -> str:
    """Why a worker's result could not be sent, naming the type that cannot be pickled."""
    where, kind = unpicklable_part(getattr(result, "batch", result))  # a fetcher's Fetched
    name = f"{kind.__module__}.{kind.__qualname__}"
    return (
        f"The batch could not be sent from the process worker to the main process: "
        f"{where} is a {name}, which cannot be pickled ({type(exc).__name__}: {exc}). "
        "Make collate_fn (or the Dataset) return tensors, numpy arrays or other picklable "
        "values, or use worker_mode='thread' (threads send nothing)."
    )


def report_unsendable(done: Any, fn: Callable[[Any], Any], wid: int) -> None:
    """A result the queue cannot pickle is reported, not dropped: multiprocessing's
    feeder thread would print the error and send nothing, and the consumer would wait
    for that batch forever (torch's loader hangs so). `fn.unsendable(text)` makes the
    error result where it can (a fetcher's Failure); otherwise the worker reports a
    WorkerError as its death. Uses the queue's hook for this (the one concurrent.futures
    overrides), so a result that pickles costs nothing more."""

    def on_error(exc: BaseException, message: Any) -> None:
        if not (isinstance(message, tuple) and len(message) == 3):
            return  # not a result (Fatal, Retired): nothing more to send
        generation, number, result = message
        text = unsendable_text(exc, result)
        make = getattr(fn, "unsendable", None)
        if make is not None:
            done.put((generation, number, make(text)))
        else:
            error = WorkerError(text, stage="send", batch=number)
            done.put(Fatal(wid, RemoteError(error, _where("process", wid, "sending"))))

    done._on_queue_feeder_error = on_error


def _linger(todo: Any, stopping: Any, parent: int) -> None:
    """Stay until the parent stops this worker (as torch's worker stays after a failed
    worker_init_fn), so the parent learns of the failure from the message, not from an
    exit that can overtake it; bounded, so a message lost in sending still ends in an
    exit the parent reports."""
    end = time.monotonic() + LINGER_S
    while os.getppid() == parent and not stopping.is_set() and time.monotonic() < end:
        try:
            if todo.get(timeout=WATCH_S) is None:
                return
        except queue.Empty:
            continue
        except (OSError, EOFError, ValueError, KeyboardInterrupt):
            return  # the parent closed the queue, or a second Ctrl-C: exit now
