"""Which batches an epoch holds: iolib's plan, or the user's sampler, as lazy task
sequences; and the `sampler` / `batch_sampler` objects a script sees on the loader.

Why lazy: a sampler may be infinite (detectron2's TrainingSampler) or expensive, and
torch draws from it only as batches are requested; the engine asks for a task only when
it submits one, a few batches ahead of the consumer.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from torch.utils.data import BatchSampler, Sampler

from iolib.errors import DataError
from iolib.fetcher import BatchTask
from iolib.plan import (
    EpochOrder,
    LaneOrder,
    Layout,
    OrderChoice,
    RankSchedule,
    choose_order,
    plan_order,
)
from iolib.sources.layout import warn_if_block_shuffle_sorted

# Batches' worth of spare samples a task carries under skip: the next batch's, then
# batches spread over the epoch, so a run of bad data shorter than 7/8 of the epoch
# (a long bad row group in a sequential read) still leaves good spares.
RESERVE_BATCHES = 8
KEPT_INDICES = 1 << 20  # sample indices of recent batches kept (8 MiB)
LOOKUP_BATCHES = 64  # batches whose indices one lookup computes


@dataclass
class Cursor:
    """Where the loader stands: the epoch, and global samples consumed in it (batches
    consumed, for a user's sampler). Shared by the loader and its default samplers."""

    epoch: int = 0
    position: int = 0


def as_keys(batch: Iterable[Any]) -> Any:
    """A batch of sampler keys: int64 indices when they are all integers (the common case,
    cheap to pass to workers), else the keys as a list (a dict-backed dataset's strings)."""
    items = list(batch)
    if all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in items):
        return np.fromiter(items, dtype=np.int64, count=len(items))
    return items


@dataclass(frozen=True)
class EpochPlan:
    """iolib's own order: a pure function of (dataset, seed, epoch, batch size, shuffle,
    rank, world size); see plan.py. `batch_size` None means one sample per task."""

    source: Any  # an iolib Source: its length and blocks, read on first use
    seed: int
    shuffle: str
    window: int
    batch_size: int | None
    world_size: int
    rank: int
    drop_last: bool
    # Batches' worth of spare samples each task carries for on_error="skip" (0: none,
    # so the loader's per-batch work and what goes to a process worker stay as small).
    reserve_batches: int = 0
    # shuffle=True lets a source that streams (more data than its cache) shuffle in
    # windows; shuffle="global", spelled out, keeps a full shuffle whatever it costs.
    windowed_ok: bool = True

    @property
    def num_samples(self) -> int:
        return len(self.source)

    @cached_property
    def layout(self) -> Layout:
        """What the source says of its samples (asked once; the source is not told
        anything back: one source may serve several loaders' plans)."""
        return self.source.layout()

    @cached_property
    def choice(self) -> OrderChoice:
        """The order this plan runs: the loader's, or the source's windowed one."""
        return choose_order(
            self.layout,
            self.shuffle,
            self.window,
            batch_size=self.batch_size or 1,
            world_size=self.world_size,
            windowed_ok=self.windowed_ok,
        )

    def read_epoch(self, epoch: int) -> int:
        """The epoch a batch's samples are read as: 0 for every pass of an unshuffled
        loader over samples that depend on the epoch (the same order each pass, as
        torch's); else the epoch."""
        return 0 if self.choice.shuffle == "none" and self.layout.epoch_samples else epoch

    def order(self, epoch: int) -> EpochOrder | LaneOrder:
        """Epoch `epoch`'s order, computed per position (O(blocks) memory)."""
        if self.shuffle == "block":  # a few classes per batch over label-sorted shards
            warn_if_block_shuffle_sorted(self.source)
        return plan_order(self.layout, self.num_samples, self.seed, epoch, self.choice)

    def order_fields(self) -> dict[str, str]:
        """What of the order a resume must match beyond the loader's options: the lanes
        (resolved from "auto"), where the source deals its samples to lanes."""
        if self.layout.lanes == 1:
            return {}
        return {"lanes": str(self.choice.lanes)}

    def schedule(self, position: int = 0, *, drop_last: bool | None = None) -> RankSchedule:
        return RankSchedule(
            self.num_samples,
            position,
            self.batch_size or 1,
            self.world_size,
            self.rank,
            self.drop_last if drop_last is None else drop_last,
        )

    def tasks(self, epoch: int, position: int) -> EpochTasks:
        if self.num_samples == 0:
            raise DataError(
                f"{self.source.describe()} has no samples: there is nothing to load. Check "
                "the files and filters."
            )
        read_epoch = self.read_epoch(epoch)
        tasks = EpochTasks(self.order(epoch), self.schedule(position), read_epoch,
                           self.reserve_batches)  # fmt: skip
        # The source learns every batch ahead (a cache evicts by next use, not recency).
        self.source.plan_epoch(read_epoch, tasks.batch_indices(self.choice, self.world_size))
        return tasks


class EpochTasks:
    """Batch k of one epoch for this rank, computed on demand (a lazy Sequence)."""

    def __init__(
        self, order: EpochOrder, schedule: RankSchedule, epoch: int, reserve_batches: int = 0
    ) -> None:
        self.order, self.schedule, self.epoch = order, schedule, epoch
        self.reserve_batches = reserve_batches
        self._kept: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()
        self._len = len(schedule)  # asked for every batch

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, k: int) -> BatchTask:
        indices = self._kept.get(k)  # indices(k)'s own lookup first: a call less a batch
        if indices is None:
            indices = self.indices(k)  # raises IndexError outside 0..len - 1
        reserve = self._reserve(self.schedule.positions(k)) if self.reserve_batches else None
        return BatchTask(k, indices, self.epoch, reserve)

    def indices(self, k: int) -> np.ndarray:
        """Batch k's sample indices (read-only), looked up with the batches after it and
        kept a while: a source that reads ahead asks for each batch before the engine
        does, and a block shuffle's lookup costs as much for 64 batches as for one."""
        found = self._kept.get(k)  # one dict lookup is atomic: the lock guards the writes
        if found is not None:
            return found
        full = self.schedule.full_batches
        if k < full:
            count = min(LOOKUP_BATCHES, full - k)
            rows = self.order[self.schedule.rows(k, count).reshape(-1)].reshape(count, -1)
        else:
            rows = self.order[self.schedule.positions(k)][None, :]
        rows.flags.writeable = False
        with self._lock:
            for j, row in enumerate(rows):
                self._kept.setdefault(k + j, row)
            while len(self._kept) * rows.shape[1] > KEPT_INDICES and len(self._kept) > 1:
                del self._kept[next(iter(self._kept))]
        return rows[0]

    def _reserve(self, positions: np.ndarray) -> np.ndarray | None:
        """Spare samples, a batch's worth at a time: the batch after this one, then
        batches an eighth of the epoch apart (wrapping), a pure function of the plan, so
        a refilled batch is the same on every run and a long run of bad samples right
        after this batch does not take every spare with it."""
        if not self.reserve_batches:
            return None
        total, size = len(self.order), len(positions)
        after = int(positions[-1]) + 1
        starts = after + (np.arange(self.reserve_batches) * total) // self.reserve_batches
        spare = (starts[:, None] + np.arange(size)[None, :]).reshape(-1) % total
        return self.order[spare]

    def position_after(self, delivered: int) -> int:
        return self.schedule.position_after(delivered)

    def batch_indices(
        self, choice: OrderChoice | None = None, world_size: int = 1
    ) -> _BatchIndices:
        """The sample indices of each batch, as a lazy sequence (with the order it
        follows, for a source that reads ahead along it)."""
        return _BatchIndices(self, choice, world_size)


class _BatchIndices:
    def __init__(self, tasks: EpochTasks, choice: OrderChoice | None, world_size: int) -> None:
        self.tasks, self.choice, self.world_size = tasks, choice, world_size

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, k: int) -> np.ndarray:
        return self.tasks.indices(k)


class StreamTasks:
    """Tasks drawn lazily from an iterator of batches (a user's sampler or batch_sampler).

    `len()` is the tasks drawn so far plus one more looked ahead while the iterator lasts,
    so the engine submits up to its depth and learns the end when the iterator ends; an
    infinite sampler never ends and is never read further than the engine's depth."""

    _KEEP = 4096  # tasks kept behind the newest one asked for (error messages look back)

    def __init__(
        self, batches: Iterator[Any], epoch: int, start: int, reserve: bool = False
    ) -> None:
        self._batches, self.epoch, self._start = batches, epoch, start
        self._reserve = reserve  # the batch before is a task's reserve (on_error="skip")
        self._tasks: dict[int, BatchTask] = {}
        self._drawn = 0
        self._asked = -1
        self._ended = False

    def _draw(self) -> None:
        try:
            keys = as_keys(next(self._batches))
        except StopIteration:
            self._ended = True
            return
        k = self._drawn
        previous = self._tasks.get(k - 1)
        spare = previous.indices if previous is not None and self._reserve else None
        self._tasks[k] = BatchTask(k, keys, self.epoch, spare)
        self._tasks.pop(k - self._KEEP, None)
        self._drawn += 1

    def __len__(self) -> int:
        if not self._ended and self._drawn <= self._asked + 1:
            self._draw()
        return self._drawn

    def __getitem__(self, k: int) -> BatchTask:
        while k >= self._drawn and not self._ended:
            self._draw()
        if k not in self._tasks:
            raise IndexError(f"batch {k} is not (or no longer) available")
        self._asked = max(self._asked, k)
        return self._tasks[k]

    def position_after(self, delivered: int) -> int:
        return self._start + delivered


def sampler_batches(
    sampler: Any, batch_sampler: Any, batch_size: int | None, drop_last: bool, skip: int
) -> Iterator[Any]:
    """The user's batches for one pass, lazily, after skipping `skip` of them (resume).
    The sampler is iterated afresh on each pass, as torch does; its epoch is the
    script's business (set_epoch), never the loader's."""
    if batch_sampler is not None:
        batches: Iterator[Any] = iter(batch_sampler)
    elif batch_size is None:
        batches = ([key] for key in sampler)
    else:
        batches = _chunks(iter(sampler), batch_size, drop_last)
    return itertools.islice(batches, skip, None)


def _chunks(keys: Iterator[Any], size: int, drop_last: bool) -> Iterator[list[Any]]:
    while True:
        chunk = list(itertools.islice(keys, size))
        if not chunk or (drop_last and len(chunk) < size):
            return
        yield chunk


class PlanSampler(Sampler[int]):
    """`loader.sampler` when none was given: this rank's samples of the current epoch,
    in iolib's order, before `drop_last` (which, as in torch, the batch sampler applies),
    so `len(loader.sampler)` and iterating it mean what they do in torch."""

    def __init__(self, plan: EpochPlan, cursor: Cursor) -> None:
        self.plan, self.cursor = plan, cursor

    def __iter__(self) -> Iterator[int]:
        order = self.plan.order(self.cursor.epoch)
        schedule = self.plan.schedule(drop_last=False)
        for k in range(len(schedule)):
            yield from order[schedule.positions(k)].tolist()

    def __len__(self) -> int:
        schedule = self.plan.schedule(drop_last=False)
        batches = len(schedule)
        if not batches:
            return 0
        return (batches - 1) * schedule.batch_size + len(schedule.positions(batches - 1))


class PlanBatchSampler(BatchSampler):
    """`loader.batch_sampler` when none was given: this rank's batches of the current
    epoch, exactly as the loader delivers them."""

    def __init__(self, sampler: PlanSampler, batch_size: int, drop_last: bool) -> None:
        # BatchSampler's own checks already ran on these values (LoaderOptions).
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        plan, cursor = self.sampler.plan, self.sampler.cursor
        order, schedule = plan.order(cursor.epoch), plan.schedule()
        for k in range(len(schedule)):
            yield order[schedule.positions(k)].tolist()

    def __len__(self) -> int:
        return len(self.sampler.plan.schedule())
