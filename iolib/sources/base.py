"""The protocol every source follows: a length, a fingerprint and batched reads.

Why batched: reading one sample at a time costs one Python call (and often one storage
request) per sample; sources read a whole batch of indices at once, so Parquet can
slice row groups in Arrow instead of building per-sample objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np

from iolib.base.redact import Redactor
from iolib.errors import refuse_loader_arguments
from iolib.plan import Layout


class Source(ABC):
    """An immutable, picklable description of a dataset that can read batches.

    Construction must be cheap: list files and read footers on first use, and never keep
    open files across pickling (workers reopen from the URL and options).
    """

    #: True when `read` returns a pyarrow Table (collated column by column).
    columnar: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Source:
        refuse_loader_arguments(cls, kwargs)  # batch_size= here: say it is DataLoader's
        return super().__new__(cls)

    @abstractmethod
    def __len__(self) -> int:
        """Number of samples."""

    @abstractmethod
    def fingerprint(self) -> str:
        """A short hash of what defines the sample order (files, row counts), for
        validating a restored state."""

    @abstractmethod
    def read(self, indices: np.ndarray, *, epoch: int = 0) -> Any:
        """Read the samples at `indices` (int64, batch order; a map-style Dataset also takes
        a list of other keys): a pyarrow Table with rows in that order for columnar sources,
        else a list of samples. `epoch` keys any per-sample randomness a source applies."""

    def read_batch(self, indices: np.ndarray, *, epoch: int, batch: int) -> Any:
        """`read`, told that these are batch `batch` of the plan `plan_epoch` was given
        for `epoch` (a source that reads ahead along the plan need not search for it).
        Default: `read`."""
        return self.read(indices, epoch=epoch)

    def check_batch(self, data: Any, indices: Any) -> None:
        """Raise DataError for values the loader's batch cannot hold (a columnar source's
        nulls in a number column); reading itself stays raw for other users of `read`."""
        return None

    def blocks(self) -> tuple[int, ...]:
        """Contiguous blocks (row groups) in sample order, for block shuffling; () if none."""
        return ()

    def redactor(self) -> Redactor:
        """What hides this source's credentials (in its URLs and options) in messages;
        default: the generic rules only (key=value pairs, URL passwords)."""
        return Redactor()

    def close(self) -> None:
        """Let go of threads and caches now (a later read starts them again)."""
        return None

    def cancel_reads(self) -> None:
        """Drop queued reads (read-ahead, a batch's reads in parallel): the loader that
        asked for them was closed, dropped or left. What is held stays. Default: none."""
        return None

    def layout(self) -> Layout:
        """What the loader's plan needs to know of this source's samples, once, as a value
        (`iolib.plan.Layout`): its blocks and, for sources that stream, the windowed order
        a shuffled loader runs and the lanes. The plan makes the order from it; a source
        never learns the loader's options. Default: its `blocks()`, nothing more."""
        return Layout(blocks=tuple(self.blocks()))

    def check_loader(self, options: Any) -> None:
        """Refuse loader options this source cannot serve (a source whose samples are
        batches refuses batching them), with what to pass instead. Default: none."""
        return None

    def fit_cache(self, row_groups: int) -> int:
        """Size any read cache to hold `row_groups` blocks; sources without one ignore it."""
        return 0

    def plan_epoch(self, epoch: int, batches: Sequence[np.ndarray]) -> None:
        """The epoch's batches on this rank, ahead of their reads (`batches[k]`: sample
        indices of batch k), from iolib's plan; a cache may use them. From the loader's
        plan, `batches.choice` is the order it runs (`plan.OrderChoice`: mode, lanes,
        granule) and `batches.world_size` its world size. Default: ignored."""
        return None

    def cache_stats(self) -> dict[str, int]:
        """Counts of a read cache (reads, re-reads, hits), for `loader.stats()`."""
        return {}

    def with_seed(self, seed: int) -> Source:
        """This source under the loader's `seed`, for sources whose samples depend on it
        (packed token windows); others are returned as they are."""
        return self

    def locate(self, index: int) -> str:
        """Where sample `index` lives, for error messages."""
        return f"sample {index}"

    def describe(self) -> str:
        """One line naming the dataset, for error messages and reports."""
        return type(self).__name__

    def __getitem__(self, index: int) -> Any:
        """One sample, so a source also works as a map-style torch Dataset."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        index = index % len(self)
        batch = self.read(np.array([index], dtype=np.int64))
        if self.columnar:
            return {name: values[0] for name, values in batch.to_pydict().items()}
        return batch[0]
