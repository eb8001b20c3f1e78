"""DataLoader: torch's signature, iolib's guarantees.

It composes the pieces: a source (what), a plan (which samples, in which order, on
which rank), a fetcher (read, transform, collate, decode) and an engine (how fast).
The loader itself holds only a cursor: (epoch, global samples consumed).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from iolib.distributed import resolve_rank
from iolib.engine import Engine
from iolib.errors import ConfigError, DataError, WorkerError, require_positive_int
from iolib.fetcher import BatchFetcher, BatchTask, Failure
from iolib.options import (
    check_samplers,
    resolve_depth,
    resolve_mode,
    resolve_seed,
    resolve_tuner,
)
from iolib.plan import RankSchedule, epoch_order, normalize_shuffle
from iolib.sources.torchds import TorchDatasetSource, as_source
from iolib.state import LoaderState, check_state
from iolib.telemetry import Telemetry
from iolib.tuning import AutoPrefetch


class _EpochTasks:
    """Batch k of one epoch for this rank, computed on demand (a lazy Sequence)."""

    def __init__(self, order: np.ndarray, schedule: RankSchedule, epoch: int) -> None:
        self.order, self.schedule, self.epoch = order, schedule, epoch

    def __len__(self) -> int:
        return len(self.schedule)

    def __getitem__(self, k: int) -> BatchTask:
        return BatchTask(k, self.order[self.schedule.positions(k)], self.epoch)


class DataLoader:
    """A drop-in replacement for ``torch.utils.data.DataLoader`` with deterministic,
    resumable, sharded batches.

    Example::

        from iolib import DataLoader
        from iolib.sources import ParquetSource

        loader = DataLoader(ParquetSource("data/*.parquet"), batch_size=64, shuffle="block",
                            num_workers=4, seed=0)
        for epoch in range(3):
            loader.set_epoch(epoch)
            for batch in loader:
                ...
            torch.save(loader.state_dict(), "loader.pt")

    The batches on a rank are a pure function of the dataset, ``seed``, the epoch,
    ``batch_size``, ``drop_last``, the shuffle mode, ``rank`` and ``world_size``; never of
    ``num_workers``, the prefetch depth or timing (docs/determinism.md). Arguments beyond
    torch's: ``seed`` (default 0: reproducible by default), ``rank``/``world_size``
    (default: from torch.distributed or torchrun), ``shuffle="block"`` with
    ``shuffle_window`` row groups, ``transform(sample, rng)``, ``decode`` (e.g.
    ``iolib.images.ImagePipeline``), ``worker_mode`` ("auto", "thread", "process"),
    ``prefetch`` (batches in flight or ready), ``on_error`` ("raise" or "skip").
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | str | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle_window: int = 8,
        transform: Callable[[Any, np.random.Generator], Any] | None = None,
        decode: Any = None,
        worker_mode: str = "auto",
        prefetch: int | str | Any = None,
        target_utilization: float = 0.9,
        memory_budget: int | str | None = None,
        on_error: str = "raise",
    ) -> None:
        # Every argument, so a stage feed or a resumed run can rebuild an equal loader.
        self._arguments = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.source = as_source(dataset)
        self.shuffle = normalize_shuffle(shuffle)
        check_samplers(sampler, batch_sampler, batch_size, drop_last, self.shuffle)
        self.sampler, self.batch_sampler = sampler, batch_sampler
        self.batch_size = batch_size if batch_sampler is None else None
        self.drop_last = drop_last
        self.num_workers = num_workers
        if timeout < 0:
            raise ConfigError(f"`timeout` must be >= 0 seconds. Found: {timeout!r}.")
        self.timeout = timeout
        self.seed = resolve_seed(seed, generator)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        if (sampler is not None or batch_sampler is not None) and self.world_size > 1:
            raise ConfigError(
                "A `sampler`/`batch_sampler` decides the order itself, so iolib cannot shard it "
                f"across {self.world_size} ranks. Drop the sampler (iolib shards by rank), or "
                "pass rank=0, world_size=1 and shard in the sampler (DistributedSampler)."
            )
        self.shuffle_window = require_positive_int("shuffle_window", shuffle_window)
        self.worker_mode = resolve_mode(worker_mode, self.source)
        self.tuner_spec = resolve_tuner(prefetch, target_utilization, memory_budget)
        self.depth = resolve_depth(
            None if self.tuner_spec else prefetch, prefetch_factor, num_workers
        )
        self._autotune: AutoPrefetch | None = None
        self.persistent_workers = persistent_workers
        self.pin_memory, self.pin_memory_device = pin_memory, pin_memory_device
        self.in_order = in_order  # iolib always delivers in order; in_order=False allows no more
        self.multiprocessing_context = multiprocessing_context
        self.worker_init_fn = worker_init_fn
        self.fetcher = BatchFetcher(
            self.source,
            seed=self.seed,
            collate_fn=collate_fn,
            transform=transform,
            decode=decode,
            on_error=on_error,  # type: ignore[arg-type]
        )
        self.collate_fn, self.transform, self.decode = collate_fn, transform, decode
        self.telemetry = Telemetry()
        self._engine: Engine | None = None
        self._followed: tuple[int, int] | None = None  # (epoch, position) read ahead
        self._epoch, self._position = 0, 0
        self._resume_pending = False
        self._iteration = 0  # identifies the live iterator; older ones are superseded
        self._orders: dict[int, np.ndarray] = {}

    # -- plan ----------------------------------------------------------------------------
    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            if self.sampler is not None:
                if hasattr(self.sampler, "set_epoch"):
                    self.sampler.set_epoch(epoch)
                order = np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
            else:
                order = epoch_order(
                    len(self.source),
                    seed=self.seed,
                    epoch=epoch,
                    shuffle=self.shuffle,
                    blocks=self.source.blocks() if self.shuffle == "block" else (),
                    window=self.shuffle_window,
                )
            if self.sampler is not None:
                return order  # a sampler may draw anew on each pass, as in torch
            self._orders = {epoch: order}  # keep one epoch's order only
        return self._orders[epoch]

    def _tasks(self, epoch: int, position: int) -> Any:
        if self.batch_sampler is not None:
            if hasattr(self.batch_sampler, "set_epoch"):
                self.batch_sampler.set_epoch(epoch)
            batches = [np.asarray(list(b), dtype=np.int64) for b in self.batch_sampler]
            return [BatchTask(k, b, epoch) for k, b in enumerate(batches)][position:]
        order = self._order(epoch)
        if len(order) == 0:
            raise DataError(
                f"{self.source.describe()} has no samples (or the sampler yields none): "
                "there is nothing to load. Check the files and filters."
            )
        schedule = RankSchedule(
            len(order), position, self.batch_size, self.world_size, self.rank, self.drop_last
        )
        return _EpochTasks(order, schedule, epoch)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        total = len(self.sampler) if self.sampler is not None else len(self.source)
        return len(
            RankSchedule(total, 0, self.batch_size, self.world_size, self.rank, self.drop_last)
        )

    # -- iteration -----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shuffle). Setting the current epoch keeps the cursor, so a
        restored state followed by set_epoch(same epoch) resumes mid-epoch."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"`epoch` must be a non-negative integer. Found: {epoch!r}.")
        if epoch != self._epoch:
            self._epoch, self._position, self._resume_pending = epoch, 0, False

    @property
    def epoch(self) -> int:
        return self._epoch

    def __iter__(self) -> Iterator[Any]:
        if not self._resume_pending:
            self._position = 0  # a new pass over the current epoch (torch semantics)
        self._resume_pending = False
        self._iteration += 1
        return self._iterate(self._iteration, self._epoch, self._position)

    def _start_tuner(self) -> None:
        """Build the tuner on first use (it needs the source's row-group size) and start
        the engine from its safe configuration; `num_workers` is then the most it may use."""
        if self.tuner_spec is None or self._autotune is not None:
            return
        spec, blocks = self.tuner_spec, self.source.blocks()
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
        options = dict(
            batch_size=self.batch_size or 1,
            rows_per_read=int(np.median(blocks)) if blocks else 1,
            max_workers=self.num_workers or max(2, 2 * cpus),
            memory_budget=spec["budget"],
        )
        if spec["tuner"] == "auto":
            self._autotune = AutoPrefetch.learned(target=spec["target"], **options)
        else:
            self._autotune = AutoPrefetch(spec["tuner"], target=spec["target"], **options)
        self.num_workers, self.depth = self._autotune.start()

    def _engine_for(self) -> Engine:
        self._start_tuner()
        if isinstance(self.source, TorchDatasetSource):
            # Global RNG state is private inline and in process workers: seed it per sample.
            self.source.seed_globals = self.num_workers == 0 or self.worker_mode == "process"
        if self._engine is None:
            self._engine = Engine(
                self.fetcher,
                workers=self.num_workers,
                depth=self.depth,
                mode=self.worker_mode,  # type: ignore[arg-type]
                mp_context=self.multiprocessing_context,
                timeout=self.timeout,
                worker_init_fn=self.worker_init_fn,
                sizeof=lambda r: r[1].nbytes if isinstance(r, tuple) else 0,
            )
        return self._engine

    def _cache_row_groups(self) -> int:
        """Row groups a worker's cache must hold so no batch re-reads one."""
        workers = max(self.num_workers, 1)
        if self.shuffle == "global":
            return len(self.source.blocks()) or 1
        if self.shuffle == "block":
            return self.shuffle_window + workers + 1
        return workers + 2

    def _iterate(self, iteration: int, epoch: int, position: int) -> Iterator[Any]:
        self.source.fit_cache(self._cache_row_groups())
        engine = self._engine_for()
        if self._followed == (epoch, position):
            tasks = engine.advance()  # read ahead while the last epoch ended (_follow)
        else:
            tasks = self._tasks(epoch, position)
            engine.start(tasks)
        self._followed = self._follow(engine, tasks, epoch)
        self.telemetry.start_epoch()
        finished = False
        try:
            for k in range(len(tasks)):
                if iteration != self._iteration:
                    raise RuntimeError(
                        "This iterator was superseded by a newer iter(loader); iterate one at "
                        "a time (as with torch's persistent workers)."
                    )
                requested = time.perf_counter()
                self.telemetry.on_request(requested)
                result, _ = engine.next()
                batch = self._unwrap(result, tasks[k])
                self.telemetry.on_memory(engine.bytes_in_flight() + result[1].nbytes)
                if self._autotune is not None:
                    waited = time.perf_counter() - requested
                    self._tune(engine, result[1], waited, epoch_start=k == 0)
                self._position = self._advance(tasks, position, k + 1)
                if batch is not None:
                    batch = self._pin(batch)
                # The consumer waited for all of __next__, not only for the engine:
                # unwrapping, tuning and pinning too. Counted as its step, that work made
                # utilization read 0.93 where the training loop saw 0.77 (2 ms steps).
                self.telemetry.on_batch(time.perf_counter() - requested, result[1])
                if batch is None:  # every sample of it skipped (on_error="skip"); counted
                    continue
                yield batch
            finished = True
            self._epoch, self._position = epoch + 1, 0
        finally:
            # Only the live iterator owns the engine: a superseded one must not stop the
            # workers its successor is using.
            if iteration == self._iteration and (not finished or not self.persistent_workers):
                self._close_engine(force=not finished)

    def _follow(self, engine: Engine, tasks: Any, epoch: int) -> tuple[int, int] | None:
        """With persistent workers, read the next epoch's first batches while this one
        ends: its first batch was otherwise awaited behind an empty pipeline (25-75 ms
        on `nas` at 8-24 workers, a 160-batch epoch's whole margin to the target).

        Only for the loader's own order: a user's sampler may be told its epoch by the
        training loop after this one ends (torch's DistributedSampler.set_epoch), so
        drawing from it early could draw the wrong order. What is read ahead is the
        batches of (epoch + 1, position 0), exactly what iter() would start there; any
        other next iteration (set_epoch, load_state_dict elsewhere) discards them."""
        if not (
            self.persistent_workers
            and engine.workers
            and isinstance(tasks, _EpochTasks)
            and self.sampler is None
        ):
            return None
        engine.follow(lambda: self._tasks(epoch + 1, 0))
        return epoch + 1, 0

    def _tune(self, engine: Engine, meta: Any, waited: float, *, epoch_start: bool) -> None:
        steps = self.telemetry.steps
        change = self._autotune.observe(
            meta,
            epoch_start=epoch_start,
            waited_s=waited,
            step_s=steps[-1] if steps else 0.0,
            workers=engine.workers,
            depth=engine.depth,
            bytes_in_flight=engine.bytes_in_flight(),
        )
        if change is not None:
            self.num_workers, self.depth = change
            engine.set_workers(change[0])
            engine.set_depth(change[1])

    def _advance(self, tasks: Any, position: int, delivered: int) -> int:
        if isinstance(tasks, _EpochTasks):
            return tasks.schedule.position_after(delivered)
        return position + delivered  # batch_sampler: the cursor counts batches

    def _unwrap(self, result: Any, task: BatchTask) -> Any:
        if isinstance(result, Failure):
            shown = result.samples[:8]
            more = f" (+{len(result.samples) - 8} more)" if len(result.samples) > 8 else ""
            raise WorkerError(
                f"Batch {task.number} of epoch {task.epoch} failed in stage '{result.stage}' "
                f"for sample(s) {shown}{more}: {result.message}",
                stage=result.stage,
                batch=task.number,
                samples=result.samples,
                remote_traceback=result.traceback,
            ) from result.exception
        return result[0]

    def _pin(self, batch: Any) -> Any:
        if not self.pin_memory:
            return batch
        if not torch.cuda.is_available():
            if not getattr(self, "_pin_warned", False):
                warnings.warn("pin_memory=True but no CUDA device: not pinning.", stacklevel=3)
                self._pin_warned = True
            return batch
        from torch.utils.data._utils.pin_memory import pin_memory

        return pin_memory(batch, self.pin_memory_device or None)

    def _close_engine(self, force: bool = False) -> None:
        if self._engine is not None and (force or not self.persistent_workers):
            self._engine.close()
            self._engine, self._followed = None, None

    def close(self) -> None:
        """Stop workers now (they also stop at the epoch's end unless persistent), and
        the tuner's thread once it has decided on every batch (stats() shows them all)."""
        self._close_engine(force=True)
        if self._autotune is not None:
            self._autotune.close()

    def __del__(self) -> None:
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close(timeout=1.0)

    # -- state ---------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        extra = ""
        if self.sampler is not None or self.batch_sampler is not None:
            kind = type(self.sampler or self.batch_sampler)
            extra = f"+{kind.__qualname__}"
        return self.source.fingerprint() + extra

    def _describe_state(self) -> LoaderState:
        return LoaderState(
            epoch=self._epoch,
            position=self._position,
            seed=self.seed,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            shuffle=self.shuffle,
            shuffle_window=self.shuffle_window,
            dataset=self._fingerprint(),
            num_samples=len(self.source),
            world_size=self.world_size,
        )

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able cursor: restore it with load_state_dict in any process, with any
        worker count, prefetch depth or world size."""
        return self._describe_state().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state` on the next iter(); raises StateError naming what differs."""
        restored = check_state(state, self._describe_state())
        self._epoch, self._position = restored.epoch, restored.position
        self._resume_pending = True

    def replace(self, **changes: Any) -> DataLoader:
        """A new loader with the same arguments except `changes` (e.g. another source
        projection); it starts at this loader's cursor."""
        clone = DataLoader(**{**self._arguments, **changes})
        clone._epoch, clone._position = self._epoch, self._position
        clone._resume_pending = self._resume_pending
        return clone

    def for_stage(self, stage: int, num_stages: int, microbatches: int = 1, **options: Any) -> Any:
        """What one stage of a pipeline-parallel replica needs, in the same order on every
        stage: the first stage the inputs, the last the labels, split into `microbatches`
        (see iolib.stages.StageFeed for the options)."""
        from iolib.stages import StageFeed

        return StageFeed(self, stage, num_stages, microbatches=microbatches, **options)

    # -- observability -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Throughput, consumer stall, stage times, memory in flight, workers and depth."""
        engine = self._engine
        snapshot = self.telemetry.snapshot()
        snapshot.update(
            epoch=self._epoch,
            position=self._position,
            workers=engine.workers if engine else self.num_workers,
            depth=engine.depth if engine else self.depth,
            worker_mode=self.worker_mode if self.num_workers else "inline",
            batches_ready=engine.batches_ready() if engine else 0,
            bytes_in_flight=engine.bytes_in_flight() if engine else 0,
        )
        if self._autotune is not None:
            snapshot["tuner"] = self._autotune.report()
        return snapshot

    def set_prefetch(self, depth: int | None = None, workers: int | None = None) -> None:
        """Change the depth and/or worker count, also mid-epoch: pace and memory change,
        batch content does not."""
        if depth is not None:
            self.depth = require_positive_int("depth", depth)
            if self._engine:
                self._engine.set_depth(depth)
        if workers is not None:
            require_positive_int("workers", workers)
            if self.num_workers == 0:
                raise ConfigError("Cannot add workers to a loader built with num_workers=0.")
            self.num_workers = workers
            if self._engine:
                self._engine.set_workers(workers)
