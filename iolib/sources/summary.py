"""Parquet's `_metadata` summary file: the footers of every file of a directory in one
read, so a dataset of 100,000 files starts with a listing and one request instead of
two requests a file (the format's own convention: pyarrow writes it with
`pq.write_metadata`, Spark and Dask read it).

Trusted only while it matches the directory: every listed Parquet file, and no other,
with its row groups together and in order, and (where `iolib index` recorded them) each
file's size and version as the listing gives them; otherwise, or where it cannot be
read, the footers are read as usual, with a warning.
"""

from __future__ import annotations

import io
import json
import logging
import os
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from iolib.storage import is_local

log = logging.getLogger(__name__)
SUMMARY_NAME = "_metadata"
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "updated")
# The key of the summary's footer metadata that records each file's size and version.
FILES_KEY = b"iolib.files"
STALE = "stale _metadata: run `iolib index` again"


def version_of(details: dict[str, Any] | None) -> str:
    """The store's word for a file's content in its listing or open details: an object
    store's ETag, a file's modification time; "" where neither is known."""
    if not isinstance(details, dict):
        return ""
    return next((str(details[k]) for k in _VERSION_KEYS if details.get(k) is not None), "")


def listing(fs: Any, directory: str) -> list[dict[str, Any]]:
    """`fs.ls(directory, detail=True)`, each symbolic link replaced by what it points to
    (fsspec lists a link as type "other"; a Hugging Face hub snapshot is a directory of
    links to its blobs). A broken link is left out."""
    entries = []
    for entry in fs.ls(directory, detail=True):
        if entry.get("islink") or entry.get("type") == "other":
            try:
                entry = {**fs.info(entry["name"]), "name": entry["name"]}  # follows links
            except FileNotFoundError:
                continue
        entries.append(entry)
    return entries


def regular_file(fs: Any, path: str) -> bool:
    """Whether `path` is a regular file (after links): reading a FIFO waits forever and a
    device such as /dev/zero never ends. Only a local disk has other kinds."""
    if not is_local(fs):
        return True
    return fs.info(path).get("type") == "file"


def write_atomic(fs: Any, path: str, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never a
    part (an interrupted `iolib index` left a truncated file): a local file is written
    beside and renamed; an object store's upload appears only once complete."""
    if not is_local(fs):
        fs.pipe_file(path, data)
        return
    folder, name = posixpath.split(path)
    # Unique per call: two threads of one process may write the same file at once.
    partial = posixpath.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(partial, "wb") as handle:
            handle.write(data)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


@dataclass(frozen=True)
class SummarizedFile:
    """One file as the summary describes it: its row groups are the summary's
    [first_group, first_group + groups)."""

    path: str
    size: int
    version: str
    first_group: int
    groups: int


def _open_summary(fs: Any, where: str) -> pq.FileMetaData | None:
    """The summary's footer, or None (with a warning where one is there but unreadable:
    truncated, garbage, empty, a directory, a FIFO)."""
    try:
        if not regular_file(fs, where):
            log.warning("%s is not a regular file: reading every footer.", where)
            return None
        with fs.open(where, "rb") as handle:
            return pq.read_metadata(handle)
    except FileNotFoundError:
        return None
    except (OSError, EOFError, ValueError, pa.ArrowException) as exc:
        # The text, not the exception: a kept log record would keep its traceback's
        # frames, and the file handle open in them, alive.
        log.warning("%s cannot be read (%s: %s): reading every footer. `iolib index` writes "
                    "it again.", where, type(exc).__name__, str(exc))  # fmt: skip
        return None


def _recorded(meta: pq.FileMetaData) -> dict[str, list] | None:
    """The sizes and versions `write_summary` recorded, by file name (None: not ours)."""
    raw = (meta.metadata or {}).get(FILES_KEY)
    if raw is None:
        return None
    try:
        recorded = json.loads(raw)
        return recorded if isinstance(recorded, dict) else {}
    except ValueError:
        return {}


def _stale(where: str, listed: dict[str, dict], recorded: dict[str, list] | None) -> bool:
    """Whether a file of the listing differs from its recorded size or version."""
    if recorded is None:  # written by another tool: names are all it can be checked by
        return False
    for name, entry in listed.items():
        got = recorded.get(name)
        size, version = [*(got if isinstance(got, list) else []), None, None][:2]
        now = (int(entry.get("size") or 0), version_of(entry))
        if (size, version) != now:
            log.warning("%s: %s (%r: size %s, version %r recorded; %s, %r listed). Reading "
                        "every footer.", STALE, where, name, size, version, *now)  # fmt: skip
            return True
    return False


def read_summary(fs: Any, directory: str) -> tuple[pq.FileMetaData, list[SummarizedFile]] | None:
    """The directory's summary and its files, or None where there is none, it cannot be
    read, or it does not match the directory's Parquet files."""
    where = posixpath.join(directory.rstrip("/"), SUMMARY_NAME)
    meta = _open_summary(fs, where)
    if meta is None:
        return None
    listed = {
        posixpath.basename(e["name"]): e
        for e in listing(fs, directory)
        if e.get("type") == "file" and e["name"].endswith((".parquet", ".pq"))
    }
    files: list[SummarizedFile] = []
    seen: set[str] = set()
    for group in range(meta.num_row_groups):
        name = meta.row_group(group).column(0).file_path if meta.num_columns else ""
        if files and name in seen and files[-1].path.endswith("/" + name):
            last = files[-1]
            files[-1] = SummarizedFile(last.path, last.size, last.version, last.first_group,
                                       last.groups + 1)  # fmt: skip
            continue
        entry = listed.get(name)
        if entry is None or name in seen:  # unknown, or its row groups are not together
            log.warning("%s does not match the directory (%r): reading every footer.", where, name)
            return None
        seen.add(name)
        path = posixpath.join(directory.rstrip("/"), name)
        files.append(SummarizedFile(path, int(entry["size"]), version_of(entry), group, 1))
    if sorted(posixpath.basename(f.path) for f in files) != sorted(listed):
        log.warning("%s does not list every Parquet file of the directory: reading every "
                    "footer. `iolib index` writes it again.", where)  # fmt: skip
        return None
    if _stale(where, listed, _recorded(meta)):
        return None
    files.sort(key=lambda f: f.path)
    return meta, files


def write_summary(fs: Any, directory: str, paths: list[str]) -> str:
    """Write `directory`/_metadata from the footers of `paths` (files in that directory),
    with each file's size and version as listed before its footer is read (a file
    rewritten meanwhile then reads as stale, not as summarized)."""
    listed = {e["name"].rstrip("/"): e for e in listing(fs, directory)}
    footers, record = [], {}
    for path in sorted(paths):
        entry = listed.get(path.rstrip("/")) or fs.info(path)
        with fs.open(path, "rb") as handle:
            footer = pq.ParquetFile(handle).metadata
        name = posixpath.basename(path)
        footer.set_file_path(name)
        footers.append(footer)
        record[name] = [int(entry.get("size") or 0), version_of(entry)]
    where = posixpath.join(directory.rstrip("/"), SUMMARY_NAME)
    if not footers:
        raise ValueError(f"{directory!r} holds no Parquet files to summarize")
    # The recorded sizes ride in the footer's key-value metadata: an empty file written
    # with them gives a footer that carries them, to which every row group is appended.
    schema = footers[0].schema.to_arrow_schema()
    schema = schema.with_metadata({**(schema.metadata or {}), FILES_KEY: json.dumps(record)})
    empty = io.BytesIO()
    pq.ParquetWriter(empty, schema).close()
    combined = pq.read_metadata(pa.BufferReader(empty.getvalue()))
    for footer in footers:
        combined.append_row_groups(footer)
    sink = pa.BufferOutputStream()
    combined.write_metadata_file(sink)
    write_atomic(fs, where, sink.getvalue().to_pybytes())
    return where
