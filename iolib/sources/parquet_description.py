"""What a Parquet source reads, as an immutable value: `ParquetDescription`.

Why apart from the reader: a description is what travels to every worker (pickled into
process workers, shared by threads), so it holds no filesystem, cache, lock or thread,
only the files, their footers and the options; each worker builds its own reader from
it (`iolib.sources.parquet_reader`). Everything here is a pure function of the files'
footers and the options, except `indexed`, which lists the files and reads the footers
once, and returns a new description holding them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from iolib.base.redact import Redactor
from iolib.base.resources import parse_bytes
from iolib.collate import ListFormat
from iolib.errors import ConfigError, DataError
from iolib.plan import window_groups
from iolib.sources.footer import arrow_bytes, exact_size, leaf_values, plain_bytes_exact
from iolib.sources.parquet_files import FileMeta, list_files, pack_files, unpack_files
from iolib.sources.ranges import Span
from iolib.sources.schemas import drifted, unified_schema
from iolib.storage import RetryPolicy

MIN_CACHE_BYTES = 64 * 2**20
log = logging.getLogger("iolib.sources.parquet")


@dataclass(frozen=True)
class ParquetDescription:
    """Files, footers and options of one Parquet source; what every worker starts from.

    Row groups are numbered across files, in file order: row group `g` is row group
    `local` of file `group(g)`; its rows are `row_starts[g]..row_starts[g + 1]`.
    """

    urls: tuple[str, ...]
    columns: tuple[str, ...] | None
    storage_options: dict[str, Any]
    retry: RetryPolicy
    lists: ListFormat | None
    readahead: int
    cache_bytes: int  # bound on decoded row groups a reader keeps (Arrow bytes)
    fixed_cache: bool  # given by the user (else sized by the loader: `fit_cache`)
    files: tuple[FileMeta, ...] | None = None  # None until `indexed`
    keep_dense: bool = False  # the whole dataset as contiguous arrays (`sources.dense`)
    sizes: tuple[int, ...] | None = None  # estimated Arrow bytes per row group
    decoded: float | None = None  # measured Arrow bytes / the footers' estimate
    # Decoded bytes a shuffle=True mixes together (None: the whole dataset).
    shuffle_window: int | None = None

    @classmethod
    def of(
        cls,
        urls: str | list[str],
        columns: list[str] | None,
        storage_options: dict[str, Any] | None,
        cache_bytes: int | None,
        retry: RetryPolicy | None,
        lists: ListFormat | None,
        readahead: int,
        shuffle_window: int | str | None = None,
    ) -> ParquetDescription:
        """A description from `ParquetSource`'s arguments, checked (nothing is read)."""
        if isinstance(readahead, bool) or not isinstance(readahead, int) or readahead < 0:
            raise ConfigError(f"`readahead` must be an integer >= 0. Found: {readahead!r}.")
        cache_bytes = checked_cache_bytes(cache_bytes)
        listed = [urls] if isinstance(urls, str) else list(urls)
        if not listed or any(not isinstance(u, str) or not u.strip() for u in listed):
            raise ConfigError(
                f"`urls` must name Parquet files: a file, directory, glob or a list of them. "
                f"Found: {urls!r} (an empty path would read the current directory)."
            )
        return cls(
            tuple(listed),
            tuple(columns) if columns is not None else None,
            dict(storage_options or {}),
            retry or RetryPolicy(),
            lists,
            readahead,
            cache_bytes if cache_bytes is not None else MIN_CACHE_BYTES,
            cache_bytes is not None,
            shuffle_window=parse_bytes(shuffle_window, "shuffle_window"),
        )

    # -- pickling: the fields alone (derived values are computed again where needed) ---
    def __getstate__(self) -> dict[str, Any]:
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.files is not None:
            state["files"] = pack_files(self.files)  # the footers, compressed
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["files"], bytes):
            state["files"] = unpack_files(state["files"])
        self.__dict__.update(state)

    def with_changes(self, **changes: Any) -> ParquetDescription:
        """This description with some fields replaced; what is derived from the fields
        that stay is kept (a schema over 100,000 footers is not worked out again)."""
        new = replace(self, **changes)
        keep = []
        if "files" not in changes:
            keep += ["row_starts", "_groups"]
            if "columns" not in changes:
                keep += ["schema", "drifted_files"]
        if not {"urls", "storage_options"} & changes.keys():
            keep.append("redact")
        for name in keep:
            if name in self.__dict__:
                new.__dict__[name] = self.__dict__[name]
        return new

    def indexed(self) -> ParquetDescription:
        """This description with its files listed and footers read (itself if they are)."""
        if self.files is not None:
            return self
        files = list_files(self.urls, self.storage_options, self.retry, self.redact)
        done = replace(self, files=tuple(files))
        done.check_columns()
        return done

    @cached_property
    def redact(self) -> Redactor:
        """Masks the secrets of the URLs and storage options in messages."""
        return Redactor(self.urls, self.storage_options)

    def _index(self) -> tuple[FileMeta, ...]:
        if self.files is None:
            raise RuntimeError("ParquetDescription.indexed() must be called before reading it")
        return self.files

    # -- the row-group index -----------------------------------------------------------
    @cached_property
    def row_starts(self) -> np.ndarray:
        """The first sample of each row group (numbered across files), and the total."""
        return np.cumsum([0] + [n for f in self._index() for n in f.row_groups])

    @cached_property
    def _groups(self) -> list[tuple[FileMeta, int]]:
        return [(f, i) for f in self._index() for i in range(len(f.row_groups))]

    def group(self, group: int) -> tuple[FileMeta, int]:
        """The file holding row group `group`, and its number within that file."""
        return self._groups[group]

    def blocks(self) -> tuple[int, ...]:
        """Rows per row group, in sample order."""
        return tuple(n for f in self._index() for n in f.row_groups)

    def block_of(self, index: int) -> int:
        """The row group that holds sample `index`."""
        return int(np.searchsorted(self.row_starts, index, side="right") - 1)

    def locate(self, index: int) -> str:
        meta, local = self.group(self.block_of(index))
        return f"{meta.url!r} row group {local} (sample {index})"

    def chunk_spans(self, group: int) -> list[Span]:
        """The byte ranges of the columns read, in row group `group`."""
        meta, local = self.group(group)
        by_column = meta.spans[local]
        return [span for name in self.columns or by_column for span in by_column.get(name, ())]

    # -- schema ------------------------------------------------------------------------
    @cached_property
    def schema(self) -> pa.Schema:
        """The dataset's Arrow schema, projected to `columns`: every file's columns, each
        typed as the first file that has it (see iolib.sources.schemas)."""
        columns = list(self.columns) if self.columns is not None else None
        return unified_schema([f.schema for f in self._index()], columns)

    @cached_property
    def drifted_files(self) -> dict[str, str]:
        """URL -> what differs, for files whose schema cannot join the dataset's: their
        row groups are refused (skipped and counted under on_error="skip")."""
        files = self._index()
        found = drifted([f.schema for f in files], self.schema)
        drift = {files[i].url: reason for i, reason in found.items()}
        if drift:
            log.warning(
                "%d Parquet file(s) differ from the dataset's schema and will be refused: %s",
                len(drift),
                "; ".join(f"{url}: {why}" for url, why in list(drift.items())[:5]),
            )
        return drift

    def check_columns(self) -> None:
        """A requested column no file has is a mistake in `columns`; one that only some
        files lack is schema drift (see `drifted_files`). A `pad_id` the list columns
        cannot hold is refused here, before any batch."""
        files = self.files or ()
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

    # -- sizes ---------------------------------------------------------------------------
    def footer_estimates(self) -> tuple[list[int], bool]:
        """Arrow bytes of each row group's projected columns from the footers, and
        whether that is exact (numbers and lists of numbers; strings and binary written
        without a dictionary, within their length prefixes) rather than approximate."""
        sizes, exact = [], True
        for f in self._index():
            for local, rows in enumerate(f.row_groups):
                counts = leaf_values(f.group_meta(local))
                total = 0
                for c, raw in f.column_raw_bytes[local].items():
                    if (self.columns is None or c in self.columns) and c in f.schema.names:
                        field = f.schema.field(c)
                        total += arrow_bytes(field, rows, raw, counts.get(c, rows))
                        if exact and not exact_size(field.type):
                            exact = (
                                plain_bytes_exact(field.type)
                                and c not in f.dictionary_columns[local]
                            )
                sizes.append(total)
        return sizes, exact

    def estimated_bytes(self) -> list[int]:
        """The footers' estimates, scaled by the measured ratio where there is one."""
        sizes, exact = self.footer_estimates()
        if not exact and sizes and self.decoded is not None:
            sizes = [int(size * self.decoded) for size in sizes]
        return sizes

    def window_groups(self) -> int | None:
        """Row groups a shuffle window (`shuffle_window` decoded bytes) holds; None when
        no window was given or the whole dataset fits in one (a full shuffle)."""
        return window_groups(self.estimated_bytes(), self.shuffle_window)

    def window_cache_bytes(self) -> int:
        """What the cache must hold for shuffle=True to read each row group once an
        epoch: two windows (this one, and the next read ahead), or the whole dataset."""
        sizes = self.estimated_bytes()
        groups = self.window_groups()
        if groups is None:
            return int(sum(sizes))
        return 2 * groups * max(sizes, default=0)

    def capacities(self) -> dict[str, np.ndarray]:
        """Items per row group of each list column, from the footers (an upper bound: a
        null or empty row counts one)."""
        names = [
            f.name
            for f in self.schema
            if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)
        ]
        counts = [
            leaf_values(f.group_meta(i)) for f in self._index() for i in range(len(f.row_groups))
        ]
        return {name: np.array([c[name] for c in counts], dtype=np.int64) for name in names}

    # -- identity ------------------------------------------------------------------------
    def fingerprint(self) -> str:
        """Paths, row counts, sizes, column chunk sizes and the store's version of each
        file: a corpus rewritten in place (same files, same row counts) is another one."""
        digest = hashlib.sha256()
        for f in self._index():
            chunks = ",".join(str(sorted(c.items())) for c in f.column_bytes)
            rows = ",".join(map(str, f.row_groups))
            digest.update(f"{f.path}|{rows}|{f.size}|{f.version}|{chunks}\n".encode())
        window = self.window_groups()
        if window is not None:  # a global shuffle runs in windows of this many row groups
            digest.update(f"window {window}".encode())
        return digest.hexdigest()[:16]

    def describe(self) -> str:
        n = len(self._index())
        return f"ParquetSource({self.redact(self.urls[0])!r}{f' +{n - 1} files' if n > 1 else ''})"


MAX_CACHE_BYTES = 2**50  # 1 PiB: beyond any machine's memory, so surely a slip


def checked_cache_bytes(value: Any) -> int | None:
    """`cache_bytes` as a whole number of bytes (a size like "1GB" read as one), or None;
    refused at construction, not at the first read, when it is no such thing."""
    if value is None:
        return None
    if isinstance(value, str):
        value = parse_bytes(value, "cache_bytes")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(
            "`cache_bytes` must be a whole number of bytes >= 1 or a size like '1GB'. "
            f"Found: {value!r}."
        )
    if not 1 <= int(value) <= MAX_CACHE_BYTES:
        raise ConfigError(
            f"`cache_bytes` must be between 1 byte and 1 PiB ({MAX_CACHE_BYTES}). Found: {value!r}."
        )
    return int(value)
