"""Parquet shards through fsspec and pyarrow, read by row group.

A batch's indices are grouped by row group; each row group is read once (with column
projection) and cached per process, sized from decoded Arrow bytes and evicted by next
use in the epoch plan (`iolib.sources.rgcache`), so a block-shuffled epoch reads each
row group once. Storage is asked for the selected column chunks' bytes only, a
batch's row groups of one file in one request (`iolib.sources.ranges`). Rows are taken
from the Arrow tables without Python per-row work.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from iolib.collate import ListFormat, is_numeric_list
from iolib.errors import ConfigError, DataError
from iolib.forks import reset_after_fork
from iolib.redact import Redactor
from iolib.sources.base import Source
from iolib.sources.dense import DenseColumns
from iolib.sources.footer import arrow_bytes, column_sizes, exact_size, leaf_values
from iolib.sources.ranges import MAX_REQUEST_BYTES, RangedFile, Span, coalesce, column_spans
from iolib.sources.rgcache import EpochUses, PlannedCache
from iolib.sources.schemas import conform, drifted, null_numbers, unified_schema
from iolib.sources.summary import SummarizedFile, read_summary, version_of
from iolib.storage import (
    RetryPolicy,
    call_with_retries,
    count_bytes,
    open_filesystem,
    take_counters,
)
from iolib.storage.counters import count_retries

_GLOB_CHARS = "*?["
# What Arrow says of undecodable bytes (thrift headers, pages, magic, compression).
_CORRUPT_WORDS = re.compile(r"deseriali|corrupt|invalid|magic|decompress|page header", re.I)


def _is_corrupt(exc: BaseException) -> bool:
    """Bytes Arrow cannot decode (permanent), as opposed to a failed request (transient).
    Arrow reports undecodable pages as a bare OSError (an IOError status); storage errors
    reach it as their own subclasses (ConnectionResetError...) or with an errno."""
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)):
        return True
    return type(exc) is OSError and exc.errno is None and bool(_CORRUPT_WORDS.search(str(exc)))


MIN_CACHE_BYTES = 64 * 2**20
FETCH_THREADS = 8  # a batch's row-group reads in flight at once
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _FileMeta:
    url: str  # protocol-qualified path, for messages
    path: str  # path within the filesystem
    row_groups: tuple[int, ...]  # rows per row group
    size: int  # bytes
    schema: pa.Schema
    root: int  # which of the source's URLs it came from (for its filesystem)
    column_bytes: tuple[dict[str, int], ...]  # compressed bytes per column, per row group
    column_raw_bytes: tuple[dict[str, int], ...]  # uncompressed bytes, per row group
    # The parsed footer, shared by every reader of the file: a worker opening it reads
    # no footer of its own (two round trips on object storage, 106 ms measured).
    footer: pq.FileMetaData
    spans: tuple[dict[str, tuple[Span, ...]], ...]  # column chunks' byte ranges, per row group
    version: str = ""  # what the store says changes with the content: ETag, else mtime
    # Row group `local` of this file is row group `first_group + local` of `footer` (a
    # directory's `_metadata` summary holds every file's row groups in one footer).
    first_group: int = 0

    def group_meta(self, local: int) -> pq.RowGroupMetaData:
        return self.footer.row_group(self.first_group + local)


def _null_items(column: pa.ChunkedArray) -> bool:
    """Whether any list of `column` holds a null item (null rows themselves are allowed)."""
    return any(chunk.flatten().null_count for chunk in column.chunks)


def _version(fs: Any, path: str, handle: Any) -> str:
    """What the store says changes with a file's content (`summary.version_of`): from
    the request that opened it, or a stat for a local file."""
    details = getattr(handle, "details", None)
    if not isinstance(details, dict) and getattr(fs, "protocol", None) in (
        "file",
        ("file", "local"),
    ):
        details = fs.info(path)  # a stat: no request
    return version_of(details)


class _Flight:
    """One row-group read that other threads wait on."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.table: pa.Table | None = None
        self.error: BaseException | None = None


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
    ) -> None:
        self.retry = retry or RetryPolicy()
        self.lists = lists
        if isinstance(readahead, bool) or not isinstance(readahead, int) or readahead < 0:
            raise ConfigError(f"`readahead` must be an integer >= 0. Found: {readahead!r}.")
        self.readahead = readahead
        self.urls = [urls] if isinstance(urls, str) else list(urls)
        if not self.urls or any(not isinstance(u, str) or not u.strip() for u in self.urls):
            raise ConfigError(
                f"`urls` must name Parquet files: a file, directory, glob or a list of them. "
                f"Found: {urls!r} (an empty path would read the current directory)."
            )
        self.columns = list(columns) if columns is not None else None
        self.storage_options = dict(storage_options or {})
        self._fixed_cache = cache_bytes is not None
        self._dense_wanted = False  # set by fit_cache when the whole dataset is kept
        self.cache_bytes = cache_bytes if cache_bytes is not None else MIN_CACHE_BYTES
        self._files: list[_FileMeta] | None = None
        self._decoded: float | None = None  # measured Arrow bytes / estimate (a first read)
        self._sizes: list[int] | None = None  # estimated Arrow bytes per row group
        self._init_runtime()

    # -- pickling: drop open handles and caches, keep the description and footers --------
    def _init_runtime(self) -> None:
        self._redact = Redactor(self.urls, self.storage_options)
        self._lock = threading.Lock()
        self._cache = PlannedCache(self.cache_bytes, lambda t: t.nbytes)
        self._rereads_warned = False
        self._ahead: ThreadPoolExecutor | None = None  # the read-ahead thread, made on use
        self._fetchers: ThreadPoolExecutor | None = None  # a batch's reads in parallel
        self._ahead_sent: set[tuple[int, int]] = set()  # (epoch, row group) submitted
        self._ahead_io = (0, 0)  # bytes and retries read ahead, not yet in a batch's count
        self._local = threading.local()
        self._in_flight: dict[int, _Flight] = {}
        self._dense: DenseColumns | None = None
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked worker: the parent's threads are gone, and with them the reads
        they had in flight, the read-ahead thread and any lock they held. What was read
        stays (the in-memory store is shared copy-on-write)."""
        self._lock = threading.Lock()
        self._cache = PlannedCache(self.cache_bytes, lambda t: t.nbytes)
        self._ahead, self._ahead_sent, self._ahead_io = None, set(), (0, 0)
        self._fetchers = None
        self._local = threading.local()
        self._in_flight = {}
        if self._dense is not None:
            self._dense.after_fork()

    def close(self) -> None:
        """Stop the read-ahead thread and drop the decoded row groups now; the
        description stays, and a later read starts again."""
        with self._lock:
            pools = [self._ahead, self._fetchers]
            self._ahead = self._fetchers = None
            self._cache = PlannedCache(self.cache_bytes, lambda t: t.nbytes)
            self._dense, self._ahead_sent = None, set()
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        pa.default_memory_pool().release_unused()

    def __getstate__(self) -> dict[str, Any]:
        keep = ("urls", "columns", "storage_options", "cache_bytes", "_fixed_cache", "_files")
        keep += ("_dense_wanted",)
        keep += ("retry", "lists", "_decoded", "readahead", "_sizes")
        keep += ("_starts", "_groups")
        return {k: v for k, v in self.__dict__.items() if k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def with_columns(self, columns: list[str] | None) -> ParquetSource:
        """The same files with another column projection (footers are not re-read)."""
        clone = ParquetSource(
            self.urls,
            columns,
            self.storage_options,
            retry=self.retry,
            lists=self.lists,
            readahead=self.readahead,
        )
        clone.cache_bytes, clone._fixed_cache = self.cache_bytes, self._fixed_cache
        clone._init_runtime()
        if self._files is not None:
            clone._files, clone._starts, clone._groups = self._files, self._starts, self._groups
            clone._check_columns()
        return clone

    # -- metadata ------------------------------------------------------------------------
    @property
    def files(self) -> list[_FileMeta]:
        """The files, their row groups and schemas (listed and read on first use)."""
        if self._files is None:
            per_root = [self._summarized(root, url) for root, url in enumerate(self.urls)]
            paths = [
                p
                for root, url in enumerate(self.urls)
                if per_root[root] is None
                for p in self._expand(root, url)
            ]
            # Footers cost a request or two each: many in flight (latency, not bandwidth).
            with ThreadPoolExecutor(max_workers=max(1, min(64, len(paths)))) as pool:
                read = iter(pool.map(self._read_footer, paths))
            files = [
                f
                for root, found in enumerate(per_root)
                for f in (found if found is not None else
                          [next(read) for p in paths if p[2] == root])
            ]  # fmt: skip
            self._starts = np.cumsum([0] + [n for f in files for n in f.row_groups])
            self._groups = [(f, i) for f in files for i in range(len(f.row_groups))]
            self._files = files
            self._check_columns()
        return self._files

    def _summarized(self, root: int, url: str) -> list[_FileMeta] | None:
        """A directory's files from its `_metadata` summary, where it has a valid one."""
        if any(c in url for c in _GLOB_CHARS) or url.endswith((".parquet", ".pq")):
            return None
        fs, path = open_filesystem(url, self.storage_options)
        protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
        found = call_with_retries(
            lambda: read_summary(fs, path) if fs.isdir(path) else None,
            what=f"reading the _metadata summary of {self._redact(url)!r}",
            policy=self.retry,
            redact=self._redact,
        )
        if found is None:
            return None
        meta, files = found
        schema = meta.schema.to_arrow_schema()
        return [self._summarized_file(root, protocol, meta, schema, f) for f in files]

    def _summarized_file(
        self, root: int, protocol: str, meta: pq.FileMetaData, schema: pa.Schema,
        f: SummarizedFile,
    ) -> _FileMeta:  # fmt: skip
        groups = [meta.row_group(f.first_group + i) for i in range(f.groups)]
        return _FileMeta(
            self._redact(protocol + f.path), f.path, tuple(g.num_rows for g in groups),
            f.size, schema, root, tuple(column_sizes(g, True) for g in groups),
            tuple(column_sizes(g, False) for g in groups), meta,
            tuple(column_spans(g) for g in groups), f.version, f.first_group,
        )  # fmt: skip

    def _expand(self, root: int, url: str) -> list[tuple[str, str, int]]:
        fs, path = open_filesystem(url, self.storage_options)
        protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
        shown = self._redact(url)
        found = call_with_retries(
            lambda: self._list(fs, path, shown),
            what=f"listing {shown!r}",
            policy=self.retry,
            redact=self._redact,
        )
        return [(shown if p == path else self._redact(protocol + p), p, root) for p in found]

    @staticmethod
    def _list(fs: Any, path: str, shown: str) -> list[str]:
        if any(c in path for c in _GLOB_CHARS):
            found = sorted(fs.glob(path))
            if not found:
                raise DataError(f"No Parquet files match {shown!r}. Check the pattern and bucket.")
            return found
        try:  # info, not exists()/isdir(): those answer False on a transient error
            kind = fs.info(path)["type"]
        except FileNotFoundError:
            raise DataError(
                f"Parquet source {shown!r} does not exist. Check the path (and credentials "
                "in storage_options for remote storage)."
            ) from None
        if kind != "directory":
            return [path]
        # The directory's own files only: a data/ holding train/ and val/ must not mix
        # them. Recursion is a glob away: data/**/*.parquet.
        entries = fs.ls(path, detail=True)
        found = sorted(
            e["name"]
            for e in entries
            if e.get("type") == "file" and e["name"].endswith((".parquet", ".pq"))
        )
        if not found:
            folders = [
                e["name"].rstrip("/").rsplit("/", 1)[-1]
                for e in entries
                if e.get("type") == "directory"
            ]
            hint = (
                f" It has folder(s) {sorted(folders)[:5]}: name one, or read them all with a "
                f"glob such as {shown.rstrip('/')}/**/*.parquet."
                if folders
                else ""
            )
            raise DataError(f"Directory {shown!r} holds no *.parquet files.{hint}")
        return found

    def _read_footer(self, where: tuple[str, str, int]) -> _FileMeta:
        url, path, root = where
        fs, _ = open_filesystem(self.urls[root], self.storage_options)

        def footer() -> tuple[Any, int, str]:
            with fs.open(path, "rb") as handle:
                size = getattr(handle, "size", None)  # fsspec's files know it: no request
                size = size if isinstance(size, int) else fs.size(path)
                version = _version(fs, path, handle)
                return pq.ParquetFile(handle, pre_buffer=False).metadata, size, version

        try:  # transient errors are retried; a truncated or foreign file fails at once
            what = f"reading the footer of {url!r}"
            meta, size, version = call_with_retries(
                footer, what=what, policy=self.retry, redact=self._redact
            )
            schema = meta.schema.to_arrow_schema()
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, OSError) and not _is_corrupt(exc):
                raise  # storage failed (named by the retries), not the data
            raise DataError(
                f"Cannot read the Parquet footer of {url!r}: {self._redact(str(exc))}. The file "
                "is truncated, corrupt or not Parquet; rewrite it or leave it out of `urls`."
            ) from (None if self._redact.changes(str(exc)) else exc)
        groups = tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
        compressed = tuple(column_sizes(meta.row_group(i), True) for i in range(len(groups)))
        raw = tuple(column_sizes(meta.row_group(i), False) for i in range(len(groups)))
        spans = tuple(column_spans(meta.row_group(i)) for i in range(len(groups)))
        return _FileMeta(
            url, path, groups, size, schema, root, compressed, raw, meta, spans, version
        )

    def _check_columns(self) -> None:
        """A requested column no file has is a mistake in `columns`; one that only some
        files lack is schema drift (see `drifted_files`). A `pad_id` the list columns
        cannot hold is refused here, before any batch."""
        files = self._files or []
        if self.lists is not None and files:
            for field in files[0].schema:
                if self.columns is None or field.name in self.columns:
                    self.lists.check_column(field.name, field.type)
        if self.columns is None:
            return
        present = {name for meta in files for name in meta.schema.names}
        missing = [c for c in self.columns if c not in present]
        if missing and files:
            raise DataError(
                f"No Parquet file of {self.describe()} has column(s) {missing}; the first has "
                f"{files[0].schema.names}. Fix `columns`."
            )

    def __len__(self) -> int:
        return int(self._rg_starts[-1])

    def estimated_bytes(self, *, measure: bool = True) -> list[int]:
        """Arrow bytes of each row group's projected columns, from the footers (exact for
        numbers and lists of numbers), scaled by a measured read where the estimate is
        approximate (strings, binary, nested records) unless `measure` is False."""
        sizes, exact = [], True
        for f in self.files:
            for local, rows in enumerate(f.row_groups):
                counts = leaf_values(f.group_meta(local))
                total = 0
                for c, raw in f.column_raw_bytes[local].items():
                    if (self.columns is None or c in self.columns) and c in f.schema.names:
                        field = f.schema.field(c)
                        total += arrow_bytes(field, rows, raw, counts.get(c, rows))
                        exact = exact and exact_size(field.type)
                sizes.append(total)
        if not exact and sizes and (measure or self._decoded is not None):
            if self._decoded is None:  # measure once: the table read is cached for use
                self._decoded = self._measured_ratio(sizes)
            sizes = [int(size * self._decoded) for size in sizes]
        return sizes

    def order_mode(self, shuffle: str, window: int) -> tuple[str, int]:
        """A global shuffle over more decoded data than a given `cache_bytes` would
        re-read row groups for nearly every batch: it becomes a block shuffle over as many
        row groups as the cache holds, said once in the log. The window then follows
        `cache_bytes` (and is part of the fingerprint)."""
        window_groups = self._cache_window() if shuffle == "global" else None
        if window_groups is None:
            return shuffle, window
        if not self.__dict__.get("_windowed_said"):
            self.__dict__["_windowed_said"] = True
            log.info(
                "%s: the data is larger than cache_bytes (%.0f MiB): shuffled within windows "
                "of %d row groups, windows in a random order (raise cache_bytes to shuffle "
                "more widely).",
                self.describe(),
                self.cache_bytes / 2**20,
                window_groups,
            )
        return "block", window_groups

    def _cache_window(self) -> int | None:
        """Half the row groups a given `cache_bytes` holds; None when no budget was given
        or the whole dataset fits in it."""
        if not self._fixed_cache or not self.cache_bytes:
            return None
        sizes = self.estimated_bytes(measure=False)
        if sum(sizes) <= self.cache_bytes or not sizes:
            return None
        # Half the cache for the window, half for the next one's read-ahead and the row
        # groups of batches in flight on other workers.
        return max(1, self.cache_bytes // max(max(sizes), 1) // 2)

    def _measured_ratio(self, sizes: list[int]) -> float:
        """Arrow bytes over the footer's estimate, from the first of a few row groups that
        reads: planning must not fail on a bad row group that on_error="skip" would
        leave out (the batch that needs it reports or skips it). 1.0 if none reads."""
        for group in range(min(4, len(sizes))):
            try:
                table = self.row_group(group)
            except DataError as exc:
                log.info("%s: sizing the cache without row group %d: %s", self.describe(),
                         group, exc)  # fmt: skip
                continue
            return max(1.0, table.nbytes / max(sizes[group], 1))
        return 1.0

    def fit_cache(self, row_groups: int) -> int:
        """Size the row-group cache to hold `row_groups` of the largest row groups of the
        projected columns, in decoded bytes (unless `cache_bytes` was given). Returns the
        bound in bytes."""
        if self._fixed_cache:  # the reader's bound; the estimates only guide read-ahead
            self._sizes = self._sizes or self.estimated_bytes(measure=False)
            return self.cache_bytes
        sizes = self._sizes = self.estimated_bytes()
        available = psutil.virtual_memory().available
        everything = int(1.1 * sum(sizes))
        keep_all = everything <= available // 4
        self._dense_wanted = keep_all and DenseColumns.supports(self.schema)
        if not self._dense_wanted:
            self._dense = None
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
        if bound != self.cache_bytes:
            self.cache_bytes = bound
            with self._lock:
                self._cache.resize(bound)
        return bound

    def plan_epoch(self, epoch: int, batches: Any) -> None:
        """The epoch's batches on this rank (`batches[k]`: sample indices), from the plan:
        the cache evicts by next use instead of recency."""
        starts = self._rg_starts
        uses = EpochUses.build(
            epoch, batches, lambda i: np.searchsorted(starts, i, side="right") - 1
        )
        with self._lock:
            self._cache.plan(uses)

    def cache_stats(self) -> dict[str, int]:
        """Row-group reads and re-reads (same row group, same epoch), cache hits and
        evictions, in this process."""
        with self._lock:
            return self._cache.stats()

    @property
    def _rg_starts(self) -> np.ndarray:
        self.files  # noqa: B018 - loads metadata
        return self._starts

    def blocks(self) -> tuple[int, ...]:
        return tuple(n for f in self.files for n in f.row_groups)

    def row_starts(self) -> np.ndarray:
        """The first sample of each row group (numbered across files), and the total."""
        return self._rg_starts

    @property
    def schema(self) -> pa.Schema:
        """The dataset's Arrow schema, projected to `columns`: every file's columns, each
        typed as the first file that has it (see iolib.sources.schemas)."""
        cached = self.__dict__.get("_schema")
        if cached is None:
            cached = unified_schema([f.schema for f in self.files], self.columns)
            self.__dict__["_schema"] = cached
        return cached

    @property
    def drifted_files(self) -> dict[str, str]:
        """URL -> what differs, for files whose schema cannot join the dataset's: their
        row groups are refused (skipped and counted under on_error="skip")."""
        cached = self.__dict__.get("_drift")
        if cached is None:
            files = self.files
            found = drifted([f.schema for f in files], self.schema)
            cached = {files[i].url: reason for i, reason in found.items()}
            self.__dict__["_drift"] = cached
            if cached:
                log.warning(
                    "%d Parquet file(s) differ from the dataset's schema and will be refused: %s",
                    len(cached),
                    "; ".join(f"{url}: {why}" for url, why in list(cached.items())[:5]),
                )
        return cached

    def fingerprint(self) -> str:
        """Paths, row counts, sizes, column chunk sizes and the store's version of each
        file: a corpus rewritten in place (same files, same row counts) is another one."""
        digest = hashlib.sha256()
        for f in self.files:
            chunks = ",".join(str(sorted(c.items())) for c in f.column_bytes)
            rows = ",".join(map(str, f.row_groups))
            digest.update(f"{f.path}|{rows}|{f.size}|{f.version}|{chunks}\n".encode())
        window = self._cache_window()
        if window is not None:  # a global shuffle runs in windows of this many row groups
            digest.update(f"window {window}".encode())
        return digest.hexdigest()[:16]

    def describe(self) -> str:
        n = len(self.files)
        return f"ParquetSource({self._redact(self.urls[0])!r}{f' +{n - 1} files' if n > 1 else ''})"

    def locate(self, index: int) -> str:
        meta, local = self._groups[self.block_of(index)]
        return f"{meta.url!r} row group {local} (sample {index})"

    def block_of(self, index: int) -> int:
        """The row group (numbered across files) that holds sample `index`: a failed read
        fails every sample of its row group, so a skipping reader tries it once."""
        return int(np.searchsorted(self._rg_starts, index, side="right") - 1)

    # -- reads ---------------------------------------------------------------------------
    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        """Rows at `indices`, in that order, as one Arrow table: a fresh copy (collate hands
        its memory to tensors without copying again).

        From the dense store when there is one (one `np.take` per column); else Arrow's
        `take` per row group plus one reordering `take` (two copies, GIL released)."""
        indices = np.asarray(indices, dtype=np.int64)
        starts = self._rg_starts
        if indices.size and (indices.min() < 0 or indices.max() >= starts[-1]):
            raise IndexError(f"sample indices outside 0..{starts[-1] - 1}")
        thread = threading.get_ident()
        self._local.epoch = epoch
        with self._lock:  # which batch this thread assembles: the cache protects it
            k = self._cache.begin(thread, epoch, int(indices[0]) if indices.size else None)
        if k is not None and self.readahead:
            self._read_ahead(epoch, k)
        try:
            table = self._read(indices)
        finally:
            with self._lock:
                self._cache.end(thread)
                (read, retries), self._ahead_io = self._ahead_io, (0, 0)
            self._release_ranges()
            count_bytes(read)  # what was read ahead counts in the batch that took it over
            count_retries(retries)
        return self.lists.tag(table) if self.lists is not None else table

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
        if not 0 <= group < len(self._rg_starts) - 1:
            raise IndexError(f"row group {group} outside 0..{len(self._rg_starts) - 2}")
        try:
            return self._row_group(group)
        finally:
            self._release_ranges()

    def _read(self, indices: np.ndarray) -> pa.Table:
        starts = self._rg_starts
        dense = self._dense_columns()
        if dense is not None and indices.size and self._fill_dense(dense, indices):
            return dense.take(indices)
        groups = np.searchsorted(starts, indices, side="right") - 1
        self._local.wanted = set(groups.tolist())
        self._read_in_parallel(sorted(self._local.wanted), None)
        order = np.argsort(groups, kind="stable")
        pieces, boundaries = [], np.flatnonzero(np.diff(groups[order])) + 1
        for chunk in np.split(order, boundaries) if indices.size else []:
            group = int(groups[chunk[0]])
            table = self._row_group(group)
            pieces.append(table.take(pa.array(indices[chunk] - starts[group])))
        if not pieces:
            return self.schema.empty_table()
        batch = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return batch.take(pa.array(inverse))

    def _dense_columns(self) -> DenseColumns | None:
        """The contiguous column store, made on first use where fit_cache chose it."""
        if self._dense is not None or not self._dense_wanted or self._fixed_cache:
            return self._dense  # the per-batch path: no lock once the store exists
        with self._lock:
            if self._dense is None and self._dense_wanted:
                self._dense = DenseColumns(self.schema, self._rg_starts, self._capacities())
            return self._dense

    def _capacities(self) -> dict[str, np.ndarray]:
        """Items per row group of each list column, from the footers (an upper bound: a
        null or empty row counts one)."""
        names = [
            f.name
            for f in self.schema
            if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
        ]
        counts = [
            leaf_values(f.group_meta(i)) for f in self.files for i in range(len(f.row_groups))
        ]
        return {name: np.array([c[name] for c in counts], dtype=np.int64) for name in names}

    def _fill_dense(self, dense: DenseColumns, indices: np.ndarray) -> bool:
        """Copy in the row groups `indices` need; False if one holds a null (the store is
        then dropped and the caller reads Arrow tables)."""
        if dense.complete:
            return True
        groups = np.searchsorted(self._rg_starts, indices, side="right") - 1
        missing = list(dense.missing(groups))
        self._local.wanted = set(missing)
        self._read_in_parallel(missing, dense)
        for group in missing:
            table = self._row_group(group, dense=dense)
            if not dense.filled[group] and not dense.fill(group, table):
                self._drop_dense(group)
                return False
        return True

    def _drop_dense(self, group: int) -> None:
        """A row group held nulls: go back to Arrow tables for good (nulls survive there)."""
        log.info("%s: row group %d holds nulls; batches are gathered from Arrow tables",
                 self.describe(), group)  # fmt: skip
        with self._lock:
            self._dense_wanted, self._dense = False, None

    def _row_group(self, group: int, dense: DenseColumns | None = None) -> pa.Table | None:
        """A row group from the cache, else from storage. Threads that miss the same row
        group at once share one read (the first reads, the others wait for it).

        With `dense`, the reader copies the row group into that store before the others
        are let go, and it is not cached; None when the store already holds it (another
        thread filled it since this one looked)."""
        with self._lock:
            if dense is not None and dense.filled[group]:
                return None
            cached = self._cache.get(group)
            if cached is not None:
                return cached
            flight = self._in_flight.get(group)
            leader = flight is None
            if leader:
                flight = self._in_flight[group] = _Flight()
                self._count_read(group)
        if not leader:
            flight.done.wait()  # the leader always sets it, on success or error
            if flight.error is not None:
                raise flight.error
            return flight.table
        try:
            table = self._fetch_row_group(group)
            if dense is not None:
                dense.fill(group, table)  # unfilled if it holds a null: the caller checks
            flight.table = table
            return table
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                if dense is None and flight.table is not None:
                    self._cache.put(group, flight.table, threading.get_ident())
                del self._in_flight[group]
            flight.done.set()

    def fetch_row_group(self, group: int) -> pa.Table:
        """Row group `group` (numbered across files) of the projected columns, read from
        storage with retries and counted, bypassing the cache: for sources that keep
        what they read in their own form (`iolib.text`)."""
        if not 0 <= group < len(self._rg_starts) - 1:
            raise IndexError(f"row group {group} outside 0..{len(self._rg_starts) - 2}")
        try:
            return self._fetch_row_group(group)
        finally:
            self._release_ranges()

    def _read_ahead(self, epoch: int, k: int) -> None:
        """Submit the row groups of batches k..k+readahead not yet held or read, latest
        first (the batch's own thread reads its row groups in ascending order: the two
        meet in the middle), where the cache or the in-memory store has room."""
        dense = self._dense_columns()
        with self._lock:
            plan = self._cache.plans.get(epoch)
            if plan is None or self._sizes is None:  # no plan, or sizes unknown: no room
                return
            # From the earliest batch in progress (other threads'), whose row groups
            # must stay, to `readahead` batches past this one.
            start = min([b for e, b in self._cache.active.values() if e == epoch] + [k])
            upcoming = plan.upcoming(start, k - start + self.readahead + 1)
            sizes = self._sizes
            # Room for everything these batches read that is not held yet, in order of
            # first use, so that a read ahead never displaces what is needed sooner (it
            # would then be read twice); held row groups needed later give way.
            needed = set(upcoming)
            room = self._cache.budget - sum(sizes[g] for g in self._cache.tables if g in needed)
            # Other threads may be about to read a row group this count missed (the
            # active set moves while we look): leave each of them one row group's room.
            room -= len(self._cache.active) * max(sizes, default=0)
            wanted = []
            for group in upcoming:
                if group in self._cache or (dense is not None and dense.filled[group]):
                    continue
                room -= sizes[group]
                if dense is None and room < 0:
                    break
                if (epoch, group) in self._ahead_sent or group in self._in_flight:
                    continue
                wanted.append(group)
                self._ahead_sent.add((epoch, group))
            self._ahead_sent = {(e, g) for e, g in self._ahead_sent if e >= epoch - 1}
            if not wanted:
                return
            if self._ahead is None:
                self._ahead = ThreadPoolExecutor(1, thread_name_prefix="iolib-readahead")
        for group in reversed(wanted):
            self._ahead.submit(self._read_one_ahead, epoch, group, dense)

    def _read_in_parallel(self, groups: list[int], dense: DenseColumns | None) -> None:
        """Start reading all but the first of a batch's row groups that are neither held
        nor being read, FETCH_THREADS at a time: on object storage a request's latency,
        not the link, bounds one reader, and a batch of a global shuffle over many files
        needs dozens of them. The batch's own thread reads the first and then takes the
        others over (shared reads: `_row_group`)."""
        with self._lock:
            missing = [g for g in groups if g not in self._cache and g not in self._in_flight]
            if dense is not None:
                missing = [g for g in missing if not dense.filled[g]]
            elif self._sizes is not None:  # only what the cache has room for: no evictions
                room = self._cache.budget - self._cache.held
                fits = np.cumsum([self._sizes[g] for g in missing]) <= room
                missing = [g for g, fit in zip(missing, fits, strict=True) if fit]
            else:
                missing = []
            if len(missing) < 2:
                return
            if self._fetchers is None:
                self._fetchers = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="iolib-fetch")
            pool = self._fetchers
        epoch = getattr(self._local, "epoch", 0)
        for group in missing[1:]:
            pool.submit(self._read_one_ahead, epoch, group, dense)

    def _read_one_ahead(self, epoch: int, group: int, dense: DenseColumns | None) -> None:
        """One read ahead of need. A failure is left to the batch that needs the row
        group: it reads it again, with retries, and reports the error with its batch."""
        self._local.epoch = epoch
        try:
            self._row_group(group, dense=dense)
        except Exception:  # reported by the batch that needs it
            pass
        finally:
            self._release_ranges()
            # Storage counts per thread, and this one makes no batch: the next batch
            # counts what it read and retried.
            read, retries = take_counters()
            with self._lock:
                self._ahead_io = (self._ahead_io[0] + read, self._ahead_io[1] + retries)

    def _count_read(self, group: int) -> None:
        """Count a read from storage (the lock is held); warn once at the first re-read."""
        epoch = getattr(self._local, "epoch", 0)
        if not self._cache.record_read(group, epoch) or self._rereads_warned:
            return
        self._rereads_warned = True
        meta, local = self._groups[group]
        log.warning(
            "%s: %r row group %d is read again in epoch %d: the row-group cache (%.0f MiB) "
            "holds less than this shuffle needs. Use shuffle='block', a larger "
            "`cache_bytes`, or smaller row groups; loader.stats()['row_group_rereads'] "
            "counts the re-reads.",
            self.describe(),
            meta.url,
            local,
            epoch,
            self.cache_bytes / 2**20,
        )

    def _fetch_row_group(self, group: int) -> pa.Table:
        meta, local = self._groups[group]
        reason = self.drifted_files.get(meta.url)
        if reason is not None:
            raise DataError(
                f"Parquet file {meta.url!r} row group {local}: its schema differs from the "
                f"dataset's ({reason}). Rewrite it with the dataset's schema, leave it out, "
                "or pass on_error='skip' to leave its rows out (counted)."
            )
        what = f"reading {meta.url!r} row group {local}"
        spans = self._spans_for(group)
        # This thread's open files: the read itself runs on a helper thread (timeouts).
        handles = self._local.__dict__.setdefault("handles", {})
        table = call_with_retries(
            lambda: self._read_row_group(meta, local, spans, handles),
            what=what,
            policy=self.retry,
            redact=self._redact,
        )
        # The file now holding this batch's bytes: let go once the batch is decoded (only
        # these: a thread may have thousands of files open, and this is per batch).
        self._local.__dict__.setdefault("loaded", set()).add(handles[meta.path][1])
        table = conform(table, self.schema)
        self._check_types(table, meta, local)
        sizes = meta.column_bytes[local]
        count_bytes(sum(sizes[c] for c in (self.columns or sizes) if c in sizes))
        return table

    def _check_types(self, table: pa.Table, meta: _FileMeta, local: int) -> None:
        """Every row group must have the first file's column types: a shard whose `label`
        is a string where the others have int cannot be batched with them. Lists of
        numbers (token ids) must not hold null items: a tensor cannot."""
        expected = self.schema
        for name in table.column_names:
            column = table.column(name)
            if is_numeric_list(column.type) and _null_items(column):
                raise DataError(
                    f"Parquet file {meta.url!r} row group {local}: column {name!r} holds null "
                    "items inside its lists, which no tensor can hold. Drop or fill them when "
                    "writing the data (null rows are read as empty lists)."
                )
        differ = [
            f"{f.name!r} is {table.schema.field(f.name).type}, expected {f.type}"
            for f in expected
            if f.name in table.schema.names and not table.schema.field(f.name).type.equals(f.type)
        ]
        if differ:
            raise DataError(
                f"Parquet file {meta.url!r} row group {local} has other column types than "
                f"{self.files[0].url!r}: {'; '.join(differ)}. Rewrite the file with the "
                "dataset's schema or leave it out."
            )

    def _spans_for(self, group: int) -> list[Span]:
        """The byte ranges to read for `group`: its column chunks, and those of the
        batch's later row groups in the same file not cached or read by another thread
        (up to one request's worth), so that a batch of small row groups costs one
        request rather than one each."""
        meta = self._groups[group][0]
        spans = self._chunk_spans(group)
        total = sum(end - start for start, end in spans)
        with self._lock:
            later = [
                g
                for g in sorted(getattr(self._local, "wanted", ()))
                if g > group and g not in self._cache and g not in self._in_flight
            ]
        for other in later:
            if self._groups[other][0] is not meta:
                continue
            more = self._chunk_spans(other)
            total += sum(end - start for start, end in more)
            if total > MAX_REQUEST_BYTES:
                break
            spans += more
        return coalesce(spans)

    def _chunk_spans(self, group: int) -> list[Span]:
        """The byte ranges of the columns read, in row group `group`."""
        meta, local = self._groups[group]
        by_column = meta.spans[local]
        return [span for name in self.columns or by_column for span in by_column.get(name, ())]

    def _release_ranges(self) -> None:
        """Drop this thread's loaded bytes once a batch is decoded."""
        loaded = self._local.__dict__.get("loaded", set())
        for ranged in loaded:
            ranged.release()
        loaded.clear()
        self._local.wanted = ()

    def _read_row_group(
        self, meta: _FileMeta, local: int, spans: list[Span], handles: dict
    ) -> pa.Table:
        # Taken out of `handles` while in use: an attempt abandoned on a timeout keeps
        # its file to itself, and the retry opens another.
        reader, ranged = handles.pop(meta.path, (None, None))
        try:
            if reader is None:
                fs, _ = open_filesystem(self.urls[meta.root], self.storage_options)
                # The size and footer read when planning: opening costs no request (the
                # footer and size took two, 106 ms on the object-store profile, paid by
                # every worker for every file it reads, and by each one a tuner adds).
                # Reads are exact byte ranges (`iolib.sources.ranges`), made here, on
                # this thread: pyarrow's pre-buffering reads on its IO threads, through
                # the Python file, and one released while the interpreter exits aborts
                # the process ("terminate called without an active exception").
                ranged = RangedFile(fs, meta.path, meta.size)
                reader = pq.ParquetFile(ranged, metadata=meta.footer, pre_buffer=False)
            ranged.load(spans)
            table = reader.read_row_group(
                meta.first_group + local, columns=self.columns, use_threads=False
            )
            handles[meta.path] = (reader, ranged)
            return table
        except Exception as exc:
            if ranged is not None:  # reopened on the next attempt
                ranged.release()
            reader = ranged = None
            # The traceback holds the reader, whose C++ state (with pre-buffering) holds
            # this error: a cycle the collector cannot see, keeping every failed read's
            # buffers alive. Clearing the frames' locals breaks it; the report keeps the
            # lines (tests/test_reliability.py::test_failed_reads_release_their_memory).
            traceback.clear_frames(exc.__traceback__)
            if _is_corrupt(exc):
                raise self._corrupt(meta, local, exc) from (
                    None if self._redact.changes(str(exc)) else exc
                )
            raise

    def _corrupt(self, meta: _FileMeta, local: int, exc: BaseException) -> DataError:
        return DataError(
            f"Parquet file {meta.url!r} row group {local} is corrupt or unreadable: "
            f"{self._redact(str(exc))}. Rewrite the file or leave it out."
        )
