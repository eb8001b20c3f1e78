"""Which Parquet files a source reads, and what their footers say: `list_files`.

Why a module of its own: listing and footer reads are the only storage requests made
before the first batch, they run once per dataset (in the process that plans), and
what they return (`FileMeta`) travels to every worker, which then opens a file with no
request for its footer (two round trips on object storage, 106 ms measured).
"""

from __future__ import annotations

import json
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.spec import AbstractBufferedFile

from iolib.base.redact import Redactor
from iolib.base.resources import thread_budget
from iolib.errors import DataError
from iolib.sources.footer import column_sizes, dictionary_columns
from iolib.sources.ranges import Span, column_spans
from iolib.sources.summary import (
    SummarizedFile,
    listing,
    read_summary,
    regular_file,
    version_of,
)
from iolib.storage import RetryPolicy, call_with_retries, is_local, open_filesystem

GLOB_CHARS = "*?["
FOOTER_THREADS = thread_budget().footers  # a request or two each: many in flight
# What Arrow says of undecodable bytes (thrift headers, pages, magic, compression).
# "more than one dictionary": a column chunk read at offsets of another version of the file.
_CORRUPT_WORDS = re.compile(
    r"deseriali|corrupt|invalid|magic|decompress|page header|more than one dictionary", re.I
)


def is_corrupt(exc: BaseException) -> bool:
    """Bytes Arrow cannot decode (permanent), as opposed to a failed request (transient).
    Arrow reports undecodable pages as a bare OSError (an IOError status); storage errors
    reach it as their own subclasses (ConnectionResetError...) or with an errno."""
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)):
        return True
    return type(exc) is OSError and exc.errno is None and bool(_CORRUPT_WORDS.search(str(exc)))


@dataclass(frozen=True)
class FileMeta:
    """One Parquet file of a source: where it is, its row groups and its parsed footer."""

    url: str  # protocol-qualified path, for messages
    path: str  # path within the filesystem
    row_groups: tuple[int, ...]  # rows per row group
    size: int  # bytes
    schema: pa.Schema
    root: int  # which of the source's URLs it came from (for its filesystem)
    # The parsed footer, shared by every reader of the file: a worker opening it reads
    # no footer of its own (two round trips on object storage, 106 ms measured).
    footer: pq.FileMetaData
    version: str = ""  # what the store says changes with the content: ETag, else mtime
    # Row group `local` of this file is row group `first_group + local` of `footer` (a
    # directory's `_metadata` summary holds every file's row groups in one footer).
    first_group: int = 0

    def group_meta(self, local: int) -> pq.RowGroupMetaData:
        return self.footer.row_group(self.first_group + local)

    # Derived from the footer where first needed: a worker works out only the files it
    # reads (100,000 files' worth took seconds when they travelled worked out).
    @cached_property
    def column_bytes(self) -> tuple[dict[str, int], ...]:
        """Compressed bytes per column, per row group."""
        return tuple(column_sizes(self.group_meta(i), True) for i in range(len(self.row_groups)))

    @cached_property
    def column_raw_bytes(self) -> tuple[dict[str, int], ...]:
        """Uncompressed bytes per column, per row group."""
        return tuple(column_sizes(self.group_meta(i), False) for i in range(len(self.row_groups)))

    @cached_property
    def dictionary_columns(self) -> tuple[frozenset[str], ...]:
        """Columns with a dictionary page, per row group."""
        return tuple(dictionary_columns(self.group_meta(i)) for i in range(len(self.row_groups)))

    @cached_property
    def spans(self) -> tuple[dict[str, tuple[Span, ...]], ...]:
        """Column chunks' byte ranges, per row group."""
        return tuple(column_spans(self.group_meta(i)) for i in range(len(self.row_groups)))

    def __getstate__(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _from_footer(
    url: str, path: str, size: int, root: int, footer: pq.FileMetaData, version: str,
    first_group: int, groups: int, schema: pa.Schema,
) -> FileMeta:  # fmt: skip
    rows = tuple(footer.row_group(first_group + i).num_rows for i in range(groups))
    return FileMeta(url, path, rows, size, schema, root, footer, version, first_group)


def pack_files(files: tuple[FileMeta, ...]) -> bytes:
    """Files as compressed bytes (no pickle): footers repeat the schema and most names
    file after file, so 1,000 small files take ~2% of their pickled size."""
    numbers: dict[int, int] = {}
    footers: list[bytes] = []
    records = []
    for f in files:
        number = numbers.get(id(f.footer))
        if number is None:  # a `_metadata` summary's footer is shared by its files
            number = numbers[id(f.footer)] = len(footers)
            sink = pa.BufferOutputStream()
            f.footer.write_metadata_file(sink)
            footers.append(sink.getvalue().to_pybytes())
        records.append([f.url, f.path, f.row_groups, f.size, f.root, number, f.version,
                        f.first_group])  # fmt: skip
    head = json.dumps({"files": records, "footers": [len(b) for b in footers]}).encode()
    return zlib.compress(len(head).to_bytes(8, "little") + head + b"".join(footers), 1)


def unpack_files(packed: bytes) -> tuple[FileMeta, ...]:
    """What `pack_files` packed: the same files, each footer parsed once."""
    data = memoryview(zlib.decompress(packed))
    end = 8 + int.from_bytes(data[:8], "little")
    head = json.loads(bytes(data[8:end]))
    footers = []
    for size in head["footers"]:
        footer = pq.read_metadata(pa.BufferReader(data[end : end + size]))
        footers.append((footer, footer.schema.to_arrow_schema()))
        end += size
    return tuple(
        FileMeta(url, path, tuple(rows), size, footers[n][1], root, footers[n][0], version, first)
        for url, path, rows, size, root, n, version, first in head["files"]
    )


def _version(fs: Any, path: str, handle: Any) -> str:
    """What the store says changes with a file's content (`summary.version_of`): from
    the request that opened it, or a stat for a local file."""
    details = getattr(handle, "details", None)
    if not isinstance(details, dict) and is_local(fs):
        details = fs.info(path)  # a stat: no request
    return version_of(details)


class _Lister:
    """The listing of one source's URLs: what they name and the footers of each file."""

    def __init__(
        self, urls: tuple[str, ...], storage_options: dict[str, Any], retry: RetryPolicy,
        redact: Redactor,
    ) -> None:  # fmt: skip
        self.urls, self.storage_options = urls, storage_options
        self.retry, self.redact = retry, redact

    def files(self) -> list[FileMeta]:
        per_root = [self.summarized(root, url) for root, url in enumerate(self.urls)]
        paths = [
            p
            for root, url in enumerate(self.urls)
            if per_root[root] is None
            for p in self.expand(root, url)
        ]
        with ThreadPoolExecutor(max_workers=max(1, min(FOOTER_THREADS, len(paths)))) as pool:
            read = iter(pool.map(self.read_footer, paths))
        return [
            f
            for root, found in enumerate(per_root)
            for f in (found if found is not None else
                      [next(read) for p in paths if p[2] == root])
        ]  # fmt: skip

    def summarized(self, root: int, url: str) -> list[FileMeta] | None:
        """A directory's files from its `_metadata` summary, where it has a valid one."""
        if url.endswith((".parquet", ".pq")):
            return None
        fs, path = open_filesystem(url, self.storage_options)
        if is_pattern(fs, path):
            return None
        protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
        # Two steps, so that a failure names the one that failed: the first request
        # (credentials, endpoint, bucket) is the lookup, not the summary.
        is_dir = call_with_retries(
            lambda: fs.isdir(path),
            what=f"listing {self.redact(url)!r}",
            policy=self.retry,
            redact=self.redact,
        )
        found = None if not is_dir else call_with_retries(
            lambda: read_summary(fs, path),
            what=f"reading the _metadata summary of {self.redact(url)!r}",
            policy=self.retry,
            redact=self.redact,
        )  # fmt: skip
        if found is None:
            return None
        meta, files = found
        schema = meta.schema.to_arrow_schema()
        return [self.summarized_file(root, protocol, meta, schema, f) for f in files]

    def summarized_file(
        self, root: int, protocol: str, meta: pq.FileMetaData, schema: pa.Schema,
        f: SummarizedFile,
    ) -> FileMeta:  # fmt: skip
        return _from_footer(
            self.redact(protocol + f.path), f.path, f.size, root, meta, f.version,
            f.first_group, f.groups, schema,
        )  # fmt: skip

    def expand(self, root: int, url: str) -> list[tuple[str, str, int, dict | None]]:
        """(URL as shown, path, root, what the listing said of it) of each file `url`
        names."""
        fs, path = open_filesystem(url, self.storage_options)
        protocol = url.split("://", 1)[0] + "://" if "://" in url else ""
        shown = self.redact(url)
        found = call_with_retries(
            lambda: _list(fs, path, shown),
            what=f"listing {shown!r}",
            policy=self.retry,
            redact=self.redact,
        )
        return [
            (shown if p == path else self.redact(protocol + p), p, root, details)
            for p, details in found
        ]

    def read_footer(self, where: tuple[str, str, int, dict | None]) -> FileMeta:
        url, path, root, listed = where
        fs, _ = open_filesystem(self.urls[root], self.storage_options)
        # The listing's size and version: the file opened without a look of its own (a
        # round trip each on an object store; fsspec keeps a listing per thread, and
        # footers are read on a pool's).
        known = listed.get("size") if listed and not is_local(fs) else None
        sized = {"size": known} if isinstance(known, int) and version_of(listed) else {}

        def opened() -> Any:
            if sized:
                try:
                    return fs.open(path, "rb", **sized)
                except TypeError:  # a filesystem whose files take no size: it looks
                    sized.clear()
            return fs.open(path, "rb")

        def footer() -> tuple[Any, int, str]:
            with opened() as handle:
                if sized and isinstance(handle, AbstractBufferedFile):
                    handle.details = listed  # what its ranged reads check the ETag against
                size = getattr(handle, "size", None)  # fsspec's files know it: no request
                size = size if isinstance(size, int) else fs.size(path)
                version = version_of(listed) if sized else _version(fs, path, handle)
                return pq.ParquetFile(handle, pre_buffer=False).metadata, size, version

        try:  # transient errors are retried; a truncated or foreign file fails at once
            what = f"reading the footer of {url!r}"
            meta, size, version = call_with_retries(
                footer, what=what, policy=self.retry, redact=self.redact
            )
            schema = meta.schema.to_arrow_schema()
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, OSError) and not is_corrupt(exc):
                raise  # storage failed (named by the retries), not the data
            raise DataError(
                f"Cannot read the Parquet footer of {url!r}: {self.redact(str(exc))}. The file "
                "is truncated, corrupt or not Parquet; rewrite it or leave it out of `urls`."
            ) from (None if self.redact.changes(str(exc)) else exc)
        return _from_footer(url, path, size, root, meta, version, 0, meta.num_row_groups, schema)


def is_pattern(fs: Any, path: str, globbed: list[str] | None = None) -> bool:
    """Whether `path` is a glob: it holds `*`, `?` or `[` and names nothing as written
    (a directory `run[1]/` is read as itself, not as `run1/`). `globbed`: what
    ``fs.glob(path)`` found, if known. `*` and `?` match themselves, so without a `[`
    the path names something exactly when its own glob found it: no request of its own
    (a look and a listing, ~2 round trips on an object store, before the first batch)."""
    if not any(c in path for c in GLOB_CHARS):
        return False
    if globbed is not None and "[" not in path:
        return path.rstrip("/") not in globbed
    return not fs.exists(path)


def _not_regular(shown: str) -> DataError:
    return DataError(
        f"{shown!r} is not a regular file (a FIFO, device or socket, which would be read "
        "forever): a Parquet source reads regular files only."
    )


def _list(fs: Any, path: str, shown: str) -> list[tuple[str, dict | None]]:
    """(path, what the listing said of it) of each file `path` names: a glob's matches,
    a directory's own Parquet files, or the file itself."""
    globbed = fs.glob(path, detail=True) if any(c in path for c in GLOB_CHARS) else None
    if globbed is not None and is_pattern(fs, path, list(globbed)):
        found = sorted(globbed)
        if not found:
            raise DataError(f"No Parquet files match {shown!r}. Check the pattern and bucket.")
        odd = [p for p in found if not regular_file(fs, p)]
        if odd:
            raise _not_regular(odd[0])
        return [(p, globbed[p]) for p in found]
    try:  # info, not exists()/isdir(): those answer False on a transient error
        details = fs.info(path)
        kind = details["type"]  # after links
    except FileNotFoundError:
        raise DataError(
            f"Parquet source {shown!r} does not exist. Check the path (and credentials "
            "in storage_options for remote storage)."
        ) from None
    if kind == "file":
        return [(path, details)]
    if kind != "directory":
        raise _not_regular(shown)
    # The directory's own files only: a data/ holding train/ and val/ must not mix
    # them. Recursion is a glob away: data/**/*.parquet. Links are followed (a Hugging
    # Face hub snapshot is a directory of links to its blobs).
    entries = listing(fs, path)
    named = [e for e in entries if e["name"].endswith((".parquet", ".pq"))]
    odd = [e["name"] for e in named if e.get("type") not in ("file", "directory")]
    if odd:
        raise _not_regular(odd[0])
    found = sorted(((e["name"], e) for e in named if e.get("type") == "file"), key=lambda f: f[0])
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


def list_files(
    urls: tuple[str, ...], storage_options: dict[str, Any], retry: RetryPolicy, redact: Redactor
) -> list[FileMeta]:
    """The files that `urls` name (files, directories, globs; a directory's `_metadata`
    summary where it has one), with their footers read, in order."""
    return _Lister(urls, storage_options, retry, redact).files()
