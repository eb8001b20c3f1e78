"""The running side of a map-style loader: its engine, telemetry and tuner (a `Runner`),
and the iterator a `for batch in loader` loop holds (a `LoaderIterator`).

Why an iterator class, not a generator: torch's iterator stays usable after a batch
raised (the script may catch the error and go on); a generator is finished once it
raised. Why the runner holds no reference to the loader: a dropped loader must be
freed at once, and its workers with it, without waiting for the cycle collector.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from iolib.engine import Engine
from iolib.engine.telemetry import Telemetry
from iolib.fetcher import BatchFetcher, Failure, Fetched, key_list
from iolib.loader.options import Readahead
from iolib.loader.sampling import Cursor, EpochTasks
from iolib.tuning.autotune import AutoPrefetch
from iolib.tuning.run_history import Recorder

TaskMaker = Callable[[int, int], Sequence[Any]]  # (epoch, position) -> tasks

# Where a script meets a difference from torch's DataLoader that iolib keeps by design.
NOTES = {
    "initial_seed": (
        "torch.initial_seed() was called while iolib seeded the global generators for one "
        "sample (inline or in a process worker, where __getitem__ draws from them): it "
        "returned that sample's seed, where torch's DataLoader returns the worker's seed. "
        "Use torch.utils.data.get_worker_info().seed for the worker's seed, or "
        "DataLoader(transform=fn(sample, rng)) for per-sample randomness "
        "(docs/migrating-from-dataloader.md)."
    ),
}


class Runner:
    """Engine, telemetry and tuner for one loader; it outlives iterators when
    `persistent` (torch's persistent_workers), else each iterator releases it."""

    def __init__(
        self,
        fetcher: BatchFetcher,
        *,
        workers: int,
        readahead: Readahead,
        mode: str,
        persistent: bool,
        engine_options: dict[str, Any],
        pin_memory: bool = False,
        pin_memory_device: str = "",
        batch_size: int = 1,
        rank: int = 0,
    ) -> None:
        self.batch_size, self.rank = batch_size, rank
        self.fetcher, self.workers, self.depth, self.mode = fetcher, workers, readahead.depth, mode
        self.persistent, self.engine_options = persistent, engine_options
        self.tuner_spec = readahead.tuner
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.telemetry = Telemetry()
        self.engine: Engine | None = None
        self.autotune: AutoPrefetch | None = None
        self.followed: tuple[int, int] | None = None  # (epoch, position) read ahead
        self.iteration = 0  # identifies the live iterator; older ones are superseded
        self.pass_open = False  # the live iterator has not reached its epoch's end
        self._pin_warned = False
        self._noted: set[str] = set()

    # -- starting ------------------------------------------------------------------------
    def begin(
        self, make_tasks: TaskMaker, cursor: Cursor, *, follow: bool, owner: Any = None
    ) -> LoaderIterator:
        """An iterator over (cursor.epoch, from cursor.position); `follow` reads the next
        epoch's first batches while this one ends (iolib's own order only: a user's
        sampler may be told its epoch by the script after this one ends)."""
        self.iteration += 1
        if self.pass_open:  # the last pass was left mid-epoch: its reads are not wanted
            self.cancel_reads()
        self.pass_open = True
        epoch, position = cursor.epoch, cursor.position
        engine = self._engine()
        # A pass that stopped early moves to the next epoch too: only a consumed one
        # continues into what was read ahead.
        if self.followed == (epoch, position) and engine.consumed:
            tasks = engine.advance()
        else:
            tasks = make_tasks(epoch, position)
            engine.start(tasks)
        self.followed = None
        if follow and self.persistent and engine.workers and isinstance(tasks, EpochTasks):
            engine.follow(lambda: make_tasks(epoch + 1, 0))
            self.followed = (epoch + 1, 0)
        self.telemetry.start_epoch()
        return LoaderIterator(self, self.iteration, engine, tasks, cursor, owner)

    def _engine(self) -> Engine:
        self._start_tuner()
        if self.engine is None:
            self.engine = Engine(
                self.fetcher,
                workers=self.workers,
                depth=self.depth,
                mode=self.mode,  # type: ignore[arg-type]
                sizeof=lambda r: r.nbytes if isinstance(r, Fetched) else 0,
                **self.engine_options,
            )
        return self.engine

    def _start_tuner(self) -> None:
        """Build the tuner on first use (it needs the source's row-group size) and start
        the engine from its safe configuration; `num_workers` is then the most it may use."""
        if self.tuner_spec is None or self.autotune is not None:
            return
        spec, blocks = self.tuner_spec, self.fetcher.source.blocks()
        options = dict(
            batch_size=self.batch_size,
            rows_per_read=int(np.median(blocks)) if blocks else 1,
            max_workers=self.workers or max(2, 2 * spec.cpus),
            memory_budget=spec.memory_budget,
            target=spec.target,
            cpus=spec.cpus,
        )
        if spec.tuner == "auto":
            recorder = Recorder.open(
                spec.history,
                source=self.fetcher.source,
                batch_size=self.batch_size,
                decode=self.fetcher.decode,
                rank=self.rank,
                target=spec.target,
            )
            self.autotune = AutoPrefetch.learned(**options, recorder=recorder)
        else:
            self.autotune = AutoPrefetch(spec.tuner, **options)
        self.workers, self.depth = self.autotune.start()

    # -- per batch -----------------------------------------------------------------------
    def tune(self, engine: Engine, meta: Any, requested: float, *, epoch_start: bool) -> None:
        """Tell the tuner about a batch asked for at `requested`; apply what it decides."""
        if self.autotune is None:
            return
        change = self.autotune.observe(
            meta,
            epoch_start=epoch_start,
            waited_s=time.perf_counter() - requested,
            step_s=self.telemetry.step_before(requested),
            workers=engine.workers,
            depth=engine.depth,
            bytes_in_flight=engine.bytes_in_flight(),
        )
        if change is not None:
            self.workers, self.depth = change
            engine.set_workers(change[0])
            engine.set_depth(change[1])

    def pin(self, batch: Any) -> Any:
        if not self.pin_memory:
            return batch
        if not torch.cuda.is_available():
            if not self._pin_warned:
                warnings.warn("pin_memory=True but no CUDA device: not pinning.", stacklevel=4)
                self._pin_warned = True
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch, self.pin_memory_device or None)

    def note(self, notes: list[str]) -> None:
        """Warn once per loader about each difference from torch a batch met."""
        for note in notes:
            if note not in self._noted:
                self._noted.add(note)
                warnings.warn(NOTES.get(note, note), stacklevel=4)

    # -- knobs and shutdown --------------------------------------------------------------
    def set_prefetch(self, depth: int | None, workers: int | None) -> None:
        if depth is not None:
            self.depth = depth
            if self.engine:
                self.engine.set_depth(depth)
        if workers is not None:
            self.workers = workers
            if self.engine:
                self.engine.set_workers(workers)

    def release(self, *, force: bool = False) -> None:
        """Stop the workers unless they persist across epochs (or `force`: then the
        source's queued reads are dropped too)."""
        if force:  # first: workers that finish a batch while stopping read nothing ahead
            self.cancel_reads()
        if self.engine is not None and (force or not self.persistent):
            engine, self.engine, self.followed = self.engine, None, None
            engine.close()

    def cancel_reads(self) -> None:
        """Drop the source's queued reads in this process (read-ahead for batches no
        one will ask for); reads on the wire finish."""
        self.pass_open = False
        if self.engine is not None:  # the batches queued for workers are not wanted either
            self.followed = None
            self.engine.cancel()
        cancel = getattr(getattr(self.fetcher, "source", None), "cancel_reads", None)
        if cancel is not None:
            cancel()

    def close(self) -> None:
        self.release(force=True)
        if self.autotune is not None:
            self.autotune.close()

    def stats(self) -> dict[str, Any]:
        engine = self.engine
        snapshot = self.telemetry.snapshot()
        snapshot.update(
            workers=engine.workers if engine else self.workers,
            depth=engine.depth if engine else self.depth,
            worker_mode=self.mode if self.workers else "inline",
            batches_ready=engine.batches_ready() if engine else 0,
            bytes_in_flight=engine.bytes_in_flight() if engine else 0,
            # The OS ids of the live workers: process pids, thread native ids.
            worker_pids=engine.worker_pids() if engine else [],
            worker_threads=engine.worker_threads() if engine else [],
        )
        if self.autotune is not None:
            snapshot["tuner"] = self.autotune.report()
        return snapshot


class LoaderIterator:
    """One pass over an epoch (from a cursor). After a batch raised, the next call goes on
    with the batch after it, as torch's iterator does; a dead worker or a timeout ends
    the pass (the workers are stopped)."""

    def __init__(
        self,
        runner: Runner,
        iteration: int,
        engine: Engine,
        tasks: Sequence[Any],
        cursor: Cursor,
        owner: Any = None,
    ) -> None:
        # The loader lives while an iterator of it does (as in torch): dropping it would
        # stop the workers this iterator reads from.
        self._owner = owner
        self._runner, self._iteration, self._engine = runner, iteration, engine
        self._tasks, self._cursor = tasks, cursor
        self._epoch = cursor.epoch
        self._delivered = 0
        self._done = False
        # Looked up once, not per batch: an inline engine stays inline (set_workers).
        schedule = getattr(tasks, "schedule", None)
        self._position_after = getattr(schedule, "position_after", None) or getattr(
            tasks, "position_after", None
        )
        self._inline = not engine.workers

    def __iter__(self) -> LoaderIterator:
        return self

    def __len__(self) -> int:
        return len(self._tasks)

    def _live(self) -> bool:
        return self._runner.iteration == self._iteration

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        if self._runner.iteration != self._iteration:  # not self._live(): per batch
            raise RuntimeError(
                "This iterator was superseded by a newer iter(loader); iterate one at "
                "a time (as with torch's persistent workers)."
            )
        batch, failure = self._next_batch()
        if failure is not None:
            # The traceback keeps this frame alive as long as the script keeps the
            # error; without `self` in it, a dropped iterator still frees its workers.
            del self
            raise failure
        return batch

    def _next_batch(self) -> tuple[Any, BaseException | None]:
        """(the next batch, None), or (None, the error its worker reported)."""
        runner, engine = self._runner, self._engine
        requested = time.perf_counter()
        try:
            result = engine.take()
        except StopIteration:
            runner.telemetry.on_request(requested)
            self._finish()
            raise
        except BaseException:
            self._stop(force=True)  # a dead worker or a timeout: this pass cannot go on
            raise
        k = self._delivered
        self._delivered = delivered = k + 1
        self._cursor.position = self._position_after(delivered)  # type: ignore[misc]
        if isinstance(result, Failure):
            task = self._tasks[k]
            if not result.samples:  # a batch its worker could not send names none
                result.samples = key_list(task.indices)
            return None, result.to_exception(task.number, task.epoch)
        meta = result.meta
        if meta.notes:
            runner.note(meta.notes)
        # Inline, nothing waits in the reorder buffer: this batch is all that is held.
        memory = meta.nbytes if self._inline else meta.nbytes + engine.bytes_in_flight()
        if runner.autotune is not None:
            runner.tune(engine, meta, requested, epoch_start=k == 0)
        batch = runner.pin(result.batch) if runner.pin_memory else result.batch
        # The consumer waited for all of __next__ (unwrapping, tuning, pinning too).
        runner.telemetry.record(requested, time.perf_counter(), meta, memory)
        return batch, None

    def _finish(self) -> None:
        """The pass reached the epoch's end: the cursor moves to the next epoch."""
        if self._live():
            self._runner.pass_open = False
            self._cursor.epoch, self._cursor.position = self._epoch + 1, 0
            if self._runner.autotune is not None:
                self._runner.autotune.epoch_end()  # records the run so far, on a thread
        self._stop(force=False)

    def _stop(self, *, force: bool) -> None:
        if self._done:
            return
        self._done = True
        # Only the live iterator owns the engine: a superseded one must not stop the
        # workers its successor is using.
        if self._live():
            self._runner.release(force=force)

    def __del__(self) -> None:
        # A pass abandoned mid-epoch (break, an exception in the training loop) frees
        # its workers now, unless they persist across epochs. No module globals here: at
        # interpreter exit they may already be None (the exit hook stopped the workers).
        try:
            if not self._done:
                if self._live():  # left by a `break`: what it read ahead is not wanted
                    self._runner.cancel_reads()
                self._stop(force=False)
        except Exception:  # nothing to report from a finalizer
            pass
