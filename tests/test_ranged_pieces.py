"""A large row group a batch waits for is read as several ranged GETs on parallel
connections; read-ahead is not split, and no byte is read twice (issue 43, "Reads in
order of need"). Counted at moto's S3 through a `throttled::` wrapper, never timed."""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.sources import ParquetSource, ranges
from iolib.sources.ranges import coalesce, column_spans, pieces
from iolib.storage import ShortReadError, open_filesystem
from tests.fixtures_s3 import s3_options  # noqa: F401 - the fixture
from tests.test_cancel import _no_read_threads, _options, _settle, _upload, store_log  # noqa: F401

ROWS, BLOB = 100, 4000  # 400 KB a row group, incompressible


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def blobs(s3_options, tmp_path):  # noqa: F811
    local = tmp_path / "blobs"
    local.mkdir()
    rng = np.random.default_rng(0)
    table = pa.table({"x": np.arange(3 * ROWS),
                      "blob": [rng.bytes(BLOB) for _ in range(3 * ROWS)]})  # fmt: skip
    pq.write_table(table, local / "a.parquet", row_group_size=ROWS, compression="none")
    return local / "a.parquet", _upload(s3_options, local, f"pieces-{time.monotonic_ns()}")


def _group_span(path, group: int) -> tuple[int, int]:
    (span,) = coalesce([s for spans in column_spans(pq.ParquetFile(path).metadata.row_group(group))
                        .values() for s in spans])  # fmt: skip
    return span


@pytest.fixture
def small_pieces(monkeypatch) -> None:
    """Needed reads above 128 KiB split into 64 KiB pieces: the test data's row groups."""
    monkeypatch.setattr(ranges, "SPLIT_ABOVE", 128 << 10)
    monkeypatch.setattr(ranges, "PIECE_BYTES", 64 << 10)


def test_pieces_cut_only_what_is_larger_and_cover_it_exactly() -> None:
    assert pieces([(0, 100)], above=100, piece=10, most=4) == [(0, 100)]
    cut = pieces([(5, 106), (200, 210)], above=100, piece=10, most=4)
    assert cut[:4] == [(5, 30), (30, 55), (55, 80), (80, 106)] and cut[4:] == [(200, 210)]


def test_a_needed_large_row_group_is_read_in_pieces_once(
    blobs,
    store_log,  # noqa: F811
    s3_options,  # noqa: F811
    small_pieces,
) -> None:
    local, url = blobs
    source = ParquetSource(url, storage_options=_options(s3_options), readahead=1)
    len(source)
    start = len(store_log)
    loader = DataLoader(source, batch_size=ROWS)  # in order: batch 0 is row group 0
    it = iter(loader)
    batch = next(it)
    assert batch["x"].tolist() == list(range(ROWS))
    assert _settle(_no_read_threads)
    reads = [(offset, n) for _, offset, n in store_log.reads[start:]]
    a, b = _group_span(local, 0)
    first = sorted((o, n) for o, n in reads if a <= o < b)
    assert len(first) == 6, first  # 400 KB in pieces of at least 64 KiB
    assert first[0][0] == a and all(o + n == o2 for (o, n), (o2, _) in itertools.pairwise(first))
    assert sum(n for _, n in first) == b - a  # every byte once
    # Row group 1, read ahead while batch 0 was cut, is one request.
    c, d = _group_span(local, 1)
    ahead = [(o, n) for o, n in reads if c <= o < d]
    assert ahead in ([], [(c, d - c)]), ahead
    del it


def test_read_ahead_is_never_split(
    blobs,
    store_log,  # noqa: F811
    s3_options,  # noqa: F811
    small_pieces,
) -> None:
    local, url = blobs
    source = ParquetSource(url, storage_options=_options(s3_options), readahead=2)
    len(source)
    start = len(store_log)
    it = iter(DataLoader(source, batch_size=ROWS))
    next(it)
    assert _settle(_no_read_threads)
    reads = [(offset, n) for _, offset, n in store_log.reads[start:]]
    for group in (1, 2):
        c, d = _group_span(local, group)
        assert [(o, n) for o, n in reads if c <= o < d] in ([], [(c, d - c)])
    del it


def test_a_token_batch_reads_its_large_row_groups_in_pieces_once(
    store_log,  # noqa: F811
    s3_options,  # noqa: F811
    small_pieces,
    tmp_path,
) -> None:
    """PackedTokens' reads take the same path: a row group a batch waits for arrives in
    pieces (a read ahead, promoted or not, in one piece or several), each byte once."""
    from iolib.text import PackedTokens

    local = tmp_path / "tokens"
    local.mkdir()
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 30000, 1000, dtype=np.int32) for _ in range(300)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}),
                   local / "t.parquet", row_group_size=100, compression="none")  # fmt: skip
    url = _upload(s3_options, local, f"pieces-tokens-{time.monotonic_ns()}")
    windows = PackedTokens(url, column="tokens", seq_len=64, eos_id=0,
                           storage_options=_options(s3_options))  # fmt: skip
    len(windows)  # the token index: every row group read once, before the count
    start = len(store_log)
    it = iter(DataLoader(windows, batch_size=4))
    next(it)
    assert _settle(_no_read_threads)
    reads = [(offset, n) for _, offset, n in store_log.reads[start:]]
    split = 0
    for group in range(3):
        a, b = _group_span(local / "t.parquet", group)
        mine = sorted((o, n) for o, n in reads if a <= o < b)
        assert sum(n for _, n in mine) in (0, b - a), mine  # each byte once, if read
        split += len(mine) > 1
    assert split >= 1  # the batch's own row group, at least
    del it


@pytest.mark.parametrize(
    ("fault", "error", "message"),
    [
        ({"truncate_rate": 1.0}, ShortReadError, r"read of \S*data\.bin \[\d+:\d+\] returned"),
        ({"error_rate": 1.0}, ConnectionResetError, r"read \S*data\.bin \[\d+:\d+\]"),
    ],
)
def test_a_failed_piece_is_raised_naming_the_file_and_its_range(
    tmp_path, monkeypatch, fault, error, message
) -> None:
    """A piece's failure reaches the read that split it (never swallowed, never short
    bytes handed on), naming the file and the piece's range; no piece thread is left."""
    monkeypatch.setattr(ranges, "SPLIT_ABOVE", 1000)
    monkeypatch.setattr(ranges, "PIECE_BYTES", 1000)
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 40)  # 10,240 bytes: 8 pieces
    fs, path = open_filesystem(f"faulty::file://{tmp_path}/data.bin", {"faulty": fault})
    ranged = ranges.RangedFile(fs, path, 10240)
    with pytest.raises(error, match=message):
        ranged.load([(0, 10240)], split=True)
    assert ranged.held_bytes == 0  # nothing short kept
    assert not [t for t in threading.enumerate() if t.name == "iolib-piece" and t.is_alive()]


class _StuckPieces:
    """A file system over one local file whose reads starting past 0 wait for `go`
    (a stuck connection); with `fail`, the one starting at `fail` raises at once."""

    def __init__(self, path, fail: int | None = None) -> None:
        self.path, self.fail, self.go = path, fail, threading.Event()
        self.stuck = 0

    def cat_file(self, path, start, end):
        if start == self.fail:
            raise ConnectionResetError(f"piece [{start}:{end}] reset")
        if start:
            self.stuck += 1
            self.go.wait(30)
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


def test_a_stuck_piece_times_out_and_a_failed_one_is_raised_without_waiting(
    tmp_path, monkeypatch
) -> None:
    """The read that split a range waits for its pieces at most its timeout (then a
    TimeoutError, which the storage retries), and a failed piece is raised while others
    are still stuck: no unbounded join."""
    monkeypatch.setattr(ranges, "SPLIT_ABOVE", 1000)
    monkeypatch.setattr(ranges, "PIECE_BYTES", 1000)
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 40)  # 10,240 bytes: 8 pieces
    stuck = _StuckPieces(tmp_path / "data.bin")
    try:
        with pytest.raises(TimeoutError, match="7 of 8 pieces still running"):
            ranges.RangedFile(stuck, "data.bin", 10240, timeout_s=0.2).load(
                [(0, 10240)], split=True
            )
    finally:
        stuck.go.set()
    failing = _StuckPieces(tmp_path / "data.bin", fail=1280)
    try:
        with pytest.raises(ConnectionResetError, match=r"piece \[1280:2560\] reset"):
            ranges.RangedFile(failing, "data.bin", 10240, timeout_s=60).load(
                [(0, 10240)], split=True
            )
        # Raised while the other pieces were still stuck (a join would have outwaited them).
        assert [t for t in threading.enumerate() if t.name == "iolib-piece" and t.is_alive()]
    finally:
        failing.go.set()


def test_the_row_group_read_to_size_the_cache_is_not_read_again(
    blobs,
    store_log,  # noqa: F811
    s3_options,  # noqa: F811
    monkeypatch,
) -> None:
    """Sizing the cache reads a row group to measure decoded bytes; with a row group
    larger than the cache before it is sized (128 MB ones against the 64 MiB start), it
    used to be dropped and read again by the batch that needs it: 1.5x the bytes of
    two such row groups before the first batch. Now it is kept: one epoch reads each
    row group once (counted at the store)."""
    from iolib.sources import parquet_description

    monkeypatch.setattr(parquet_description, "MIN_CACHE_BYTES", 100 << 10)
    local, url = blobs
    source = ParquetSource(url, storage_options=_options(s3_options))
    len(source)
    start = len(store_log)
    rows = sum(len(batch["x"]) for batch in DataLoader(source, batch_size=ROWS, shuffle=True))
    assert rows == 3 * ROWS
    stored = sum(end - begin for begin, end in (_group_span(local, g) for g in range(3)))
    assert store_log.bytes(start) <= 1.02 * stored, (store_log.bytes(start), stored)


class _CountedPieces:
    """A file system over one local file that counts the pieces on the wire at once and
    the order they started in (each takes 0.2 s)."""

    def __init__(self, path) -> None:
        self.path, self.lock = path, threading.Lock()
        self.now = self.most = 0
        self.started: list[str] = []
        self.first_in = threading.Event()

    def cat_file(self, path, start, end):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.started.append(path)
            if len(self.started) == ranges.MAX_PIECES:
                self.first_in.set()
        try:
            time.sleep(0.2)
            with open(self.path, "rb") as f:
                f.seek(start)
                return f.read(end - start)
        finally:
            with self.lock:
                self.now -= 1


def test_two_needed_reads_take_turns_on_the_link(tmp_path, monkeypatch) -> None:
    """Two row groups a batch waits for, each read in MAX_PIECES pieces: at most
    MAX_PIECES pieces on the wire at once, and all of the first read's before any of
    the second's, so that the first lands (and is decoded) while the second is still on
    the wire (before: both reads' pieces at once, both landing together at the end)."""
    monkeypatch.setattr(ranges, "SPLIT_ABOVE", 1000)
    monkeypatch.setattr(ranges, "PIECE_BYTES", 100)
    size = 100 * ranges.MAX_PIECES
    (tmp_path / "data.bin").write_bytes(bytes(range(100)) * ranges.MAX_PIECES * 2)
    fs = _CountedPieces(tmp_path / "data.bin")
    got = {}

    def load(name: str) -> None:
        ranged = ranges.RangedFile(fs, name, 2 * size, timeout_s=60)
        ranged.load([(0, 2 * size)], split=True)
        got[name] = bytes(ranged.read(2 * size))

    first = threading.Thread(target=load, args=("first",))
    first.start()
    assert fs.first_in.wait(30)  # the first read's pieces are on the wire
    second = threading.Thread(target=load, args=("second",))
    second.start()
    first.join(60)
    second.join(60)
    assert got["first"] == got["second"] == (tmp_path / "data.bin").read_bytes()
    assert fs.most <= ranges.MAX_PIECES
    count = len(fs.started) // 2
    assert fs.started[:count] == ["first"] * count  # all of the first read's pieces first
