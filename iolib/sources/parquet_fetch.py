"""One row group from storage, with retries, checked and counted: `RowGroupFetcher`.

Why apart from the reader: this is the part that talks to storage (open files, byte
ranges, retries, undecodable bytes); the reader above it decides what to read, when,
and what to keep. Each thread keeps its own open files: the same file is opened once
per thread, with the footer from the description (no request), and the bytes a batch
loaded are let go once that batch is decoded (`release`).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from iolib.base.forks import reset_after_fork
from iolib.base.resources import thread_budget
from iolib.collate import is_numeric_list
from iolib.errors import DataError
from iolib.sources.arrow_pool import prefer_releasing_pool
from iolib.sources.parquet_description import ParquetDescription
from iolib.sources.parquet_files import FileMeta, is_corrupt
from iolib.sources.ranges import (
    MAX_REQUEST_BYTES,
    RangedFile,
    Span,
    coalesce,
)
from iolib.sources.schemas import conform
from iolib.storage import call_with_retries, count_bytes, open_filesystem


class _DecodeSlots:
    """At most as many row groups decoded at once as this process may use cores: reads
    stay many in flight (a store's per-connection rate is far below its total), but a
    decode holds its pages, levels and values, so more at once than cores only raise
    the peak memory (eight at once: ~20 MB each for 5 MB of int32 tokens)."""

    def __init__(self) -> None:
        self._after_fork()

    def _after_fork(self) -> None:
        self.count = thread_budget().decodes
        self.slots = threading.BoundedSemaphore(self.count)


_DECODING = _DecodeSlots()
# Decoded bytes a record batch of a transient read holds: Arrow's peak while decoding a
# row group is then about the group and one batch (2.1x the group read whole).
DECODE_BATCH_BYTES = 2 * 2**20
reset_after_fork(_DECODING)  # a slot held by a parent's thread at the fork is the child's


def decode_slots() -> int:
    """Row groups this process decodes at once (one a core it may use, at least 2)."""
    return _DECODING.count


def _null_items(column: pa.ChunkedArray) -> bool:
    """Whether any list of `column` holds a null item (null rows themselves are allowed)."""
    return any(chunk.flatten().null_count for chunk in column.chunks)


def _read_in_batches(
    reader: pq.ParquetFile,
    group: int,
    columns: list[str] | None,
    read_as: Mapping[str, pa.DataType] | None = None,
    where: str = "",
) -> pa.Table:
    """Row group `group` decoded in record batches of about DECODE_BATCH_BYTES: the same
    values as `read_row_group`, in chunks, without its decode buffers of the whole group.
    `read_as`: columns cast to a narrower type batch by batch as decoded (each wide
    batch let go before the next is decoded); a value the type cannot hold is a
    DataError naming `where`."""
    meta = reader.metadata.row_group(group)
    rows = max(1, meta.num_rows * DECODE_BATCH_BYTES // max(meta.total_byte_size, 1))
    decoded = reader.iter_batches(batch_size=rows, row_groups=[group], columns=columns,
                                  use_threads=False)  # fmt: skip
    batches = [_cast(b, read_as, where) for b in decoded] if read_as else list(decoded)
    if not batches:  # no rows: the schema from a whole read (nothing to decode)
        table = reader.read_row_group(group, columns=columns, use_threads=False)
        return _cast(table, read_as, where) if read_as else table
    return pa.Table.from_batches(batches)


def _cast(batch: Any, read_as: Mapping[str, pa.DataType], where: str) -> Any:
    """`batch` (or a table) with the columns of `read_as` cast to their integer types
    (lists of them, or plain), each column's values checked against the type's range
    first: Arrow's checked cast took 0.8 ms a million values, the bounds and an
    unchecked cast 0.17."""
    for name, kind in read_as.items():
        column = batch.column(name)
        leaf = kind.value_type if _is_list(kind) else kind
        values = _leaves(column) if _is_list(kind) else column
        bounds = pc.min_max(values).as_py()
        limits = np.iinfo(leaf.to_pandas_dtype())
        low, high = bounds["min"], bounds["max"]
        if low is not None and not (limits.min <= low and high <= limits.max):
            raise DataError(
                f"{where}: read {name!r} as {kind}, but it holds values from {low} to "
                f"{high}, outside that type. Its footer's statistics are wrong or it "
                "changed since they were read: rewrite it."
            )
    fields = [pa.field(f.name, read_as.get(f.name, f.type), f.nullable) for f in batch.schema]
    return batch.cast(pa.schema(fields, metadata=batch.schema.metadata), safe=False)


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind)


def _leaves(column: Any) -> Any:
    """The items of a list column (an array or a chunked one), nulls and slices minded."""
    if isinstance(column, pa.ChunkedArray):
        return pa.chunked_array([c.flatten() for c in column.chunks], column.type.value_type)
    return column.flatten()


class RowGroupFetcher:
    """Reads row groups of one description's files; one per reader (per worker)."""

    def __init__(self, description: ParquetDescription) -> None:
        self.description = description
        self._local = threading.local()  # this thread's open files and loaded files

    def after_fork(self) -> None:
        """A forked worker opens its own files (the parent's stay the parent's)."""
        self._local = threading.local()

    def fetch(
        self,
        group: int,
        later: Sequence[int] = (),
        *,
        transient: bool = False,
        needed: bool = False,
        read_as: Mapping[str, pa.DataType] | None = None,
    ) -> pa.Table:
        """Row group `group` (numbered across files) of the projected columns; the bytes
        of row groups `later` of the same file come in the same request where they fit.
        `transient`: the caller copies the table out and drops it on this thread, so the
        pool is left as it is (see arrow_pool.py), and the row group is decoded in record
        batches (the table's chunks, `DECODE_BATCH_BYTES` each). `needed`: a batch waits
        for it, so a large one is read in pieces on parallel connections
        (`ranges.SPLIT_ABOVE`). `read_as`: columns cast to a narrower integer type (in a
        transient read, record batch by record batch: `_read_in_batches`)."""
        if not transient:
            prefer_releasing_pool()  # before a row group is allocated: see arrow_pool.py
        description = self.description
        meta, local = description.group(group)
        reason = description.drifted_files.get(meta.url)
        if reason is not None:
            raise DataError(
                f"Parquet file {meta.url!r} row group {local}: its schema differs from the "
                f"dataset's ({reason}). Rewrite it with the dataset's schema, leave it out, "
                "or pass on_error='skip' to leave its rows out (counted)."
            )
        what = f"reading {meta.url!r} row group {local}"
        spans = self.spans(group, later)
        # This thread's open files: the read itself runs on a helper thread (timeouts).
        handles = self._local.__dict__.setdefault("handles", {})
        fetched = [0]  # bytes every attempt received (the helper's counts are not ours)
        try:
            table = call_with_retries(
                lambda: self._read(
                    meta, local, spans, handles, fetched, needed, transient, read_as
                ),
                what=what,
                policy=description.retry,
                redact=description.redact,
            )
        finally:
            count_bytes(fetched[0])  # what crossed the network, holes included
        # The file now holding this batch's bytes: let go once the batch is decoded (only
        # these: a thread may have thousands of files open, and this is per batch).
        self._local.__dict__.setdefault("loaded", set()).add(handles[meta.path][1])
        table = conform(table, description.schema)
        self._check_types(table, meta, local, read_as)
        return table

    def spans(self, group: int, later: Sequence[int]) -> list[Span]:
        """The byte ranges to read for `group`: its column chunks, and those of `later`
        row groups in the same file (up to one request's worth), so that a batch of
        small row groups costs one request rather than one each."""
        description = self.description
        spans = coalesce(description.chunk_spans(group))  # holes between its columns
        for other in self.foldable(group, later):
            spans += coalesce(description.chunk_spans(other))
        # Across row groups only ranges that touch: a gap there is columns nobody asked
        # for (a stage that reads one small column read its neighbours' payloads too).
        return coalesce(spans, hole=0)

    def foldable(self, group: int, later: Sequence[int]) -> list[int]:
        """Those of `later` whose bytes `fetch(group, later)` loads with `group`'s: row
        groups of the same file, up to MAX_REQUEST_BYTES in all (a later `fetch` of one
        on this thread then makes no request)."""
        description = self.description
        meta = description.group(group)[0]
        total = sum(end - start for start, end in coalesce(description.chunk_spans(group)))
        out = []
        for other in later:
            if description.group(other)[0] is not meta:
                continue
            total += sum(end - start for start, end in coalesce(description.chunk_spans(other)))
            if total > MAX_REQUEST_BYTES:
                break
            out.append(other)
        return out

    def release(self) -> None:
        """Drop the bytes this thread's files loaded (once a batch is decoded)."""
        loaded = self._local.__dict__.get("loaded", set())
        for ranged in loaded:
            ranged.release()
        loaded.clear()

    def open_files(self) -> dict[str, int]:
        """Path -> bytes still loaded, for each file this thread holds open."""
        handles = self._local.__dict__.get("handles", {})
        return {path: ranged.held_bytes for path, (_, ranged) in handles.items()}

    def _read(
        self,
        meta: FileMeta,
        local: int,
        spans: list[Span],
        handles: dict,
        fetched: list[int],
        needed: bool = False,
        in_batches: bool = False,
        read_as: Mapping[str, pa.DataType] | None = None,
    ) -> pa.Table:
        # Taken out of `handles` while in use: an attempt abandoned on a timeout keeps
        # its file to itself, and the retry opens another.
        description = self.description
        reader, ranged = handles.pop(meta.path, (None, None))
        try:
            if reader is None:
                fs, _ = open_filesystem(description.urls[meta.root], description.storage_options)
                # The size and footer read when planning: opening costs no request (the
                # footer and size took two, 106 ms on the object-store profile, paid by
                # every worker for every file it reads, and by each one a tuner adds).
                # Reads are exact byte ranges (`iolib.sources.ranges`), made here, on
                # this thread: pyarrow's pre-buffering reads on its IO threads, through
                # the Python file, and one released while the interpreter exits aborts
                # the process ("terminate called without an active exception").
                ranged = RangedFile(fs, meta.path, meta.size, description.retry.timeout_s)
                reader = pq.ParquetFile(ranged, metadata=meta.footer, pre_buffer=False)
            before = ranged.fetched_bytes
            try:
                ranged.load(spans, split=needed)
                columns = list(description.columns) if description.columns is not None else None
                where = f"Parquet file {meta.url!r} row group {local}"
                with _DECODING.slots:
                    if in_batches:
                        table = _read_in_batches(
                            reader, meta.first_group + local, columns, read_as, where
                        )
                    else:
                        table = reader.read_row_group(meta.first_group + local, columns=columns,
                                                      use_threads=False)  # fmt: skip
                        table = _cast(table, read_as, where) if read_as else table
            finally:  # a read outside the loaded ranges is a request too
                fetched[0] += ranged.fetched_bytes - before
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
            if is_corrupt(exc):
                redact = description.redact
                raise DataError(
                    f"Parquet file {meta.url!r} row group {local} is corrupt or unreadable: "
                    f"{redact(str(exc))}. Rewrite the file or leave it out."
                ) from (None if redact.changes(str(exc)) else exc)
            raise

    def _check_types(
        self,
        table: pa.Table,
        meta: FileMeta,
        local: int,
        read_as: Mapping[str, pa.DataType] | None = None,
    ) -> None:
        """Every row group must have the first file's column types (or those it was read
        as): a shard whose `label` is a string where the others have int cannot be
        batched with them. Lists of numbers (token ids) must not hold null items: a
        tensor cannot."""
        read_as = read_as or {}
        expected = [pa.field(f.name, read_as.get(f.name, f.type)) for f in self.description.schema]
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
            first = self.description.files[0].url  # type: ignore[index]
            raise DataError(
                f"Parquet file {meta.url!r} row group {local} has other column types than "
                f"{first!r}: {'; '.join(differ)}. Rewrite the file with the "
                "dataset's schema or leave it out."
            )
