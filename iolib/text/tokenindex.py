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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow.compute as pc

from iolib.errors import DataError
from iolib.sources.parquet import ParquetSource
from iolib.storage import open_filesystem

log = logging.getLogger(__name__)
T = TypeVar("T")
INDEX_VERSION = 1
INDEX_THREADS = 8  # row groups read at once when building: requests in flight fill a link


def cache_dir() -> Path:
    """Where computed indices are kept: $IOLIB_CACHE_DIR, else ~/.cache/iolib."""
    root = os.environ.get("IOLIB_CACHE_DIR") or Path.home() / ".cache" / "iolib"
    return Path(root) / "token-index"


def beside_url(source: ParquetSource, column: str) -> str:
    """The index file's URL beside the data: in the first URL's directory."""
    first = source.urls[0].rstrip("/")
    folder = first if not first.endswith((".parquet", ".pq")) and "*" not in first else None
    if folder is None:
        folder = first.rsplit("/", 1)[0] if "/" in first else "."
        while any(c in folder for c in "*?["):
            folder = folder.rsplit("/", 1)[0]
    return f"{folder}/_iolib_tokens.{column}.npz"


@dataclass(frozen=True)
class TokenIndex:
    """Per row group (numbered across files): token count and non-empty documents."""

    fingerprint: str
    column: str
    tokens: np.ndarray  # int64 [row groups]
    documents: np.ndarray  # int64 [row groups]: rows with at least one token

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
    def from_bytes(cls, data: bytes) -> TokenIndex:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            if int(z["version"]) != INDEX_VERSION:
                raise ValueError(f"index version {int(z['version'])}, not {INDEX_VERSION}")
            return cls(str(z["fingerprint"]), str(z["column"]), z["tokens"], z["documents"])


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


def _read(url: str, storage_options: dict) -> bytes | None:
    try:
        fs, path = open_filesystem(url, storage_options)
        with fs.open(path, "rb") as handle:
            return handle.read()
    except (FileNotFoundError, PermissionError, OSError):
        return None


def _valid(data: bytes | None, fingerprint: str, where: str) -> TokenIndex | None:
    if data is None:
        return None
    try:
        index = TokenIndex.from_bytes(data)
    except (ValueError, KeyError, OSError) as exc:
        log.warning("Ignoring the token index %s: unreadable (%s); computing it again.", where, exc)
        return None
    if index.fingerprint != fingerprint:
        log.info("Ignoring the token index %s: written for other data.", where)
        return None
    return index


def load_or_compute(source: ParquetSource, column: str) -> TokenIndex:
    """The index from beside the data, else the local cache, else computed (and kept in
    the local cache for the next run)."""
    fingerprint = _fingerprint(source, column)
    beside = beside_url(source, column)
    found = _valid(_read(beside, source.storage_options), fingerprint, "beside the data")
    local = cache_dir() / f"{fingerprint}.npz"
    if found is None and local.is_file():
        found = _valid(local.read_bytes(), fingerprint, str(local))
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
        partial = local.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(index.to_bytes())
        partial.replace(local)  # atomic: a concurrent reader sees all or nothing
    except OSError as exc:
        log.warning("Could not keep the token index in %s: %s", local, exc)
    return index


def write_beside(source: ParquetSource, column: str) -> tuple[str, TokenIndex]:
    """Compute the index and write it beside the data (what `iolib index` does)."""
    index = compute(source, column)
    url = beside_url(source, column)
    fs, path = open_filesystem(url, source.storage_options)
    with fs.open(path, "wb") as handle:
        handle.write(index.to_bytes())
    return url, index
