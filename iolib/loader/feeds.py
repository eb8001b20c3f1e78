"""How a loader makes an epoch's batches: one of three feeds, chosen once.

iolib's own plan (`PlanFeed`), a user's sampler or batch_sampler (`SamplerFeed`), or an
IterableDataset run through torch's worker loop (`StreamFeed`, in stream_feed.py).
`make_feed` picks one when the loader is built; the loader then talks to it through the
`Feed` protocol only, so none of its methods asks which mode it is in.

The protocol follows torchdata's ``BaseNode`` (``reset(initial_state)``, ``next()``,
``get_state()``): ``begin(cursor)`` starts a pass at a cursor (epoch, position), the
iterator it returns moves the cursor as batches are delivered, and the cursor with
``fingerprint()`` and ``dataset_fields()`` is the state (checkpoint.py). Each feed owns what
its mode needs (the plan, the user's sampler, torch's loader) and nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any, Protocol

from torch.utils.data import BatchSampler
from torch.utils.data import DataLoader as TorchDataLoader

from iolib.engine.workers import worker_base_seed
from iolib.errors import ConfigError
from iolib.fetcher import BatchFetcher, skips
from iolib.loader.checkpoint import dataset_fields
from iolib.loader.distributed import resolve_rank
from iolib.loader.options import LoaderOptions, resolve_mode
from iolib.loader.runner import Runner, TaskMaker
from iolib.loader.sampling import (
    RESERVE_BATCHES,
    Cursor,
    EpochPlan,
    PlanBatchSampler,
    PlanSampler,
    StreamTasks,
    sampler_batches,
)
from iolib.loader.stream_feed import StreamFeed
from iolib.sources.base import Source
from iolib.sources.torchds import as_source

CPU_EVERY = 8  # inline: the batches whose stages' CPU is measured (1 in CPU_EVERY)


class Feed(Protocol):
    """What the loader asks of its mode. `sampler`, `batch_sampler`, `rank`,
    `world_size` and `worker_mode` are what a script reads on the loader."""

    cursor: Cursor  # where the loader stands: (epoch, position)
    sampler: Any
    batch_sampler: Any
    rank: int
    world_size: int
    worker_mode: str

    def __len__(self) -> int:
        """Batches per epoch on this rank."""

    def begin(self, owner: Any) -> Iterator[Any]:
        """One pass from the cursor, which the iterator moves; `owner` (the loader) lives
        as long as the iterator does."""

    @property
    def num_samples(self) -> int:
        """Samples the cursor's position is bounded by (0: no bound)."""

    def fingerprint(self) -> str:
        """What a saved cursor must have been made on."""

    def dataset_fields(self) -> dict[str, str]:
        """What the fingerprint is made of, to say what differs on a refused restore."""

    def order_mode(self) -> tuple[str, int]:
        """The shuffle mode and window the order runs (what a state records: a source
        that streams may run shuffle=True as a windowed shuffle)."""

    def stats(self) -> dict[str, Any]: ...

    @property
    def autotune(self) -> Any:
        """The online tuner once iteration started it; None otherwise."""

    def set_prefetch(self, depth: int | None, workers: int | None) -> None: ...

    def close(self) -> None:
        """Stop workers (and a tuner) now."""

    def release(self) -> None:
        """Stop workers when the loader is dropped (a finalizer: never raises)."""


def make_feed(dataset: Any, options: LoaderOptions) -> Feed:
    """The one place that chooses the mode."""
    if options.iterable:
        return StreamFeed(dataset, options)
    if options.sampler is not None or options.batch_sampler is not None:
        return SamplerFeed(dataset, options)
    return PlanFeed(dataset, options)


def _warn_if_out_of_order(o: LoaderOptions) -> None:
    """torch may reorder batches under in_order=False; iolib never does: say so once."""
    if not o.in_order and o.num_workers > 0:
        warnings.warn(
            "in_order=False is ignored: iolib always delivers batches in the plan's order "
            "(its reorder buffer keeps fast workers' batches while a slow one catches up, "
            "so a slow batch costs little), where torch's loader may hand out a later "
            "batch first. Drop in_order=False to silence this.",
            stacklevel=6,  # the script's DataLoader(...): feed, make_feed, _setup, __init__
        )


def _check_worker_number(o: LoaderOptions) -> None:
    """torch's worker-count warning, told from the script's DataLoader(...) line rather
    than from here (torch's own stacklevel points into its caller, this module)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        TorchDataLoader.check_worker_number_rationality(o)  # type: ignore[arg-type]
    for warning in caught:
        # The script's DataLoader(...): this, feed, make_feed, _setup, __init__.
        warnings.warn(warning.message, warning.category, stacklevel=6)


class _KeyedFeed(ABC):
    """Samples read by key (a map-style dataset or an iolib Source) through iolib's
    fetcher and engine: what the plan and the sampler modes share. Subclasses give the
    rank, the samplers, the tasks of a pass, `__len__` and whether the next epoch may be
    read ahead (`follow`)."""

    follow = False

    def __init__(self, dataset: Any, options: LoaderOptions) -> None:
        self.options = o = options
        self.cursor = Cursor()
        _warn_if_out_of_order(o)
        self.rank, self.world_size = self._ranks()
        self.worker_mode = resolve_mode(o.pace.worker_mode, not isinstance(dataset, Source))
        if self.worker_mode == "process" and o.readahead.tuner is None:
            # torch's own warning when processes outnumber the cores (its wording and
            # rule: it reads num_workers only); threads that wait on storage cost no
            # core, and a tuner's num_workers is only its upper bound.
            _check_worker_number(o)
        self.source = self._source(dataset)
        self.plan = EpochPlan(
            self.source,
            o.seed,
            o.shuffle,
            o.order.shuffle_window,
            o.batch_size,
            self.world_size,
            self.rank,
            o.drop_last,
            RESERVE_BATCHES if skips(o.sample.on_error, o.sample.decode) else 0,
            windowed_ok=not o.full_shuffle,
        )
        self.sampler, self.batch_sampler = self._samplers()
        self.fetcher = BatchFetcher(
            self.source,
            seed=o.seed,
            collate_fn=o.collate_fn,
            transform=o.sample.transform,
            decode=o.sample.decode,
            on_error=o.sample.on_error,  # type: ignore[arg-type]
            unbatched=not self.options.batched,
            # Inline, the CPU clock is read on the consumer's own time: on a sample of
            # the batches (stats() reports medians), unless a tuner reads every batch's.
            cpu_every=CPU_EVERY if o.num_workers == 0 and o.readahead.tuner is None else 1,
        )
        self.runner = self._runner()

    @abstractmethod
    def _ranks(self) -> tuple[int, int]: ...

    @abstractmethod
    def _samplers(self) -> tuple[Any, Any]: ...

    @abstractmethod
    def _task_maker(self) -> TaskMaker:
        """(epoch, position) -> the tasks of a pass. The engine may keep it to read the
        next epoch ahead: it must not refer back to the feed (or the loader), or a
        dropped loader's workers live on until the cycle collector runs."""
        ...

    def _source(self, dataset: Any) -> Source:
        """The dataset as an iolib Source, checked against the loader's options."""
        o = self.options
        # Global RNG state is private inline and in process workers: seed it per sample.
        private = o.num_workers == 0 or self.worker_mode == "process"
        source = as_source(
            dataset,
            seed=o.seed,
            seed_globals=private,
            restore_globals=o.num_workers == 0,
            batched=self.options.batched,
        ).with_seed(o.seed)  # a source whose samples depend on the seed (packed windows)
        source.check_loader(o)  # a source whose samples are batches refuses batching them
        return source

    def _runner(self) -> Runner:
        o = self.options
        return Runner(
            self.fetcher,
            workers=o.num_workers,
            readahead=o.readahead,
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
            pin_memory=o.pin_memory,
            pin_memory_device=o.pin_memory_device,
            batch_size=o.batch_size or 1,
            rank=self.rank,
        )

    # -- the protocol --------------------------------------------------------------------
    def begin(self, owner: Any) -> Iterator[Any]:
        self.source.fit_cache(self._cache_row_groups())
        return self.runner.begin(self._task_maker(), self.cursor, follow=self.follow, owner=owner)

    def _cache_row_groups(self) -> int:
        """Row groups a worker's cache must hold so no batch re-reads one."""
        workers = max(self.runner.workers, 1)
        shuffle, window = self.order_mode()
        if shuffle == "global":
            return len(self.source.blocks()) or 1
        if shuffle == "block":
            # A source's own windowed shuffle reads the next window ahead: two of them.
            ahead = window if self._source_windowed() else 0
            return window + ahead + workers + 1
        return workers + 2

    def _source_windowed(self) -> bool:
        """Does the source run its own windowed shuffle (its layout's, not the loader's)?"""
        return False

    @property
    def num_samples(self) -> int:
        return len(self.source)

    def order_mode(self) -> tuple[str, int]:
        return self.options.shuffle, self.options.order.shuffle_window

    def fingerprint(self) -> str:
        return self.source.fingerprint()

    def dataset_fields(self) -> dict[str, str]:
        return dataset_fields(self.source)

    def stats(self) -> dict[str, Any]:
        snapshot = self.runner.stats()
        snapshot.update(self.source.cache_stats())  # row-group reads and re-reads
        resolved = getattr(self.options.sample.decode, "resolved_backend", None)
        if resolved is not None:  # which decoder runs (ImagePipeline's "auto" resolved)
            with contextlib.suppress(Exception):
                snapshot["decode_backend"] = resolved()
        return snapshot

    @property
    def autotune(self) -> Any:
        return self.runner.autotune

    def set_prefetch(self, depth: int | None, workers: int | None) -> None:
        self.runner.set_prefetch(depth, workers)

    def close(self) -> None:
        self.runner.close()

    def release(self) -> None:
        self.runner.release(force=True)


class PlanFeed(_KeyedFeed):
    """iolib's own order: a pure function of the seed, the epoch and the rank (plan.py),
    sharded by rank; the next epoch's first batches are read while this one ends."""

    follow = True

    def _ranks(self) -> tuple[int, int]:
        return resolve_rank(self.options.order.rank, self.options.order.world_size)

    def _samplers(self) -> tuple[Any, Any]:
        """The plan as torch's sampler and batch sampler: what a script iterating them
        sees is what the loader delivers."""
        o = self.options
        sampler = PlanSampler(self.plan, self.cursor)
        if o.batch_size is None:
            return sampler, None
        return sampler, PlanBatchSampler(sampler, o.batch_size, o.drop_last)

    def _task_maker(self) -> TaskMaker:
        return self.plan.tasks  # the plan refers to the source only

    def __len__(self) -> int:
        return len(self.plan.schedule())

    def order_mode(self) -> tuple[str, int]:
        choice = self.plan.choice
        return choice.shuffle, choice.window

    def _source_windowed(self) -> bool:
        return self.plan.choice.source_windowed

    def fingerprint(self) -> str:
        """The source's, and the lanes the plan resolved where the source has lanes: a
        resume at another world size with lanes="auto" is another order."""
        own, lanes = self.source.fingerprint(), self.plan.order_fields()
        if not lanes:
            return own
        words = f"{own}|" + "|".join(f"{k} {v}" for k, v in sorted(lanes.items()))
        return hashlib.sha256(words.encode()).hexdigest()[:16]

    def dataset_fields(self) -> dict[str, str]:
        return {**dataset_fields(self.source), **self.plan.order_fields()}


class SamplerFeed(_KeyedFeed):
    """A user's `sampler` or `batch_sampler` decides order and sharding, as in torch; it
    is iterated afresh on each pass, and its epoch is the script's (sampler.set_epoch).
    The cursor counts batches."""

    def _ranks(self) -> tuple[int, int]:
        """A user's sampler shards itself (torch's DistributedSampler under torchrun), so
        the loader reads what it yields."""
        world_size = self.options.order.world_size
        if world_size is not None and world_size > 1:
            raise ConfigError(
                "A `sampler`/`batch_sampler` decides order and sharding itself, so iolib "
                f"cannot also shard it across world_size={world_size} ranks. Drop the "
                "sampler (iolib shards by rank), or drop rank/world_size (the sampler shards)."
            )
        return 0, 1

    def _samplers(self) -> tuple[Any, Any]:
        """The user's; with only a batch_sampler, `loader.sampler` is the dataset in
        order (the plan unshuffled), as torch's is a SequentialSampler."""
        o = self.options
        sampler = o.sampler if o.sampler is not None else PlanSampler(self.plan, self.cursor)
        if o.batch_sampler is not None:
            return sampler, o.batch_sampler
        if o.batch_size is None:
            return sampler, None
        return sampler, BatchSampler(o.sampler, o.batch_size, o.drop_last)

    def _task_maker(self) -> TaskMaker:
        return self.tasks  # never kept: a user's sampler is not read ahead (follow)

    def tasks(self, epoch: int, position: int) -> StreamTasks:
        """The user's batches for a pass from `position` (batches consumed)."""
        o = self.options
        batches = sampler_batches(o.sampler, o.batch_sampler, o.batch_size, o.drop_last, position)
        reserve = skips(o.sample.on_error, o.sample.decode)
        return StreamTasks(batches, epoch, position, reserve=reserve)

    def __len__(self) -> int:
        o = self.options
        if o.batch_sampler is not None:
            return len(o.batch_sampler)
        samples = len(o.sampler)
        if o.batch_size is None:
            return samples
        return samples // o.batch_size if o.drop_last else -(-samples // o.batch_size)

    def fingerprint(self) -> str:
        sampling = self.options.sampler or self.options.batch_sampler
        return f"{self.source.fingerprint()}+{type(sampling).__qualname__}"
