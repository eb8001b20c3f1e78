"""The dense column store gives exactly what Arrow row-group reads give, or steps aside."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.loader.testing import assert_batches_equal, epoch_batches
from iolib.sources import ParquetSource


def write_mixed(directory: Path, rows: int = 90, nulls: bool = False) -> str:
    """Two files of fixed-width columns: int8, float64, a fixed-size list and a nested one."""
    directory.mkdir(parents=True, exist_ok=True)
    for part, (lo, hi) in enumerate(((0, rows // 3), (rows // 3, rows))):
        ids = np.arange(lo, hi)
        grid = (ids[:, None] * 10 + np.arange(6)).astype(np.float32).ravel()
        tokens = pa.array((ids[:, None] * 3 + np.arange(4)).astype(np.int32).ravel())
        small = pa.array((ids % 100).astype(np.int8))
        if nulls and part == 1:
            small = pa.array([None if i == hi - 2 else int(i % 100) for i in ids], pa.int8())
        table = pa.table({
            "id": ids.astype(np.int64),
            "small": small,
            "score": ids.astype(np.float64) / 7,
            "tokens": pa.FixedSizeListArray.from_arrays(tokens, 4),
            "grid": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(grid), 3), 2
            ),
        })  # fmt: skip
        pq.write_table(table, directory / f"part-{part}.parquet", row_group_size=11)
    return str(directory)


def dense_source(url: str) -> ParquetSource:
    source = ParquetSource(url)
    source.fit_cache(1)  # the dataset is tiny: the whole of it is kept, densely
    return source


def test_dense_reads_equal_arrow_reads(tmp_path) -> None:
    url = write_mixed(tmp_path / "d")
    dense, arrow = dense_source(url), ParquetSource(url, cache_bytes=2**26)
    rng = np.random.default_rng(0)
    for size in (1, 7, 90):
        indices = rng.permutation(90)[:size]
        got, want = dense.read(indices), arrow.read(indices)
        assert got.schema.equals(want.schema, check_metadata=False)
        assert got.equals(want)
    held = dense.reader.dense_row_groups()
    assert held is not None and arrow.reader.dense_row_groups() is None  # each path ran
    assert held.all()


def test_dense_store_is_filled_as_row_groups_are_first_read(tmp_path) -> None:
    source = dense_source(write_mixed(tmp_path / "d"))
    source.read(np.array([0, 1, 2]))  # all in row group 0
    held = source.reader.dense_row_groups()
    assert held.tolist() == [True] + [False] * (len(source.blocks()) - 1)


def test_a_null_sends_reads_back_to_arrow_with_the_null_kept(tmp_path) -> None:
    url = write_mixed(tmp_path / "n", nulls=True)
    dense, arrow = dense_source(url), ParquetSource(url, cache_bytes=2**26)
    everything = np.arange(90)[::-1].copy()
    got = dense.read(everything)
    assert got.equals(arrow.read(everything))
    assert got.column("small").null_count == 1
    assert dense.reader.dense_row_groups() is None  # gave up for good
    assert dense.read(everything).equals(got)


def test_other_types_keep_the_arrow_path(tmp_path) -> None:
    pq.write_table(pa.table({"x": [1, 2, 3], "s": ["a", "b", "c"]}), tmp_path / "s.parquet")
    source = dense_source(str(tmp_path / "s.parquet"))
    assert source.read(np.array([2, 0])).column("s").to_pylist() == ["c", "a"]
    assert source.reader.dense_row_groups() is None


@pytest.mark.parametrize("shuffle", [False, "global", "block"])
def test_loader_batches_same_from_dense_and_arrow(tmp_path, shuffle) -> None:
    url = write_mixed(tmp_path / "d")

    def run(cache_bytes, **kw):
        source = ParquetSource(url, cache_bytes=cache_bytes)
        loader = DataLoader(source, batch_size=8, shuffle=shuffle, seed=3, **kw)
        batches = epoch_batches(loader, epoch=1)
        in_this_process = kw.get("worker_mode") != "process"
        held = source.reader.dense_row_groups()
        assert (held is not None) == (cache_bytes is None and in_this_process)
        return batches

    reference = run(2**26)  # Arrow row groups
    for kw in ({}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "process"}):
        assert_batches_equal(run(None, **kw), reference, f"dense, {kw}")


def test_each_row_group_is_read_once_by_racing_threads(tmp_path) -> None:
    """A thread that found a row group missing just before another filled it must not
    read it again (it did: the reader left the single-flight before filling the store)."""
    import threading

    url = write_mixed(tmp_path / "d", rows=900)
    for _ in range(5):
        source = ParquetSource(url)
        source.fit_cache(1)
        orders = [np.random.default_rng(seed).permutation(900) for seed in range(4)]
        threads = [
            threading.Thread(
                target=lambda o=o, s=source: [s.read(o[i : i + 7]) for i in range(0, 900, 7)]
            )
            for o in orders
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a reader did not finish in 120 s"
        assert source.reader.dense_row_groups().all()
        # Every read from storage is counted: each row group read once, none again.
        stats = source.cache_stats()
        assert stats["row_group_reads"] == len(source.blocks()), stats
        assert stats["row_group_rereads"] == 0, stats
