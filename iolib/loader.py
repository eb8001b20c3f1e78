"""DataLoader: torch's signature and observable behaviour, iolib's guarantees.

A facade: validated options (options.py), what to read in which order (sampling.py,
plan.py), how a batch is made (fetcher.py) and how it runs (iteration.py, engine.py).
The loader itself holds only a cursor: (epoch, global samples consumed).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import BatchSampler, Sampler, default_collate, default_convert
from torch.utils.data import DataLoader as TorchDataLoader

from iolib.distributed import resolve_rank
from iolib.errors import ConfigError, require_positive_int
from iolib.fetcher import BatchFetcher, skips
from iolib.iterable import IterableFeed
from iolib.iteration import Pipeline
from iolib.options import LoaderOptions, is_datapipe, is_iterable, resolve_mode
from iolib.sampling import (
    RESERVE_BATCHES,
    Cursor,
    EpochPlan,
    PlanBatchSampler,
    PlanSampler,
    StreamTasks,
    sampler_batches,
)
from iolib.sources.base import Source
from iolib.sources.torchds import as_source
from iolib.state import LoaderState, check_state, dataset_fields
from iolib.workers import worker_base_seed

T_co = TypeVar("T_co", covariant=True)
# Attributes torch refuses to change after construction (they define the batches).
_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


class _InfiniteConstantSampler(Sampler[None]):
    """`loader.sampler` for an IterableDataset, as in torch: it yields None forever."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class DataLoader(Generic[T_co]):
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

    With its own order (no `sampler`), the batches on a rank are a pure function of the
    dataset, ``seed``, the epoch, ``batch_size``, ``drop_last``, the shuffle mode, ``rank``
    and ``world_size``; never of ``num_workers``, the prefetch depth or timing
    (docs/determinism.md). A user's ``sampler``/``batch_sampler`` (e.g. DistributedSampler)
    decides order and sharding itself, as in torch. Arguments beyond torch's: ``seed``
    (default: the generator's initial seed, else ``torch.initial_seed()`` at construction,
    so ``torch.manual_seed`` moves the shuffle as under torch), ``rank``/``world_size`` (default:
    torch.distributed or torchrun), ``shuffle="block"`` with ``shuffle_window`` row groups,
    ``transform(sample, rng)``, ``decode`` (e.g. ``iolib.images.ImagePipeline``),
    ``worker_mode`` ("auto", "thread", "process"), ``prefetch`` (batches in flight or
    ready, or "auto"), ``on_error`` ("raise" or "skip").
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
        options = LoaderOptions(
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            seed=seed,
            rank=rank,
            world_size=world_size,
            shuffle_window=shuffle_window,
            transform=transform,
            decode=decode,
            worker_mode=worker_mode,
            prefetch=prefetch,
            target_utilization=target_utilization,
            memory_budget=memory_budget,
            on_error=on_error,
            iterable=is_iterable(dataset),
            datapipe=is_datapipe(dataset),
        )
        # shuffle="global" spelled out keeps a full shuffle where shuffle=True would let a
        # streaming source shuffle in windows (sampling.EpochPlan.windowed_ok).
        self._full_shuffle = isinstance(shuffle, str) and shuffle == "global"
        self._build(dataset, options)

    def _build(self, dataset: Any, o: LoaderOptions) -> None:
        self.options = o
        self.dataset = dataset
        self.num_workers, self.prefetch_factor = o.num_workers, o.prefetch_factor
        self.pin_memory, self.pin_memory_device = o.pin_memory, o.pin_memory_device
        self.timeout, self.worker_init_fn = o.timeout, o.worker_init_fn
        self.multiprocessing_context, self.generator = o.multiprocessing_context, o.generator
        self.in_order, self.persistent_workers = o.in_order, o.persistent_workers
        self.batch_size, self.drop_last = o.batch_size, o.drop_last
        self.seed, self.shuffle, self.shuffle_window = o.seed, o.shuffle, o.shuffle_window
        self.transform, self.decode = o.transform, o.decode
        batched = o.batch_size is not None or o.batch_sampler is not None
        self.collate_fn = o.collate_fn or (default_collate if batched else default_convert)
        self._cursor = Cursor()
        self._resume_pending = False
        self._epoch_chosen = False  # set_epoch/load_state_dict chose what iter() starts
        if o.iterable:
            self._feed: IterableFeed | None = IterableFeed(dataset, o)
            self.rank, self.world_size, self.worker_mode = 0, 1, "process"
            self.sampler = _InfiniteConstantSampler()
            self.batch_sampler = (
                BatchSampler(self.sampler, o.batch_size, o.drop_last)
                if (o.batch_size is not None)
                else None
            )
            self._initialized = True
            return
        self._feed = None
        if not o.in_order and o.num_workers > 0:
            warnings.warn(
                "in_order=False is ignored: iolib always delivers batches in the plan's order "
                "(its reorder buffer keeps fast workers' batches while a slow one catches up, "
                "so a slow batch costs little), where torch's loader may hand out a later "
                "batch first. Drop in_order=False to silence this.",
                stacklevel=3,
            )
        self._user_sampling = o.sampler is not None or o.batch_sampler is not None
        self.rank, self.world_size = self._ranks(o)
        torch_dataset = not isinstance(dataset, Source)
        self.worker_mode = resolve_mode(o.worker_mode, torch_dataset)
        if self.worker_mode == "process" and o.tuner is None:
            # torch's own warning when processes outnumber the cores (its wording and
            # rule); threads that wait on storage cost no core, and a tuner's
            # num_workers is only its upper bound.
            TorchDataLoader.check_worker_number_rationality(self)  # type: ignore[arg-type]
        # Global RNG state is private inline and in process workers: seed it per sample.
        private = o.num_workers == 0 or self.worker_mode == "process"
        self.source = as_source(
            dataset,
            seed=o.seed,
            seed_globals=private,
            restore_globals=o.num_workers == 0,
            batched=batched,
        ).with_seed(o.seed)  # a source whose samples depend on the seed (packed windows)
        check = getattr(self.source, "check_loader", None)
        if check is not None:  # a source whose samples are batches refuses batching them
            check(o)
        self._plan = EpochPlan(
            self.source,
            o.seed,
            o.shuffle,
            o.shuffle_window,
            o.batch_size,
            self.world_size,
            self.rank,
            o.drop_last,
            RESERVE_BATCHES if skips(o.on_error, o.decode) else 0,
            windowed_ok=not self.__dict__.get("_full_shuffle", False),
        )
        self.sampler = o.sampler if o.sampler is not None else PlanSampler(self._plan, self._cursor)
        if o.batch_sampler is not None:
            self.batch_sampler = o.batch_sampler
        elif o.batch_size is None:
            self.batch_sampler = None
        elif o.sampler is not None:
            self.batch_sampler = BatchSampler(o.sampler, o.batch_size, o.drop_last)
        else:
            self.batch_sampler = PlanBatchSampler(self.sampler, o.batch_size, o.drop_last)
        self.fetcher = BatchFetcher(
            self.source,
            seed=o.seed,
            collate_fn=o.collate_fn,
            transform=o.transform,
            decode=o.decode,
            on_error=o.on_error,  # type: ignore[arg-type]
            unbatched=not batched,
        )
        self._pipeline = Pipeline(
            self.fetcher,
            workers=o.num_workers,
            depth=o.depth,
            mode=self.worker_mode,
            persistent=o.persistent_workers,
            engine_options=dict(
                mp_context=o.multiprocessing_context,
                timeout=o.timeout,
                worker_init_fn=o.worker_init_fn,
                # get_worker_info().dataset is the object the worker reads, as in torch.
                worker_info_dataset=getattr(self.source, "dataset", self.source),
                base_seed=worker_base_seed(o.seed),
            ),
            tuner=o.tuner,
            pin_memory=o.pin_memory,
            pin_memory_device=o.pin_memory_device,
            batch_size=o.batch_size or 1,
        )
        self._initialized = True

    @staticmethod
    def _ranks(o: LoaderOptions) -> tuple[int, int]:
        """iolib shards its own order by rank. A user's sampler shards itself (torch's
        DistributedSampler under torchrun), so the loader then reads what it yields."""
        if not (o.sampler is not None or o.batch_sampler is not None):
            return resolve_rank(o.rank, o.world_size)
        if o.world_size is not None and o.world_size > 1:
            raise ConfigError(
                "A `sampler`/`batch_sampler` decides order and sharding itself, so iolib "
                f"cannot also shard it across world_size={o.world_size} ranks. Drop the "
                "sampler (iolib shards by rank), or drop rank/world_size (the sampler shards)."
            )
        return 0, 1

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FROZEN and self.__dict__.get("_initialized"):
            raise ValueError(
                f"{name} attribute should not be set after {type(self).__name__} is "
                "initialized (as in torch): build a new loader, or use replace()."
            )
        super().__setattr__(name, value)

    @property
    def _auto_collation(self) -> bool:
        """torch's name for "batches are collated" (libraries such as Lightning read it)."""
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        """torch's name for what yields each fetch's keys: batches, else single keys."""
        return self.batch_sampler if self._auto_collation else self.sampler

    # -- plan ----------------------------------------------------------------------------
    def _tasks(self, epoch: int, position: int) -> Any:
        if not self._user_sampling:
            return self._plan.tasks(epoch, position)
        o = self.options
        batches = sampler_batches(o.sampler, o.batch_sampler, o.batch_size, o.drop_last, position)
        return StreamTasks(batches, epoch, position, reserve=skips(o.on_error, o.decode))

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        if self._feed is not None:
            return len(self._feed)
        o = self.options
        if o.batch_sampler is not None:
            return len(o.batch_sampler)
        if o.sampler is not None:
            samples = len(o.sampler)
            if o.batch_size is None:
                return samples
            return samples // o.batch_size if o.drop_last else -(-samples // o.batch_size)
        return len(self._plan.schedule())

    # -- iteration -----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shuffle). Setting the current epoch keeps the cursor, so a
        restored state followed by set_epoch(same epoch) resumes mid-epoch. A user's
        sampler is never told: its epoch is the script's (sampler.set_epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"`epoch` must be a non-negative integer. Found: {epoch!r}.")
        if epoch != self._cursor.epoch:
            self._cursor.epoch, self._cursor.position = int(epoch), 0
            self._resume_pending = False
        self._epoch_chosen = True

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    def __iter__(self) -> Iterator[T_co]:
        if not self._resume_pending:
            if self._cursor.position > 0 and not self._epoch_chosen:
                # The last pass stopped early: a new iter() starts the next epoch (a fresh
                # order, as torch draws one per iter()), never a replay of this one.
                self._cursor.epoch += 1
            self._cursor.position = 0
        self._resume_pending = self._epoch_chosen = False
        if self._feed is not None:
            return self._feed.begin(self._cursor, owner=self)
        self.source.fit_cache(self._cache_row_groups())
        # The plan's own method, not the loader's: the engine keeps it to read the next
        # epoch ahead, and a reference back to the loader would keep a dropped loader
        # (and its workers) alive until the cycle collector runs.
        make_tasks = self._tasks if self._user_sampling else self._plan.tasks
        return self._pipeline.begin(
            make_tasks, self._cursor, follow=not self._user_sampling, owner=self
        )

    def _cache_row_groups(self) -> int:
        """Row groups a worker's cache must hold so no batch re-reads one."""
        workers = max(self._pipeline.workers, 1)
        if self.shuffle == "global":
            return len(self.source.blocks()) or 1
        if self.shuffle == "block":
            return self.shuffle_window + workers + 1
        return workers + 2

    def close(self) -> None:
        """Stop workers now (they also stop at the epoch's end unless persistent), and
        the tuner's thread once it has decided on every batch (stats() shows them all)."""
        if self._feed is not None:
            self._feed.close()
        else:
            self._pipeline.close()

    def __del__(self) -> None:
        # At interpreter exit module globals may already be None; the exit hook has
        # stopped the workers by then, so there is nothing left to report.
        try:
            pipeline = self.__dict__.get("_pipeline")
            if pipeline is not None:
                pipeline.release(force=True)
        except Exception:
            pass

    # -- state ---------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        if self._feed is not None:
            kind = type(self.dataset)
            return f"{kind.__module__}.{kind.__qualname__}"
        extra = ""
        if self._user_sampling:
            extra = f"+{type(self.options.sampler or self.options.batch_sampler).__qualname__}"
        return self.source.fingerprint() + extra

    def _describe_state(self) -> LoaderState:
        return LoaderState(
            epoch=self._cursor.epoch,
            position=self._cursor.position,
            seed=self.seed,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            shuffle=self.shuffle,
            shuffle_window=self.shuffle_window,
            dataset=self._fingerprint(),
            num_samples=len(self.source) if self._feed is None else 0,
            world_size=self.world_size,
            dataset_fields=dataset_fields(self.source) if self._feed is None else {},
        )

    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able cursor: restore it with load_state_dict in any process, with any
        worker count, prefetch depth or world size."""
        return self._describe_state().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state` on the next iter(); raises StateError naming what differs."""
        current = self._describe_state()
        seed = self._seed_to_adopt(state)
        if seed is not None:
            current = dataclasses.replace(current, seed=seed)
        restored = check_state(state, current)
        if seed is not None:
            self._rebuild_with_seed(seed)
        self._cursor.epoch, self._cursor.position = restored.epoch, restored.position
        self._resume_pending = self._epoch_chosen = True

    def _seed_to_adopt(self, state: Any) -> int | None:
        """A seed taken from torch.initial_seed() yields to the state's: the resumed run
        goes on in the saved order even if this process's torch seed differs."""
        seed = state.get("seed") if isinstance(state, dict) else None
        if not self.options.seed_from_torch or seed == self.seed:
            return None
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            return None  # check_state names the bad value
        return seed

    def _rebuild_with_seed(self, seed: int) -> None:
        o = self.options
        self.close()
        arguments = {**o.arguments(), "seed": seed, "iterable": o.iterable, "datapipe": o.datapipe}
        self.__dict__["_initialized"] = False  # _build sets the frozen attributes again
        self._build(self.dataset, LoaderOptions(**arguments, seed_from_torch=True))

    def replace(self, **changes: Any) -> DataLoader:
        """A new loader with the same arguments except `changes` (e.g. another source
        projection); it starts at this loader's cursor."""
        arguments = {"dataset": self.dataset, **self.options.arguments(), **changes}
        clone = type(self)(**arguments)
        clone._cursor.epoch, clone._cursor.position = self._cursor.epoch, self._cursor.position
        clone._resume_pending = self._resume_pending
        clone._epoch_chosen = True  # the clone starts the cursor's epoch, as given
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
        if self._feed is not None:
            snapshot = self._feed.telemetry.snapshot()
            snapshot.update(workers=self.num_workers, worker_mode="torch")
        else:
            snapshot = self._pipeline.stats()
            snapshot.update(self.source.cache_stats())  # row-group reads and re-reads
        snapshot.update(epoch=self._cursor.epoch, position=self._cursor.position)
        return snapshot

    @property
    def autotune(self) -> Any:
        """The online tuner (`iolib.tuning.AutoPrefetch`) of prefetch="auto" or a tuner
        object, once iteration started it; None otherwise."""
        return None if self._feed is not None else self._pipeline.autotune

    def set_prefetch(self, depth: int | None = None, workers: int | None = None) -> None:
        """Change the depth and/or worker count, also mid-epoch: pace and memory change,
        batch content does not."""
        if depth is not None:
            require_positive_int("depth", depth)
        if workers is not None:
            require_positive_int("workers", workers)
            if self.num_workers == 0:
                raise ConfigError("Cannot add workers to a loader built with num_workers=0.")
        if self._feed is not None:
            raise ConfigError("set_prefetch() is not available for an IterableDataset.")
        self._pipeline.set_prefetch(depth, workers)
