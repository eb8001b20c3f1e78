"""A loader that is closed, dropped or left by a `break` stops reading (issue 43,
"Cancellation"), and the read a batch waits for goes before read-ahead ("Reads in order
of need"). Counted at the store: every request that reaches moto's S3 through a
`throttled::` wrapper is logged (bytes, order), never timed."""

from __future__ import annotations

import gc
import shutil
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.base.resources import thread_budget
from iolib.sources import ParquetSource, fetch_pool
from iolib.storage.throttle import ThrottledFileSystem
from iolib.text import PackedTokens, packed_reader
from tests.fixtures_s3 import s3_options  # noqa: F401 - the fixture
from tests.token_data import doc_lengths, write_documents

OURS = ("iolib-fetch", "iolib-tokens")
WORKERS = 2
LOCAL: dict[str, object] = {}  # kind -> the local copy of what was uploaded
BATCH = 4  # samples a batch: a batch in progress when the loader ends reads at most one
# row group each


class StoreLog:
    """Every read that reached the store: (path, start, bytes), in the order they ended;
    and each read's start and end as events in one sequence (`events`)."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, int | None, int]] = []
        self.events: list[tuple[str, str, int | None]] = []  # ("start" | "end", path, start)
        self.lock = threading.Lock()

    def bytes(self, since: int = 0) -> int:
        with self.lock:
            return sum(n for _, _, n in self.reads[since:])

    def __len__(self) -> int:
        with self.lock:
            return len(self.reads)


@pytest.fixture
def store_log(monkeypatch) -> StoreLog:
    log = StoreLog()
    before, after = ThrottledFileSystem.before_request, ThrottledFileSystem.after_request

    def recording_before(self, kind, path, start, end):
        if kind == "read":
            with log.lock:
                log.events.append(("start", path, start))
        return (kind, path, start), before(self, kind, path, start, end)

    def recording_after(self, token, data):
        (kind, path, start), inner = token
        data = after(self, inner, data)
        if kind == "read" and data is not None:
            with log.lock:
                log.reads.append((path, start, len(data)))
                log.events.append(("end", path, start))
        return data

    monkeypatch.setattr(ThrottledFileSystem, "before_request", recording_before)
    monkeypatch.setattr(ThrottledFileSystem, "after_request", recording_after)
    return log


def _options(s3, latency_ms: float = 20) -> dict:
    throttled = {"latency_ms": latency_ms, "skip_instance_cache": True}
    return {"s3": dict(s3), "throttled": throttled}


def _upload(s3, local, prefix: str) -> str:
    import s3fs

    s3fs.S3FileSystem(**s3).put(str(local), f"iolib-bench/{prefix}", recursive=True)
    return f"throttled::s3://iolib-bench/{prefix}"


def _settle(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def _no_read_threads() -> bool:
    return not [t for t in threading.enumerate() if t.name.startswith(OURS)]


@pytest.fixture(scope="module")
def token_url(s3_options, tmp_path_factory):  # noqa: F811
    local = tmp_path_factory.mktemp("tokens")
    write_documents(local / "t", doc_lengths(3000), row_group_size=16)
    LOCAL["tokens"] = local / "t"
    return _upload(s3_options, local / "t", "cancel-tokens")


@pytest.fixture(scope="module")
def rows_url(s3_options, tmp_path_factory):  # noqa: F811
    local = tmp_path_factory.mktemp("rows") / "r"
    local.mkdir()
    table = pa.table({"x": np.arange(6000), "blob": [bytes(200)] * 6000})
    pq.write_table(table, local / "a.parquet", row_group_size=60)  # 100 row groups
    LOCAL["rows"] = local
    return _upload(s3_options, local, "cancel-rows")


@pytest.fixture(scope="module")
def _token_index(token_url, s3_options, tmp_path_factory):  # noqa: F811
    """A cache directory holding the token corpus's index, computed once a module: every
    test plans (`len`) before it counts, so none counts the index's reads, and computing
    it (188 row groups behind the throttle) took 4-7 s of each test."""
    cache = tmp_path_factory.mktemp("token-index") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IOLIB_CACHE_DIR", str(cache))
        source = _tokens(token_url, s3_options)
        len(source)
        source.close()
    assert list(cache.rglob("*.npz")), "the token index was not kept"
    return cache


@pytest.fixture(autouse=True)
def _own_cache_dir(_token_index, tmp_path, monkeypatch):
    """Each test's own cache directory (nothing it writes reaches another), a copy of the
    module's: the token index found, not computed again."""
    shutil.copytree(_token_index, tmp_path / "cache")
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


def _tokens(url: str, s3) -> PackedTokens:
    return PackedTokens(url, column="tokens", seq_len=8, eos_id=0, storage_options=_options(s3))


def _rows(url: str, s3) -> ParquetSource:
    return ParquetSource(url, columns=["x", "blob"], storage_options=_options(s3), readahead=16)


def _leave(loader: DataLoader, ending: str, mark=lambda: None) -> None:
    """Take one batch, then end the loader as a script would (`mark` just before)."""
    if ending == "break":
        for _batch in loader:
            mark()
            break
        del _batch
        return
    it = iter(loader)
    next(it)
    mark()
    if ending == "close":
        loader.close()
    del it


@pytest.mark.parametrize("kind", ["tokens", "rows"])
@pytest.mark.parametrize("ending", ["close", "drop", "break"])
def test_a_loader_left_after_one_batch_stops_reading(
    kind,
    ending,
    token_url,
    rows_url,
    store_log,
    s3_options,  # noqa: F811
) -> None:
    source = _tokens(token_url, s3_options) if kind == "tokens" else _rows(rows_url, s3_options)
    len(source)  # plans (footers, the token index) before anything is counted
    start = len(store_log)
    loader = DataLoader(source, batch_size=BATCH, shuffle=True, seed=0, num_workers=WORKERS)
    marks: list[int] = []
    _leave(loader, ending, lambda: marks.append(len(store_log)))
    at_drop = marks[0]
    largest = max(n for _, _, n in store_log.reads[start:at_drop])  # a row-group request
    if ending == "drop":
        del loader
        gc.collect()
    assert _settle(_no_read_threads), "read threads outlived the loader"
    after = store_log.bytes(at_drop)
    # What may still arrive: a request from each pool thread that could have one on the
    # wire, and the reads of the batches the workers were assembling (a sample each).
    in_flight = thread_budget().remote_reads + thread_budget().readahead + WORKERS * BATCH
    assert after <= in_flight * largest, (after, in_flight, largest)
    if ending != "drop":
        assert 0 <= loader.stats()["bytes_after_close"] <= after


@pytest.mark.parametrize("kind", ["tokens", "rows"])
def test_a_new_loader_after_a_dropped_one_reads_the_data_once(
    kind,
    token_url,
    rows_url,
    store_log,
    s3_options,  # noqa: F811
) -> None:
    """A warm-up loader dropped mid-epoch, then a new loader over the same source: the
    bytes of both, warm-up included, stay within 1.02x of one epoch read alone."""

    def source():
        return _tokens(token_url, s3_options) if kind == "tokens" else _rows(rows_url, s3_options)

    def epoch(loader) -> None:
        for _ in loader:
            pass

    alone = source()
    len(alone)
    start = len(store_log)
    epoch(DataLoader(alone, batch_size=64, shuffle=True, seed=0, num_workers=WORKERS))
    stored = store_log.bytes(start)

    reused = source()
    len(reused)
    start = len(store_log)
    _leave(DataLoader(reused, batch_size=64, shuffle=True, seed=0, num_workers=WORKERS), "drop")
    gc.collect()
    epoch(DataLoader(reused, batch_size=64, shuffle=True, seed=0, num_workers=WORKERS))
    assert store_log.bytes(start) <= 1.02 * stored, (store_log.bytes(start), stored)


def _group_at(local, path: str, offset: int) -> tuple[str, int]:
    """(file name, row group) whose column chunks hold byte `offset` of `path`."""
    name = path.rsplit("/", 1)[-1]
    meta = pq.ParquetFile(local / name).metadata
    for g in range(meta.num_row_groups):
        columns = [meta.row_group(g).column(c) for c in range(meta.num_columns)]
        lo = min(c.dictionary_page_offset or c.data_page_offset for c in columns)
        hi = max((c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size
                 for c in columns)  # fmt: skip
        if lo <= offset < hi:
            return name, g
    raise AssertionError(f"no row group of {path} at {offset}")


def _token_groups(local, batch) -> set[tuple[str, int]]:
    """The row groups the documents of a packed batch come from (token = 1000 * doc +
    position + 1; 16 documents a row group, 1500 a file)."""
    tokens = np.concatenate([batch["input_ids"].numpy().ravel(), batch["labels"].numpy().ravel()])
    docs = np.unique((tokens[tokens > 0] - 1) // 1000)
    return {(f"part-{d // 1500}.parquet", int(d % 1500) // 16) for d in docs.tolist()}


@pytest.mark.parametrize("kind", ["tokens", "rows"])
def test_the_batch_waited_on_is_read_before_any_read_ahead(
    kind,
    token_url,
    rows_url,
    store_log,
    s3_options,  # noqa: F811
) -> None:
    """With a deep read-ahead on a slow store, every request for the first batch's row
    groups ends before a request for any other row group starts (the store's own log of
    request starts and ends, not time)."""
    source = _tokens(token_url, s3_options) if kind == "tokens" else _rows(rows_url, s3_options)
    local = LOCAL[kind]
    len(source)
    if kind == "rows":
        source.estimated_bytes()  # planning: it reads a row group to measure it
    start = len(store_log.events)
    loader = DataLoader(source, batch_size=BATCH, shuffle=True, seed=0)  # inline: one batch
    it = iter(loader)  # kept: an iterator dropped cancels the read-ahead
    batch = next(it)
    if kind == "tokens":
        needed = _token_groups(local, batch)
    else:
        needed = {("a.parquet", int(x) // 60) for x in batch["x"].numpy().tolist()}
    assert _settle(_no_read_threads)
    del it
    events = [(what, _group_at(local, path, offset)) for what, path, offset in
              store_log.events[start:]]  # fmt: skip
    first_other = next(i for i, (what, g) in enumerate(events) if g not in needed)
    last_needed_end = max(i for i, (what, g) in enumerate(events) if what == "end" and g in needed)
    assert {g for what, g in events[:first_other] if what == "start"} <= needed
    assert last_needed_end < first_other, events[: last_needed_end + 1]


@pytest.mark.parametrize("kind", ["tokens", "rows"])
def test_a_new_iterator_mid_epoch_stops_the_last_ones_reads(
    kind,
    token_url,
    rows_url,
    store_log,
    s3_options,  # noqa: F811
) -> None:
    """iter(loader) again while the last pass is still referenced, mid-epoch: that pass's
    read-ahead stops (inline: the new pass reads nothing until asked)."""
    source = _tokens(token_url, s3_options) if kind == "tokens" else _rows(rows_url, s3_options)
    len(source)
    start = len(store_log)
    loader = DataLoader(source, batch_size=BATCH, shuffle=True, seed=0)
    old = iter(loader)
    next(old)
    at_new = len(store_log)
    new = iter(loader)  # both referenced: nothing is dropped
    largest = max(n for _, _, n in store_log.reads[start:at_new])
    assert _settle(_no_read_threads), "read threads outlived the pass"
    after = store_log.bytes(at_new)
    in_flight = thread_budget().remote_reads + thread_budget().readahead
    assert after <= in_flight * largest, (after, in_flight, largest)
    assert len(next(new)["input_ids" if kind == "tokens" else "x"]) == BATCH
    del old, new


@pytest.mark.parametrize("kind", ["tokens", "rows"])
def test_dropping_one_loader_leaves_the_read_ahead_of_another_on_the_same_source(
    kind,
    token_url,
    rows_url,
    store_log,
    monkeypatch,
    s3_options,  # noqa: F811
) -> None:
    """Two loaders iterate one source; one is dropped (its cancel): the other's batches
    are still read ahead, so a batch it reaches once the read-ahead settled costs no
    request (counted at the store)."""
    if kind == "tokens":
        # Two batches ahead, as the rows' readahead=2 (one chunk: no chunk's worth more).
        monkeypatch.setattr(packed_reader, "READAHEAD_BATCHES", 2)
        source = _tokens(token_url, s3_options)
    else:
        source = ParquetSource(
            rows_url, columns=["x", "blob"], storage_options=_options(s3_options), readahead=2
        )
    len(source)
    kept = iter(DataLoader(source, batch_size=BATCH, shuffle=True, seed=0))
    next(kept)
    assert _settle(_no_read_threads)
    dropped = DataLoader(source, batch_size=BATCH, shuffle=True, seed=0)
    _leave(dropped, "drop")
    del dropped
    gc.collect()
    for _ in range(2):  # each batch reads ahead the row groups of the two after it
        next(kept)
        assert _settle(_no_read_threads)
    before = len(store_log)
    next(kept)  # read ahead after the other loader was dropped
    assert len(store_log) == before, store_log.reads[before:]
    del kept


class FileLog:
    """Reads that reached the store from any process (forked workers append too): one
    line each, "bytes", in a file opened for appending."""

    def __init__(self, path) -> None:
        self.path = path
        path.write_text("")

    def sizes(self) -> list[int]:
        return [int(line) for line in self.path.read_text().split()]


@pytest.fixture
def file_log(monkeypatch, tmp_path) -> FileLog:
    log = FileLog(tmp_path / "reads.log")
    after = ThrottledFileSystem.after_request

    def recording_after(self, token, data):
        data = after(self, token, data)
        if data is not None:
            with open(log.path, "a") as out:
                out.write(f"{len(data)}\n")
        return data

    monkeypatch.setattr(ThrottledFileSystem, "after_request", recording_after)
    return log


def test_persistent_process_workers_left_by_a_break_stop_reading(
    rows_url,
    file_log,
    s3_options,  # noqa: F811
) -> None:
    """A `break` out of a loop over persistent process workers: the batches queued for
    them are dropped and they are told to cancel their reads; what still arrives is at
    most the batches they were assembling (counted at the store, from every process,
    once it is quiet)."""
    source = _rows(rows_url, s3_options)
    len(source)
    loader = DataLoader(source, batch_size=BATCH, shuffle=True, seed=0, num_workers=WORKERS,
                        worker_mode="process", persistent_workers=True,
                        prefetch_factor=16)  # fmt: skip
    try:
        start = len(file_log.sizes())
        for _batch in loader:
            at_break = len(file_log.sizes())
            break
        del _batch
        gc.collect()
        quiet = [len(file_log.sizes()), time.monotonic()]

        def settled() -> bool:  # no request ended for a second
            if len(file_log.sizes()) != quiet[0]:
                quiet[:] = [len(file_log.sizes()), time.monotonic()]
            return time.monotonic() - quiet[1] > 1.0

        assert _settle(settled)
        sizes = file_log.sizes()
        largest = max(sizes[start:at_break])
        after = sum(sizes[at_break:])
        # Each worker may finish the batch it was assembling: a request a sample, and
        # the pool threads' requests already on the wire.
        in_flight = WORKERS * (BATCH + thread_budget().readahead)
        assert after <= in_flight * largest, (after, in_flight, largest)
        assert len(next(iter(loader))["x"]) == BATCH  # the workers still serve a new pass
    finally:
        loader.close()


@pytest.mark.parametrize("kind", ["tokens", "rows"])
def test_a_read_that_lands_after_close_is_not_kept(
    kind,
    token_url,
    rows_url,
    store_log,
    s3_options,  # noqa: F811
    monkeypatch,
) -> None:
    # close() waits a moment for reads on the wire; these land after it has returned.
    monkeypatch.setattr(fetch_pool.FetchPool.close, "__defaults__", (0.01,))
    options = {"storage_options": _options(s3_options, 400)}
    if kind == "tokens":
        source = PackedTokens(token_url, column="tokens", seq_len=8, eos_id=0, **options)
    else:
        source = ParquetSource(rows_url, columns=["x", "blob"], readahead=16, **options)
    len(source)
    it = iter(DataLoader(source, batch_size=BATCH, shuffle=True, seed=0))
    next(it)  # inline: from here on only read-ahead reads

    def on_wire() -> int:
        with store_log.lock:
            return sum(1 if event == "start" else -1 for event, _, _ in store_log.events)

    assert _settle(lambda: on_wire() > 0, 10), "no read ahead went on the wire"
    source.close()
    assert _settle(_no_read_threads), "read threads outlived the close"
    assert source.cache_stats()["cache_held_bytes"] == 0
    del it
