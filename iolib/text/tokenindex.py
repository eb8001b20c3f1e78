"""Tokens and documents per row group of a token column: the index packing needs.

Why an index: windows of `seq_len` tokens are located by prefix sums over row groups,
so a loader needs each row group's token count before it reads any tokens. Parquet's
footers do not hold it (a column chunk counts empty and null lists as values), so it is
computed once from the list offsets, by reading the column, and kept: beside the data
(`iolib index` writes it there) or in a local cache directory keyed by the dataset's
fingerprint (as Megatron keeps its GPT dataset index files). Its size is O(row groups):
16 bytes a row group, 1.3 MB for a 10 TB corpus in 128 MB row groups.
"""

from __future__ import annotations

import io
import logging
import os
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow.compute as pc

from iolib.base.resources import thread_budget
from iolib.errors import DataError
from iolib.sources import ParquetSource, is_pattern, leaf_values, regular_file, write_atomic
from iolib.storage import open_filesystem

log = logging.getLogger(__name__)
T = TypeVar("T")
INDEX_VERSION = 1
INDEX_THREADS = thread_budget().index_reads  # row groups read at once when building


def cache_dir() -> Path:
    """Where computed indices are kept: $IOLIB_CACHE_DIR, else ~/.cache/iolib."""
    root = os.environ.get("IOLIB_CACHE_DIR") or Path.home() / ".cache" / "iolib"
    return Path(root) / "token-index"


def beside_url(source: ParquetSource, column: str) -> str:
    """The index file's URL beside the data: in the first URL's directory."""
    first = source.urls[0].rstrip("/")
    fs, path = open_filesystem(first, source.storage_options)
    pattern = is_pattern(fs, path)
    folder = first if not first.endswith((".parquet", ".pq")) and not pattern else None
    if folder is None:
        folder = first.rsplit("/", 1)[0] if "/" in first else "."
        while pattern and any(c in folder for c in "*?["):
            folder = folder.rsplit("/", 1)[0]
    return f"{folder}/_iolib_tokens.{column}.npz"


# What a valid index file holds: each member's dtype kind and number of dimensions.
_MEMBERS = {"version": ("iu", 0), "fingerprint": ("U", 0), "column": ("U", 0),
            "tokens": ("i", 1), "documents": ("i", 1)}  # fmt: skip


def size_bound(groups: int) -> int:
    """The most bytes an index of `groups` row groups can take (16 a row group, stored
    uncompressed, plus names and headers): a larger file is not an index of this data,
    and is never inflated (a 2 MB zip inflated to a 2 GiB array before failing)."""
    return 16 * groups + 64 * 1024


def _checked_header(archive: zipfile.ZipFile, name: str, bound: int) -> None:
    """Refuse a member whose header (read alone: a few hundred bytes) is not what an
    index holds, before any of its data is inflated."""
    kinds, ndim = _MEMBERS[name]
    info = archive.getinfo(f"{name}.npy")
    if info.file_size > bound:
        raise ValueError(f"{name} takes {info.file_size} bytes, over {bound}")
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member)
        else:
            raise ValueError(f"{name}: .npy format {version}")
    widest = 4096 if dtype.kind == "U" else 8  # a name of 1,024 characters, int64
    if dtype.kind not in kinds or dtype.itemsize > widest:
        raise ValueError(f"{name} is {dtype}")
    if len(shape) != ndim or int(np.prod(shape)) * dtype.itemsize > bound:
        raise ValueError(f"{name} has shape {shape}")


@dataclass(frozen=True)
class TokenIndex:
    """Per row group (numbered across files): token count and non-empty documents."""

    fingerprint: str
    column: str
    tokens: np.ndarray  # int64 [row groups]
    documents: np.ndarray  # int64 [row groups]: rows with at least one token
    where: str = field(default="", compare=False)  # the file it came from, for messages

    @property
    def stream(self) -> np.ndarray:
        """Tokens each row group adds to the packed stream: its tokens and one eos per
        non-empty document."""
        return self.tokens + self.documents

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        np.savez(
            out,
            version=INDEX_VERSION,
            fingerprint=self.fingerprint,
            column=self.column,
            tokens=self.tokens,
            documents=self.documents,
        )
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, groups: int | None = None) -> TokenIndex:
        """Parse an index file; every member's header is checked before its data is
        read (ValueError if it is not an index, or not one of `groups` row groups)."""
        bound = size_bound(groups if groups is not None else len(data))
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except zipfile.BadZipFile as exc:
            raise ValueError(f"not an index file ({exc})") from None
        with archive:
            names = set(archive.namelist())
            missing = [n for n in _MEMBERS if f"{n}.npy" not in names]
            if missing:
                raise ValueError(f"no {', '.join(missing)} in it")
            for name in _MEMBERS:
                _checked_header(archive, name, bound)
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                if int(z["version"]) != INDEX_VERSION:
                    raise ValueError(f"index version {int(z['version'])}, not {INDEX_VERSION}")
                tokens, documents = z["tokens"].astype(np.int64), z["documents"].astype(np.int64)
                index = cls(str(z["fingerprint"]), str(z["column"]), tokens, documents)
        if groups is not None and index.tokens.size != groups:
            raise ValueError(f"{index.tokens.size} row groups, not {groups}")
        if index.documents.size != index.tokens.size:
            raise ValueError("tokens and documents differ in length")
        return index

    def check(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Raise ValueError unless each row group's counts can be true of data with
        `rows` rows and `values` list items (Parquet's footer counts) per row group."""
        tokens, documents = self.tokens, self.documents
        bad = (tokens < 0) | (documents < 0) | (documents > tokens) | (documents > rows)
        bad |= tokens > values
        if bad.any():
            g = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"row group {g}: {int(tokens[g])} tokens in {int(documents[g])} documents, "
                f"of {int(rows[g])} rows and {int(values[g])} list items"
            )

    def check_segment(self, group: int, tokens: int, documents: int) -> None:
        """Raise a DataError unless row group `group`, as read, has the index's counts:
        a wrong count shifts every window after it (halved counts delivered half the
        tokens, silently)."""
        want = (int(self.tokens[group]), int(self.documents[group]))
        if (tokens, documents) != want:
            raise DataError(
                f"The token index of {self.column!r} ({self.where or 'computed'}) says row "
                f"group {group} holds {want[0]} tokens in {want[1]} documents; it holds "
                f"{tokens} in {documents}. The data changed since the index was written, or "
                "the index is damaged: run `iolib index` again (or delete the file)."
            )


NO_SKIP = (
    " PackedTokens cannot leave a row group out (on_error='skip' does not apply: the "
    "stream's layout counts every row group's tokens): rewrite the file, or leave it "
    "out of the URLs."
)


def unskippable(read: Callable[[], T]) -> T:
    """Run a row-group read; a data error says what to do instead of skipping."""
    try:
        return read()
    except DataError as exc:
        message = str(exc).replace(", or pass on_error='skip' to leave its rows out (counted)", "")
        raise DataError(message.rstrip() + NO_SKIP) from exc


def _fingerprint(source: ParquetSource, column: str) -> str:
    return f"{source.fingerprint()}-{column}"


def compute(source: ParquetSource, column: str) -> TokenIndex:
    """Read the column once, row groups in parallel, and count. Arrow's buffers of each
    row group are dropped as soon as it is counted."""
    groups = len(source.blocks())

    def count(group: int) -> tuple[int, int]:
        array = unskippable(lambda: source.fetch_row_group(group)).column(column)
        lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
        return int(lengths.sum()), int(np.count_nonzero(lengths))

    with ThreadPoolExecutor(INDEX_THREADS, thread_name_prefix="iolib-index") as pool:
        counts = list(pool.map(count, range(groups)))
    pairs = np.array(counts, dtype=np.int64).reshape(-1, 2)
    return TokenIndex(_fingerprint(source, column), column, pairs[:, 0], pairs[:, 1])


def _footer_counts(source: ParquetSource, column: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows and list items of the column per row group, from the footers (no read)."""
    rows = np.array(source.blocks(), dtype=np.int64)
    values = [
        leaf_values(f.group_meta(local)).get(column, 0)
        for f in source.files
        for local in range(len(f.row_groups))
    ]
    return rows, np.array(values, dtype=np.int64)


def _read(url: str, storage_options: dict, bound: int) -> tuple[bytes | None, str]:
    """The file's bytes, or None (with why, where it is there but cannot be an index)."""
    try:
        fs, path = open_filesystem(url, storage_options)
        if not regular_file(fs, path):
            return None, "not a regular file"
        with fs.open(path, "rb") as handle:
            data = handle.read(bound + 1)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:  # a directory, no permission, storage down: computed instead
        return None, f"{type(exc).__name__}: {exc}"
    if len(data) > bound:
        return None, f"larger than {bound} bytes, the most an index of this data takes"
    return data, ""


def _valid(
    data: bytes | None, why: str, fingerprint: str, where: str, counts: Callable[[], tuple]
) -> TokenIndex | None:
    if data is None:
        if why:
            log.warning("Ignoring the token index %s: %s; computing it again.", where, why)
        return None
    rows, values = counts()
    try:
        index = TokenIndex.from_bytes(data, groups=rows.size)
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:
        log.warning(
            "Ignoring the token index %s: unreadable (%s); computing it again (`iolib index` "
            "writes it again).", where, exc,
        )  # fmt: skip
        return None
    if index.fingerprint != fingerprint:
        log.info("Ignoring the token index %s: written for other data.", where)
        return None
    try:
        index.check(rows, values)
    except ValueError as exc:
        log.warning(
            "Ignoring the token index %s: it cannot be true of this data (%s); computing it "
            "again (`iolib index` writes it again).", where, exc,
        )  # fmt: skip
        return None
    return TokenIndex(index.fingerprint, index.column, index.tokens, index.documents, where)


def load_or_compute(source: ParquetSource, column: str) -> TokenIndex:
    """The index from beside the data, else the local cache, else computed (and kept in
    the local cache for the next run). A file found is checked against the footers'
    counts; one that cannot be read, or cannot be true, is ignored with a warning."""
    fingerprint = _fingerprint(source, column)
    beside = beside_url(source, column)
    bound = size_bound(len(source.blocks()))
    counted: list[tuple] = []

    def counts() -> tuple:
        if not counted:
            counted.append(_footer_counts(source, column))
        return counted[0]

    found = _valid(*_read(beside, source.storage_options, bound), fingerprint, beside, counts)
    local = cache_dir() / f"{fingerprint}.npz"
    if found is None and (local.exists() or local.is_symlink()):
        found = _valid(*_read(str(local), {}, bound), fingerprint, str(local), counts)
    if found is not None:
        return found
    log.info(
        "%s: counting the tokens of each row group once (kept in %s; `iolib index` writes "
        "it beside the data).",
        source.describe(),
        local,
    )
    index = compute(source, column)
    try:
        local.parent.mkdir(parents=True, exist_ok=True)
        fs, path = open_filesystem(str(local), {})
        write_atomic(fs, path, index.to_bytes())  # a concurrent reader sees all or nothing
    except OSError as exc:
        log.warning("Could not keep the token index in %s: %s", local, str(exc))
    return index


def write_beside(source: ParquetSource, column: str) -> tuple[str, TokenIndex]:
    """Compute the index and write it beside the data (what `iolib index` does)."""
    index = compute(source, column)
    url = beside_url(source, column)
    fs, path = open_filesystem(url, source.storage_options)
    write_atomic(fs, path, index.to_bytes())  # an interrupted run leaves the old file
    return url, index
