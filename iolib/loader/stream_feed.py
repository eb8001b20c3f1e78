"""IterableDatasets, iterated exactly as torch iterates them.

Why torch's own DataLoader does the work here: an IterableDataset decides its own order
and sharding (each worker runs a copy and reads `get_worker_info()`), so there is no
plan for iolib to own; torch's worker loop already gives those semantics, and a second
implementation could only drift from them. What iolib adds: worker seeds drawn from the
loader's `seed` (so a run repeats), a cursor (batches consumed) for `state_dict()`, and
telemetry in `stats()`. Resume re-reads the stream and drops the batches already
consumed: exact when the dataset yields the same stream each pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, Sampler
from torch.utils.data import DataLoader as TorchDataLoader

from iolib.engine.telemetry import Telemetry
from iolib.errors import ConfigError
from iolib.fetcher import BatchMeta
from iolib.loader.options import LoaderOptions
from iolib.loader.sampling import Cursor


class _InfiniteConstantSampler(Sampler[None]):
    """`loader.sampler` for an IterableDataset, as in torch: it yields None forever."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class StreamFeed:
    """Runs an IterableDataset through torch's DataLoader with the loader's options (the
    `iolib.loader.feeds.Feed` protocol: the cursor counts batches, the fingerprint is the
    dataset's type)."""

    # What a script sees on the loader, as torch sets it for an IterableDataset.
    rank, world_size, worker_mode = 0, 1, "process"
    num_samples = 0  # no bound on the cursor: a stream's length is its own business

    def __init__(self, dataset: Any, options: LoaderOptions) -> None:
        sample, pace = options.sample, options.pace
        unsupported = [
            name for name in ("transform", "decode") if getattr(sample, name) is not None
        ]
        if pace.prefetch is not None or sample.on_error != "raise":
            unsupported.append("prefetch" if pace.prefetch is not None else "on_error")
        if unsupported:
            raise ConfigError(
                f"{unsupported} are not supported with an IterableDataset (iolib cannot plan "
                "its samples): apply them inside the dataset, or give it __getitem__ and "
                "__len__ to use them."
            )
        self.dataset, self.options = dataset, options
        self.cursor = Cursor()  # batches consumed in the epoch
        self.sampler = _InfiniteConstantSampler()
        self.batch_sampler = (
            BatchSampler(self.sampler, options.batch_size, options.drop_last)
            if options.batch_size is not None
            else None
        )
        self.telemetry = Telemetry()
        self._torch: TorchDataLoader | None = None

    def _loader(self) -> TorchDataLoader:
        if self._torch is None:
            o = self.options
            generator = o.generator or torch.Generator().manual_seed(o.seed)
            self._torch = TorchDataLoader(
                self.dataset,
                batch_size=o.batch_size,
                # an IterDataPipe takes shuffle (torch applies it to the pipe's shufflers)
                shuffle=(o.shuffle != "none") if o.datapipe else None,
                num_workers=o.num_workers,
                collate_fn=o.collate_fn,
                pin_memory=o.pin_memory,
                drop_last=o.drop_last,
                timeout=o.timeout,
                worker_init_fn=o.worker_init_fn,
                multiprocessing_context=o.multiprocessing_context,
                generator=generator,
                prefetch_factor=o.prefetch_factor,
                persistent_workers=o.persistent_workers,
                pin_memory_device=o.pin_memory_device,
                in_order=o.in_order,
            )
        return self._torch

    def __len__(self) -> int:
        return len(self._loader())

    def begin(self, owner: Any = None) -> Iterator[Any]:
        self.telemetry.start_epoch()
        return _StreamIterator(iter(self._loader()), self.cursor, self.telemetry, owner)

    def close(self) -> None:
        loader, self._torch = self._torch, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()  # persistent workers, as torch's own __del__ does

    def release(self) -> None:
        """Nothing to do when the loader is dropped: torch's loader stops its workers."""

    def fingerprint(self) -> str:
        kind = type(self.dataset)
        return f"{kind.__module__}.{kind.__qualname__}"

    def dataset_fields(self) -> dict[str, str]:
        return {}

    def order_mode(self) -> tuple[str, int]:
        return self.options.shuffle, self.options.order.shuffle_window

    def stats(self) -> dict[str, Any]:
        snapshot = self.telemetry.snapshot()
        snapshot.update(workers=self.options.num_workers, worker_mode="torch")
        return snapshot

    @property
    def autotune(self) -> None:
        return None  # prefetch (and so a tuner) is refused above

    def set_prefetch(self, depth: int | None, workers: int | None) -> None:
        raise ConfigError("set_prefetch() is not available for an IterableDataset.")


class _StreamIterator:
    def __init__(
        self, batches: Iterator[Any], cursor: Cursor, telemetry: Telemetry, owner: Any
    ) -> None:
        self._owner = owner  # the loader lives while its iterator does, as in torch
        self._batches, self._cursor, self._telemetry = batches, cursor, telemetry
        self._epoch, self._skip = cursor.epoch, cursor.position

    def __iter__(self) -> _StreamIterator:
        return self

    def __next__(self) -> Any:
        for _ in range(self._skip):  # resume: the stream again, without what was consumed
            self._pull()
        self._skip = 0
        requested = time.perf_counter()
        try:
            batch = self._pull()
        except StopIteration:
            self._telemetry.on_request(requested)  # the last batch's step
            raise
        self._cursor.position += 1
        self._telemetry.record(requested, time.perf_counter(), BatchMeta(samples=1), 0)
        return batch

    def _pull(self) -> Any:
        try:
            return next(self._batches)
        except StopIteration:
            if self._cursor.epoch == self._epoch:
                self._cursor.epoch, self._cursor.position = self._epoch + 1, 0
            raise
