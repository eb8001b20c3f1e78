"""A Parquet source travels to a worker as its description: files, footers and options,
never its cache, threads or open files; the worker reads the same rows from it."""

from __future__ import annotations

import dataclasses
import pickle

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib.sources import ParquetSource
from iolib.sources.summary import write_summary


def _write(directory, files: int = 12) -> str:
    directory.mkdir()
    for f in range(files):
        ids = np.arange(f * 200, f * 200 + 200)
        table = pa.table({"id": ids, "text": [f"row {i}" for i in ids], "tokens": [[1, 2]] * 200})
        pq.write_table(table, directory / f"p{f:02d}.parquet", row_group_size=64)
    return str(directory)


def _same_files(left: ParquetSource, right: ParquetSource) -> None:
    assert len(left.files) == len(right.files)
    for a, b in zip(left.files, right.files, strict=True):
        assert (a.url, a.path, a.row_groups, a.size, a.version) == (
            b.url, b.path, b.row_groups, b.size, b.version,
        )  # fmt: skip
        assert a.footer.equals(b.footer) and a.schema.equals(b.schema)
        assert a.column_bytes == b.column_bytes and a.spans == b.spans


@pytest.mark.parametrize("summary", [False, True])
def test_a_pickled_source_reads_the_same_rows_and_carries_no_reads(tmp_path, summary) -> None:
    url = _write(tmp_path / "d")
    if summary:  # every file's row groups in one shared footer
        write_summary(fsspec.filesystem("file"), url, sorted(map(str, (tmp_path / "d").iterdir())))
    source = ParquetSource(url, cache_bytes=2**26)
    order = np.random.default_rng(0).permutation(len(source))
    planned = pickle.dumps(source)
    expected = source.read(order)  # fills the parent's cache
    assert source.cache_stats()["cache_held_bytes"] > 0
    travelling = pickle.dumps(source)
    assert len(travelling) == len(planned)  # nothing read travels
    clone = pickle.loads(travelling)
    assert clone.cache_stats()["cache_held_bytes"] == 0  # a fresh reader
    _same_files(clone, source)
    assert clone.fingerprint() == source.fingerprint()
    assert clone.read(order).equals(expected)


def test_many_files_pickle_smaller_than_their_footers(tmp_path) -> None:
    """Footers repeat the schema file after file; the description sends them packed."""
    source = ParquetSource(_write(tmp_path / "d", files=40))
    footers = sum(len(pickle.dumps(f.footer)) for f in source.files)
    assert len(pickle.dumps(source)) < footers / 4


def test_the_description_cannot_change_under_a_worker(tmp_path) -> None:
    source = ParquetSource(_write(tmp_path / "d", files=2), columns=["id"])
    description = source.description
    with pytest.raises(dataclasses.FrozenInstanceError):
        description.columns = ("text",)  # type: ignore[misc]
    projected = source.with_columns(["text"])
    assert source.description is description and source.columns == ["id"]
    assert projected.read(np.array([3])).column_names == ["text"]
    assert projected.files[0].footer is source.files[0].footer  # footers not read again


def test_an_uncached_projection_reads_row_groups_and_keeps_none(tmp_path) -> None:
    source = ParquetSource(_write(tmp_path / "d", files=2))
    tokens = source.uncached(["tokens"])
    table = tokens.fetch_row_group(1)
    assert table.column_names == ["tokens"] and table.num_rows == 64
    assert tokens.cache_stats()["cache_held_bytes"] == 0
    assert tokens.cache_stats()["cache_budget_bytes"] == 0
