"""Parquet shards through fsspec and pyarrow, read by row group: `ParquetSource`.

A source is a facade over two objects (docs/architecture.md): an immutable description
of the data (`parquet_description`: files, footers, row-group index, options) which is
all that pickles into a worker, and a reader that each worker builds from it
(`parquet_reader`: row-group cache, reads in flight, read-ahead, the in-memory store,
open files). Storage is asked for the selected column chunks' bytes only, a batch's row
groups of one file in one request (`iolib.sources.ranges`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import pyarrow as pa

from iolib.base.redact import Redactor
from iolib.collate import ListFormat
from iolib.errors import DataError
from iolib.plan import Layout
from iolib.sources.base import Source
from iolib.sources.dense import DenseColumns
from iolib.sources.parquet_description import MIN_CACHE_BYTES, ParquetDescription
from iolib.sources.parquet_reader import ParquetReader
from iolib.sources.schemas import null_numbers
from iolib.storage import RetryPolicy

if TYPE_CHECKING:
    from iolib.sources.parquet_files import FileMeta

__all__ = ["MIN_CACHE_BYTES", "ParquetSource"]
log = logging.getLogger(__name__)


class ParquetSource(Source):
    """One or many Parquet files (a file, a list, a directory or a glob; any fsspec URL).

    Example::

        src = ParquetSource("s3://bucket/train/*.parquet", columns=["image", "label"],
                            storage_options={"anon": False})
        len(src), src[0]["label"]

    columns: the columns to read (None: all). Reading fewer columns reads fewer bytes.
    cache_bytes: bound on decoded row groups kept per process, counted in Arrow bytes
        (what they take in memory, estimated from the footers and checked against a
        measured read; not Parquet's encoded sizes). Default (None): the whole dataset
        when it takes under a quarter of the free memory (later epochs read nothing;
        fixed-width columns are then held as contiguous arrays, see
        `iolib.sources.dense`); else what the loader's shuffle mode needs: a window of row
        groups plus those in flight for "block", a few for sequential reads, the whole
        dataset (capped at half the free memory) for "global". The cache evicts the row
        group needed furthest ahead in the epoch plan, so too small a cache costs only
        the re-reads of what does not fit (`loader.stats()["row_group_rereads"]`).
    shuffle_window: decoded bytes (an int, or a size like "256MiB") that the loader's
        `shuffle=True` mixes together (default None: the whole dataset, a full shuffle).
        A dataset larger than it is shuffled within windows of as many row groups as it
        holds, windows in a random order (each row group read once an epoch). The order
        depends on it, never on `cache_bytes`; a given `cache_bytes` must hold two windows
        (or the whole dataset without one), else the loader refuses it with the sizes to
        change. `shuffle="global"` spelled out ignores it: a full shuffle that re-reads
        what the cache cannot hold.
    readahead: batches ahead whose row groups one background thread reads into the
        cache (or the in-memory store) while the current batch is assembled, where the
        budget has room (default 4; 0: off). It overlaps storage and decoding with the
        batch at hand; raising it costs cache room, never correctness.
    lists: how variable-length numeric list columns (token ids) become tensors:
        padded with a mask and lengths (default), jagged, or values + offsets
        (`iolib.collate.ListFormat`, docs/tokens.md).
    retry: how transient storage errors are retried and when a read counts as stuck
        (default RetryPolicy(): 5 attempts, 120 s per read).

    Credentials in the URLs or `storage_options` never appear in its messages or logs.
    """

    columnar = True

    def __init__(
        self,
        urls: str | list[str],
        columns: list[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        *,
        cache_bytes: int | None = None,
        retry: RetryPolicy | None = None,
        lists: ListFormat | None = None,
        readahead: int = 4,
        shuffle_window: int | str | None = None,
    ) -> None:
        description = ParquetDescription.of(
            urls, columns, storage_options, cache_bytes, retry, lists, readahead, shuffle_window
        )
        self._start(description)

    def _start(self, description: ParquetDescription) -> None:
        self._description = description
        self._reader = ParquetReader(description)  # threads and files come on first use
        self._windowed_said = False
        # The row group read to measure decoded sizes, until the cache is sized: then it
        # is kept there (a 128 MB row group is not read again by the first batch).
        self._measured: tuple[int, pa.Table] | None = None

    # -- pickling: the description travels, each worker builds its own reader -----------
    def __getstate__(self) -> dict[str, Any]:
        return {"description": self._description}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._start(state["description"])

    def close(self) -> None:
        """Stop the read-ahead thread and drop the decoded row groups now; the
        description stays, and a later read starts again."""
        self._measured = None
        self._reader.close()
        pa.default_memory_pool().release_unused()

    @property
    def description(self) -> ParquetDescription:
        """What this source reads, as an immutable value (files listed and footers read
        on first use): what a worker receives."""
        if self._description.files is None:
            self._replace(self._description.indexed())
        return self._description

    @property
    def reader(self) -> ParquetReader:
        """This process's reader of the description (cache, read-ahead, open files)."""
        self.description  # noqa: B018 - a reader reads an indexed description
        return self._reader

    def _replace(self, description: ParquetDescription) -> None:
        self._description = description
        self._reader.update(description)

    # -- the options, as given -------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return list(self._description.urls)

    @urls.setter
    def urls(self, urls: list[str]) -> None:
        """Other URLs for the same files (another route to the same store)."""
        self._replace(self._description.with_changes(urls=tuple(urls)))

    @property
    def storage_options(self) -> dict[str, Any]:
        return self._description.storage_options

    @storage_options.setter
    def storage_options(self, options: dict[str, Any]) -> None:
        self._replace(self._description.with_changes(storage_options=dict(options)))

    @property
    def columns(self) -> list[str] | None:
        columns = self._description.columns
        return list(columns) if columns is not None else None

    @property
    def retry(self) -> RetryPolicy:
        return self._description.retry

    @property
    def lists(self) -> ListFormat | None:
        return self._description.lists

    @property
    def readahead(self) -> int:
        return self._description.readahead

    @property
    def shuffle_window(self) -> int | None:
        """Decoded bytes shuffle=True mixes together (None: the whole dataset)."""
        return self._description.shuffle_window

    @property
    def cache_bytes(self) -> int:
        """The row-group cache's bound in bytes (given, or set by `fit_cache`)."""
        return self._description.cache_bytes

    def with_columns(self, columns: list[str] | None) -> ParquetSource:
        """The same files with another column projection (footers are not re-read)."""
        return self._projected(columns)

    def uncached(self, columns: list[str]) -> ParquetSource:
        """The same files, `columns` alone, with no row-group cache and no read-ahead:
        for sources that keep what they read in their own form (`iolib.text`), through
        `fetch_row_group`. Footers are not re-read."""
        return self._projected(columns, cache_bytes=0, fixed_cache=True, readahead=0, lists=None)

    def _projected(self, columns: list[str] | None, **changes: Any) -> ParquetSource:
        description = self._description.with_changes(
            columns=tuple(columns) if columns is not None else None,
            keep_dense=False,
            sizes=None,
            decoded=None,
            **changes,
        )
        if description.files is not None:
            description.check_columns()
        clone = ParquetSource.__new__(ParquetSource)
        clone._start(description)
        return clone

    # -- metadata ------------------------------------------------------------------------
    @property
    def files(self) -> list[FileMeta]:
        """The files, their row groups and schemas (listed and read on first use)."""
        return list(self.description.files or ())

    def __len__(self) -> int:
        return int(self.description.row_starts[-1])

    def blocks(self) -> tuple[int, ...]:
        return self.description.blocks()

    def row_starts(self) -> np.ndarray:
        """The first sample of each row group (numbered across files), and the total."""
        return self.description.row_starts

    @property
    def schema(self) -> pa.Schema:
        """The dataset's Arrow schema, projected to `columns`: every file's columns, each
        typed as the first file that has it (see iolib.sources.schemas)."""
        return self.description.schema

    @property
    def drifted_files(self) -> dict[str, str]:
        """URL -> what differs, for files whose schema cannot join the dataset's: their
        row groups are refused (skipped and counted under on_error="skip")."""
        return self.description.drifted_files

    def fingerprint(self) -> str:
        """Paths, row counts, sizes, column chunk sizes and the store's version of each
        file: a corpus rewritten in place (same files, same row counts) is another one."""
        return self.description.fingerprint()

    def redactor(self) -> Redactor:
        return self.description.redact

    def describe(self) -> str:
        return self.description.describe()

    def locate(self, index: int) -> str:
        return self.description.locate(index)

    def block_of(self, index: int) -> int:
        """The row group (numbered across files) that holds sample `index`: a failed read
        fails every sample of its row group, so a skipping reader tries it once."""
        return self.description.block_of(index)

    # -- sizing the cache ----------------------------------------------------------------
    def estimated_bytes(self, *, measure: bool = True) -> list[int]:
        """Arrow bytes of each row group's projected columns, from the footers (exact for
        numbers, lists of numbers, and strings and binary written without a dictionary),
        scaled by a measured read where the estimate is approximate (dictionary-encoded
        strings, nested records) unless `measure` is False."""
        description = self.description
        sizes, exact = description.footer_estimates()
        if not exact and sizes and (measure or description.decoded is not None):
            if description.decoded is None:  # measure once: the table read is cached for use
                ratio = self._measured_ratio(sizes)
                self._replace(self._description.with_changes(decoded=ratio))
            decoded = self._description.decoded
            sizes = [int(size * decoded) for size in sizes]  # type: ignore[operator]
        return sizes

    def layout(self) -> Layout:
        """Row groups as blocks; where the decoded data is larger than `shuffle_window`,
        shuffle=True runs as a block shuffle over as many row groups as the window holds
        (said once in the log). A given `cache_bytes` too small for that is refused when a
        shuffled loader starts, before any read."""
        blocks = self.blocks()
        refusal = self.window_cache_refusal()
        window_groups = self.description.window_groups()
        if window_groups is None:
            return Layout(blocks=blocks, refusal=refusal)
        if not self._windowed_said:
            self._windowed_said = True
            log.info(
                "%s: the data is larger than shuffle_window (%d bytes decoded): shuffle=True is "
                "shuffled within windows of %d row groups, windows in a random order (raise "
                "shuffle_window to shuffle more widely).",
                self.describe(),
                self.shuffle_window,
                window_groups,
            )
        return Layout(blocks=blocks, modes=(("global", "block", window_groups),), refusal=refusal)

    def window_cache_refusal(self) -> str | None:
        """Why a given `cache_bytes` cannot hold what shuffle=True reads together (two
        windows, or the whole dataset without one), naming both sizes; None if it can."""
        description = self.description
        if not description.fixed_cache:
            return None  # sized by the loader (`fit_cache`)
        need, have = description.window_cache_bytes(), description.cache_bytes
        if have >= need:
            return None
        window = description.shuffle_window
        what = (
            f"shuffle_window={window} (two windows of row groups: this one and the next, "
            f"{need:,} bytes decoded)"
            if window is not None and description.window_groups() is not None
            else f"the whole dataset (shuffle_window={window}: {need:,} bytes decoded)"
        )
        return (
            f"{self.describe()}: cache_bytes={have} is too small for the shuffle of "
            f"{what}. Raise cache_bytes to at least {need}, or pass shuffle_window="
            f"{max(have // 2, 1)} or less (the order follows shuffle_window, never "
            "cache_bytes); shuffle='global' spelled out re-reads what does not fit instead."
        )

    def _measured_ratio(self, sizes: list[int]) -> float:
        """Arrow bytes over the footer's estimate, from the first of a few row groups that
        reads: planning must not fail on a bad row group that on_error="skip" would
        leave out (the batch that needs it reports or skips it). 1.0 if none reads."""
        for group in range(min(4, len(sizes))):
            try:
                table = self.row_group(group)
            except DataError as exc:
                log.info("%s: sizing the cache without row group %d: %s", self.describe(),
                         group, str(exc))  # fmt: skip
                continue
            self._reader.defer_counts()  # this thread makes no batch: the next one counts it
            self._measured = (group, table)
            return max(1.0, table.nbytes / max(sizes[group], 1))
        return 1.0

    def fit_cache(self, row_groups: int) -> int:
        """Size the row-group cache to hold `row_groups` of the largest row groups of the
        projected columns, in decoded bytes (unless `cache_bytes` was given). Returns the
        bound in bytes."""
        description = self.description
        if description.fixed_cache:  # the reader's bound; the estimates only guide read-ahead
            if not description.sizes:
                sizes = tuple(self.estimated_bytes(measure=False))
                self._replace(self._description.with_changes(sizes=sizes))
            return description.cache_bytes
        sizes = self.estimated_bytes()
        available = psutil.virtual_memory().available
        everything = int(1.1 * sum(sizes))
        keep_all = everything <= available // 4
        if keep_all:
            # The whole dataset fits easily: keep it, as a user holding a table in memory
            # would; epochs after the first then read nothing (decoding nested Parquet
            # columns runs at ~100-200 MB/s, slower than many disks). Fixed-width columns
            # are then kept as contiguous arrays, for one-copy batch gathers.
            row_groups = len(sizes)
        largest = sorted(sizes, reverse=True)[: min(row_groups, len(sizes))]
        want = int(1.1 * sum(largest))
        cap = available // 2
        if want > cap:
            log.warning(
                "%s: caching the %d row groups this shuffle needs takes %.1f GiB; capped at "
                "%.1f GiB. Batches will re-read row groups: use shuffle='block' or smaller "
                "row groups.",
                self.describe(),
                row_groups,
                want / 2**30,
                cap / 2**30,
            )
        bound = max(MIN_CACHE_BYTES, min(want, cap))
        dense = keep_all and DenseColumns.supports(self.schema)
        self._replace(
            self._description.with_changes(sizes=tuple(sizes), keep_dense=dense, cache_bytes=bound)
        )
        measured, self._measured = self._measured, None
        if measured is not None:
            self._reader.keep(*measured)
        return bound

    def plan_epoch(self, epoch: int, batches: Any) -> None:
        """The epoch's batches on this rank (`batches[k]`: sample indices), from the plan:
        the cache evicts by next use instead of recency."""
        self.reader.plan_epoch(epoch, batches)

    def cancel_reads(self) -> None:
        """Drop the queued reads; reads on the wire finish (`bytes_after_close`)."""
        self._reader.cancel()

    def cache_stats(self) -> dict[str, int]:
        """Row-group reads and re-reads (same row group, same epoch), cache hits and
        evictions, in this process."""
        return self._reader.cache_stats()

    # -- reads ---------------------------------------------------------------------------
    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        """Rows at `indices`, in that order, as one Arrow table: a fresh copy (collate hands
        its memory to tensors without copying again)."""
        return self._read(indices, epoch, None)

    def read_batch(self, indices: np.ndarray, *, epoch: int, batch: int) -> pa.Table:
        """`read` of batch `batch` of the plan (the cache and read-ahead follow it)."""
        return self._read(indices, epoch, batch)

    def _read(self, indices: np.ndarray, epoch: int, batch: int | None) -> pa.Table:
        indices = np.asarray(indices, dtype=np.int64)
        starts = self.description.row_starts
        if indices.size and (indices.min() < 0 or indices.max() >= starts[-1]):
            raise IndexError(f"sample indices outside 0..{starts[-1] - 1}")
        table = self._reader.read(indices, epoch, batch)
        lists = self._description.lists
        return lists.tag(table) if lists is not None else table

    def check_batch(self, table: pa.Table, indices: np.ndarray) -> None:
        """A null in a number or boolean column is an error naming the samples (no tensor
        holds a null, and 0 would be a silent lie); under on_error="skip" those samples
        alone are left out, not their row group."""
        indices = np.asarray(indices, dtype=np.int64)
        for name, rows in null_numbers(table).items():
            samples = [int(i) for i in indices[rows]]
            kind = self.schema.field(name).type
            raise DataError(
                f"Column {name!r} ({kind}) is null in {len(samples)} of the batch's rows, first "
                f"at {self.locate(samples[0])}: a tensor cannot hold a null. Fill the column "
                "when writing the data, or pass on_error='skip' to leave those rows out.",
                samples=samples,
                column=name,
                whole_block=False,
            )

    def row_group(self, group: int) -> pa.Table:
        """Row group `group` (numbered across files) of the projected columns, through
        the cache: for sources built on this one (`iolib.text`)."""
        self._check_group(group)
        return self._reader.row_group(group)

    def fetch_row_group(
        self, group: int, *, needed: bool = False, read_as: Mapping[str, pa.DataType] | None = None
    ) -> pa.Table:
        """Row group `group` (numbered across files) of the projected columns, read from
        storage with retries and counted, bypassing the cache: for sources that keep
        what they read in their own form (`iolib.text`), copied out on this thread.
        `needed`: a batch waits for it (a large one is read in parallel pieces);
        `read_as`: columns decoded as a narrower type (a value it cannot hold: DataError)."""
        self._check_group(group)
        return self._reader.fetch_row_group(group, needed=needed, read_as=read_as)

    def _check_group(self, group: int) -> None:
        last = len(self.description.row_starts) - 2
        if not 0 <= group <= last:
            raise IndexError(f"row group {group} outside 0..{last}")
