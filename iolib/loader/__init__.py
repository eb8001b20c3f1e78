"""DataLoader: torch's signature and observable behaviour, iolib's guarantees.

A facade: validated options (options.py), and one feed chosen for the dataset and
options (feeds.py: iolib's plan, a user's sampler, or an IterableDataset), which owns
how batches are made and the cursor (epoch, position) that is the loader's state.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import default_collate, default_convert

from iolib.errors import ConfigError, require_positive_int
from iolib.loader.checkpoint import LoaderState, check_state
from iolib.loader.feeds import make_feed
from iolib.loader.options import LoaderOptions
from iolib.loader.sampling import Cursor
from iolib.sources.base import Source

T_co = TypeVar("T_co", covariant=True)
# Attributes torch refuses to change after construction (they define the batches).
_FROZEN = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


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
    ``transform(sample, rng)``, ``decode`` (e.g. ``iolib.decode.images.ImagePipeline``),
    ``worker_mode`` ("auto", "thread", "process"), ``prefetch`` (batches in flight or
    ready, or "auto"), ``on_error`` ("raise" or "skip"), ``history`` (where a
    ``prefetch="auto"`` run records what it measured and starts from earlier runs of the same
    workload: a path or fsspec URL; default $IOLIB_HISTORY, else the cache directory;
    False: none; docs/tuning.md).
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
        history: Any = None,
    ) -> None:
        # Every parameter but `dataset`, by name, as given: LoaderOptions groups them
        # (this signature is torch's, and the one place their names are listed here).
        arguments = {k: v for k, v in locals().items() if k not in ("self", "dataset")}
        self._setup(dataset, LoaderOptions.from_arguments(dataset, arguments))

    def _setup(self, dataset: Any, options: LoaderOptions) -> None:
        """Mirror torch's attributes, then choose the mode once (feeds.make_feed)."""
        self.options, self.dataset = options, dataset
        self._mirror_attributes(options)
        self._resume_pending = False
        self._epoch_chosen = False  # set_epoch/load_state_dict chose what iter() starts
        self._feed = feed = make_feed(dataset, options)
        self.rank, self.world_size, self.worker_mode = feed.rank, feed.world_size, feed.worker_mode
        self.sampler, self.batch_sampler = feed.sampler, feed.batch_sampler
        self._initialized = True

    def _mirror_attributes(self, o: LoaderOptions) -> None:
        """torch's attributes (a script or a library such as Lightning reads them), and
        iolib's own under their argument names."""
        self.num_workers, self.prefetch_factor = o.num_workers, o.prefetch_factor
        self.pin_memory, self.pin_memory_device = o.pin_memory, o.pin_memory_device
        self.timeout, self.worker_init_fn = o.timeout, o.worker_init_fn
        self.multiprocessing_context, self.generator = o.multiprocessing_context, o.generator
        self.in_order, self.persistent_workers = o.in_order, o.persistent_workers
        self.batch_size, self.drop_last = o.batch_size, o.drop_last
        self.seed, self.shuffle, self.shuffle_window = o.seed, o.shuffle, o.order.shuffle_window
        self.transform, self.decode = o.sample.transform, o.sample.decode
        self.collate_fn = o.collate_fn or (default_collate if o.batched else default_convert)

    @property
    def source(self) -> Source:
        """The dataset as an iolib Source (a map-style dataset is wrapped); an
        IterableDataset has none."""
        return self._feed.source  # type: ignore[attr-defined]

    @property
    def fetcher(self) -> Any:
        """What turns a batch's keys into the batch (iolib.fetcher.BatchFetcher)."""
        return self._feed.fetcher  # type: ignore[attr-defined]

    @property
    def _cursor(self) -> Cursor:
        return self._feed.cursor

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

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return len(self._feed)

    # -- iteration -----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shuffle). Setting the current epoch keeps the cursor, so a
        restored state followed by set_epoch(same epoch) resumes mid-epoch. A user's
        sampler is never told: its epoch is the script's (sampler.set_epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"`epoch` must be a non-negative integer. Found: {epoch!r}.")
        if epoch != self._cursor.epoch:
            if self._resume_pending:
                self._warn_cursor_discarded(int(epoch))
            self._cursor.epoch, self._cursor.position = int(epoch), 0
            self._resume_pending = False
        self._epoch_chosen = True

    def _warn_cursor_discarded(self, epoch: int) -> None:
        """set_epoch(another epoch) right after load_state_dict drops the restored cursor:
        the commonest resume bug (a loop from 0 replays epoch 0), so say what is lost,
        unless the restored epoch was finished and the loop moves on to the next."""
        restored, position = self._cursor.epoch, self._cursor.position
        plan = getattr(self._feed, "plan", None)
        left = len(plan.schedule(position)) if plan is not None and position else None
        if epoch == restored + 1 and left == 0:
            return
        warnings.warn(
            f"set_epoch({epoch}) after load_state_dict discards the restored cursor (epoch "
            f"{restored}, position {position}): the loader starts epoch {epoch} from its "
            f"beginning. To resume where the state left off, call set_epoch({restored}) "
            "(e.g. start the epoch loop at state['epoch']).",
            stacklevel=3,  # the script's set_epoch(...) line
        )

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
        self._draw_as_torch()
        return self._feed.begin(owner=self)

    def _draw_as_torch(self) -> None:
        """Take from torch's generators the draws torch's DataLoader takes per iter(): its
        iterator's base seed (from `generator`, else the global one; once with persistent
        workers) and its RandomSampler's seed (global, each epoch, when it shuffles with
        no generator). The values are not used (iolib's order comes from `seed`); the
        draws keep a script's later ones (dropout, augmentations) equal to torch's."""
        o = self.options
        if not (o.persistent_workers and self.__dict__.get("_base_seed_drawn")):
            torch.empty((), dtype=torch.int64).random_(generator=o.generator)
            self.__dict__["_base_seed_drawn"] = True
        own_order = o.sampler is None and o.batch_sampler is None and not o.iterable
        if own_order and o.generator is None and self.shuffle != "none":
            torch.empty((), dtype=torch.int64).random_()

    def close(self) -> None:
        """Stop workers now (they also stop at the epoch's end unless persistent), and
        the tuner's thread once it has decided on every batch (stats() shows them all)."""
        self._feed.close()

    def __del__(self) -> None:
        # At interpreter exit module globals may already be None; the exit hook has
        # stopped the workers by then, so there is nothing left to report.
        try:
            feed = self.__dict__.get("_feed")
            if feed is not None:
                feed.release()
        except Exception:
            pass

    # -- state ---------------------------------------------------------------------------
    def _describe_state(self) -> LoaderState:
        # The order that runs, not the one asked for: a source that streams runs
        # shuffle=True as a windowed shuffle, which a "global" loader must refuse.
        shuffle, window = self._feed.order_mode()
        return LoaderState(
            epoch=self._cursor.epoch,
            position=self._cursor.position,
            seed=self.seed,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            shuffle=shuffle,
            shuffle_window=window,
            dataset=self._feed.fingerprint(),
            num_samples=self._feed.num_samples,
            world_size=self.world_size,
            dataset_fields=self._feed.dataset_fields(),
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
        options = LoaderOptions.from_arguments(
            self.dataset,
            {**o.arguments(), "seed": seed},
            full_shuffle=o.full_shuffle,
            seed_from_torch=True,
        )
        self.__dict__["_initialized"] = False  # _setup sets the frozen attributes again
        self._setup(self.dataset, options)

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
        (see iolib.loader.stages.StageLoader for the options)."""
        from iolib.loader.stages import StageLoader

        return StageLoader(self, stage, num_stages, microbatches=microbatches, **options)

    # -- observability -------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Throughput, consumer stall, stage times, memory in flight, workers and depth
        (and, for iolib's workers, `worker_pids`/`worker_threads`: the OS ids of those
        alive now)."""
        snapshot = self._feed.stats()
        snapshot.update(epoch=self._cursor.epoch, position=self._cursor.position)
        return snapshot

    @property
    def autotune(self) -> Any:
        """The online tuner (`iolib.tuning.autotune.AutoPrefetch`) of prefetch="auto" or a tuner
        object, once iteration started it; None otherwise."""
        return self._feed.autotune

    def set_prefetch(self, depth: int | None = None, workers: int | None = None) -> None:
        """Change the depth and/or worker count, also mid-epoch: pace and memory change,
        batch content does not."""
        if depth is not None:
            require_positive_int("depth", depth)
        if workers is not None:
            require_positive_int("workers", workers)
            if self.num_workers == 0:
                raise ConfigError("Cannot add workers to a loader built with num_workers=0.")
        self._feed.set_prefetch(depth, workers)
