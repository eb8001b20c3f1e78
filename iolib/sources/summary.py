"""Parquet's `_metadata` summary file: the footers of every file of a directory in one
read, so a dataset of 100,000 files starts with a listing and one request instead of
two requests a file (the format's own convention: pyarrow writes it with
`pq.write_metadata`, Spark and Dask read it).

Trusted only while it matches the directory: every listed Parquet file, and no other,
with its row groups together and in order; otherwise the footers are read as usual.
"""

from __future__ import annotations

import logging
import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

log = logging.getLogger(__name__)
SUMMARY_NAME = "_metadata"
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "updated")


def version_of(details: dict[str, Any] | None) -> str:
    """The store's word for a file's content in its listing or open details: an object
    store's ETag, a file's modification time; "" where neither is known."""
    if not isinstance(details, dict):
        return ""
    return next((str(details[k]) for k in _VERSION_KEYS if details.get(k) is not None), "")


@dataclass(frozen=True)
class SummarizedFile:
    """One file as the summary describes it: its row groups are the summary's
    [first_group, first_group + groups)."""

    path: str
    size: int
    version: str
    first_group: int
    groups: int


def read_summary(fs: Any, directory: str) -> tuple[pq.FileMetaData, list[SummarizedFile]] | None:
    """The directory's summary and its files, or None where there is none or it does not
    match the directory's Parquet files."""
    where = posixpath.join(directory.rstrip("/"), SUMMARY_NAME)
    try:
        with fs.open(where, "rb") as handle:
            meta = pq.read_metadata(handle)
    except FileNotFoundError:
        return None
    listed = {
        posixpath.basename(e["name"]): e
        for e in fs.ls(directory, detail=True)
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
    files.sort(key=lambda f: f.path)
    return meta, files


def write_summary(fs: Any, directory: str, paths: list[str]) -> str:
    """Write `directory`/_metadata from the footers of `paths` (files in that directory)."""
    footers = []
    schema = None
    for path in sorted(paths):
        with fs.open(path, "rb") as handle:
            footer = pq.ParquetFile(handle).metadata
        footer.set_file_path(posixpath.basename(path))
        footers.append(footer)
        schema = schema or footer.schema.to_arrow_schema()
    where = posixpath.join(directory.rstrip("/"), SUMMARY_NAME)
    if schema is None:
        raise ValueError(f"{directory!r} holds no Parquet files to summarize")
    combined = footers[0]
    for footer in footers[1:]:
        combined.append_row_groups(footer)
    with fs.open(where, "wb") as handle:
        combined.write_metadata_file(handle)
    return where
