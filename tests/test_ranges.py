"""Parquet reads ask storage for the column chunks a batch needs: no read-ahead thrown
away, one request for a batch of small row groups, nothing held after the batch."""

from __future__ import annotations

import itertools
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iolib import DataLoader
from iolib.sources import ParquetSource
from iolib.sources.ranges import RangedFile, coalesce
from iolib.storage import ShortReadError
from iolib.storage.throttle import ThrottledFileSystem


def _record_reads(monkeypatch) -> list[tuple[int, int]]:
    """Every ranged read the throttled filesystem is asked for, from any thread."""
    reads: list[tuple[int, int]] = []
    request = ThrottledFileSystem.before_request

    def recording(self, kind: str, path: str, start, end):
        if kind == "read":
            reads.append((start, end))
        return request(self, kind, path, start, end)

    monkeypatch.setattr(ThrottledFileSystem, "before_request", recording)
    return reads


def _chunk(path: Path, group: int, column: str) -> tuple[int, int]:
    """The bytes of one column chunk, from the footer (pyarrow's own reckoning)."""
    meta = pq.ParquetFile(path).metadata.row_group(group)
    names = [meta.column(j).path_in_schema for j in range(meta.num_columns)]
    chunk = meta.column(names.index(column))
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
        start = chunk.dictionary_page_offset
    return start, start + chunk.total_compressed_size


def _throttled(directory: Path, **kw) -> ParquetSource:
    options = {"throttled": {"latency_ms": 0, "skip_instance_cache": True}}
    return ParquetSource(f"throttled::file://{directory}", storage_options=options, **kw)


def test_each_row_group_is_read_as_its_column_chunks_and_no_more(tmp_path, monkeypatch) -> None:
    """fsspec's buffered files read a block ahead (1 MiB here, 5 MiB or more in s3fs);
    with two workers each reading every other row group, the bytes read ahead belonged
    to the other worker, and half of every request was thrown away."""
    rows = np.arange(4 * 16384)
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": rows, "y": -rows}), path, row_group_size=16384)
    reads = _record_reads(monkeypatch)
    source = _throttled(tmp_path, columns=["y"], cache_bytes=1)
    assert len(source) == len(rows)  # plans: the footer reads are not counted below
    reads.clear()
    batches = list(DataLoader(source, batch_size=16384, num_workers=2))
    assert np.concatenate([b["y"].numpy() for b in batches]).tolist() == (-rows).tolist()
    assert sorted(reads) == [_chunk(path, g, "y") for g in range(4)]


def test_a_batch_of_small_row_groups_costs_one_request(tmp_path, monkeypatch) -> None:
    """Sixteen row groups of 100 rows, batches of 400: one request per batch, from its
    first row group's chunk to its last one's (read-ahead gave this for free; exact
    reads one row group at a time would pay 16 round trips)."""
    rows = np.arange(1600)
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": rows}), path, row_group_size=100)
    reads = _record_reads(monkeypatch)
    source = _throttled(tmp_path, cache_bytes=1)
    assert len(source) == len(rows)
    reads.clear()
    batches = list(DataLoader(source, batch_size=400, num_workers=1))
    assert np.concatenate([b["x"].numpy() for b in batches]).tolist() == rows.tolist()
    expected = [(_chunk(path, 4 * k, "x")[0], _chunk(path, 4 * k + 3, "x")[1]) for k in range(4)]
    assert sorted(reads) == expected


def test_a_batch_of_every_other_row_group_reads_no_row_group_between(tmp_path, monkeypatch) -> None:
    """Row groups 0, 2, 4, 6 of one file in one batch: a row group between two wanted
    ones is nobody's, so it is not read to save a request (1 MB row groups of a
    shuffle window once fetched 2.0x the data that way)."""
    rows = np.random.default_rng(0).integers(0, 2**62, 8 * 16000)  # 128 KB a row group
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": rows}), path, row_group_size=16000, compression="none")
    reads = _record_reads(monkeypatch)
    source = _throttled(tmp_path, cache_bytes=1)
    assert len(source) == len(rows)
    reads.clear()
    wanted = np.concatenate([np.arange(g * 16000, g * 16000 + 10) for g in (0, 2, 4, 6)])
    assert source.read(wanted).column("x").to_pylist() == rows[wanted].tolist()
    chunks = [_chunk(path, g, "x") for g in (0, 2, 4, 6)]
    assert sum(end - start for start, end in reads) == sum(e - s for s, e in chunks)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_column_of_small_row_groups_is_read_without_the_columns_between(
    tmp_path, monkeypatch, workers
) -> None:
    """One small column of a batch's neighbouring row groups: the other column's chunks
    lie between them, and nobody asked for those bytes (a pipeline stage reading only
    labels once read the payloads between them, 20x its own bytes)."""
    rows = np.arange(1600)
    payload = np.random.default_rng(0).integers(0, 2**62, (1600, 4)).tolist()
    path = tmp_path / "a.parquet"
    table = pa.table({"label": rows, "payload": payload})
    pq.write_table(table, path, row_group_size=100, compression="none")
    reads = _record_reads(monkeypatch)
    source = _throttled(tmp_path, columns=["label"], cache_bytes=1)
    assert len(source) == len(rows)
    reads.clear()
    batches = list(DataLoader(source, batch_size=400, num_workers=workers))
    assert np.concatenate([b["label"].numpy() for b in batches]).tolist() == rows.tolist()
    chunks = [_chunk(path, g, "label") for g in range(16)]
    assert sum(end - start for start, end in reads) == sum(e - s for s, e in chunks)


def test_the_bytes_read_for_a_batch_are_let_go_after_it(tmp_path) -> None:
    """The reads run on pool threads and their helpers (timeouts), the batch ends on
    the caller's: every file a read opened lets go of its bytes, or it kept every row
    group it read (the next epoch then came from memory, and memory grew with the
    dataset). Looked for in every open file, whichever thread holds it."""
    import gc

    pq.write_table(pa.table({"x": np.arange(400)}), tmp_path / "a.parquet", row_group_size=100)
    source = _throttled(tmp_path, cache_bytes=1)
    table = source.read(np.arange(50, 250))
    assert table.column("x").to_pylist() == list(range(50, 250))
    held = [f.held_bytes for f in gc.get_objects() if isinstance(f, RangedFile)]
    assert held and not any(held), held


def test_a_ranged_file_serves_what_it_loaded_and_reads_the_rest() -> None:
    fs = fsspec.filesystem("memory")
    data = bytes(range(256)) * 4
    fs.pipe_file("/iolib-ranges/x", data)
    ranged = RangedFile(fs, "/iolib-ranges/x", len(data))
    ranged.load([(100, 200), (600, 700)])
    assert ranged.requests == 2 and ranged.held_bytes == 200
    ranged.seek(120)
    assert bytes(ranged.read(10)) == data[120:130] and ranged.tell() == 130
    ranged.load([(150, 190)])  # held already: no request
    assert ranged.requests == 2
    ranged.seek(-4, 2)  # outside the loaded ranges: one request of its own
    assert bytes(ranged.read()) == data[-4:] and ranged.requests == 3
    ranged.release()
    assert ranged.held_bytes == 0


def test_a_short_body_is_a_transient_error_not_short_bytes() -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/iolib-ranges/short", b"x" * 100)
    ranged = RangedFile(fs, "/iolib-ranges/short", 1000)  # the footer said 1000 bytes
    with pytest.raises(ShortReadError, match=r"\[50:500\] returned 50 of 450 bytes"):
        ranged.load([(50, 500)])


def test_ranges_closer_than_the_hole_are_read_in_one_request() -> None:
    spans = [(5000, 6000), (0, 10), (15, 20)]
    assert coalesce(spans, hole=10) == [(0, 20), (5000, 6000)]
    assert coalesce(spans, hole=5000) == [(0, 6000)]
    assert coalesce(spans, hole=5000, limit=1000) == [(0, 20), (5000, 6000)]


@given(
    st.lists(
        st.tuples(st.integers(0, 10_000), st.integers(1, 3_000)).map(lambda p: (p[0], sum(p))),
        max_size=30,
    ),
    st.integers(0, 2_000),
    st.integers(1, 8_000),
)
def test_coalesced_requests_cover_every_range_and_merge_all_they_may(spans, hole, limit) -> None:
    merged = coalesce(spans, hole=hole, limit=limit)
    assert merged == sorted(merged)
    for start, end in spans:
        assert any(a <= start and end <= b for a, b in merged), "a range left unread"
    starts, ends = {a for a, _ in spans}, {b for _, b in spans}
    for a, b in merged:  # no bytes beyond the wanted ranges and the holes between them
        assert a in starts and b in ends
        assert b - a <= limit or (a, b) in spans, "a request over the limit"
    for (a1, b1), (a2, b2) in itertools.pairwise(merged):  # nothing left that could merge
        assert a2 - b1 > hole or b2 - a1 > limit
        assert b2 > b1, "a request inside the one before it: its bytes read twice"
