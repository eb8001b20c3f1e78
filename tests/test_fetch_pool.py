"""FetchPool's thread lifetime (issue 43, "Cancellation"): cancelling never waits on a
lock a finalizer's thread may hold, the threads never hold up the interpreter's exit,
and the reads queued at exit are dropped, not run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import wait
from pathlib import Path

from iolib.sources.fetch_pool import FetchPool

ROOT = Path(__file__).resolve().parent.parent


def _returns(fn, seconds: float = 10.0) -> bool:
    """Whether `fn()` returns (a deadlock would not: it runs on a thread left behind)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def test_cancel_and_release_return_on_a_thread_that_holds_the_pool_lock() -> None:
    """A finalizer that calls release() may run on a pool thread inside the pool's lock
    (the last reference to a reader went with a queued read): it must not deadlock."""
    pool = FetchPool(1, "iolib-fetch-test", lambda read, retries: None)

    def inside_the_lock() -> None:
        with pool._cv:
            pool.cancel()
            pool.release()

    assert _returns(inside_the_lock)


def test_queued_read_ahead_is_dropped_when_cancelled_under_the_lock() -> None:
    """A cancel asked for while the lock was taken is carried out by the pool's thread."""
    gate, ran = threading.Event(), []
    pool = FetchPool(1, "iolib-fetch-test", lambda read, retries: None)
    pool.submit(lambda: gate.wait(10))  # holds the only thread
    queued = [pool.submit(lambda i=i: ran.append(i), ahead=True) for i in range(5)]

    def cancel_inside_the_lock() -> None:
        with pool._cv:
            pool.cancel()

    assert _returns(cancel_inside_the_lock)
    gate.set()
    # Cancelled by the pool's thread once the gate opens; it then leaves, idle, so nothing
    # queued can run after. (Not `wait(queued)`: a future cancelled, never notified as
    # such, is not done for `wait`, which took its whole 10 s.)
    assert pool.join(10)
    assert all(f.cancelled() for f in queued) and ran == []


def test_threads_are_daemons_and_leave_when_idle() -> None:
    pool = FetchPool(2, "iolib-daemon-test", lambda read, retries: None)
    started = threading.Event()
    pool.submit(lambda: (started.set(), time.sleep(0.2))).result(10)
    threads = [t for t in threading.enumerate() if t.name.startswith("iolib-daemon-test")]
    assert started.is_set() and all(t.daemon for t in threads)
    pool.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("iolib-daemon-test")]


def test_reads_queued_at_exit_are_dropped_and_the_process_exits(tmp_path: Path) -> None:
    """One read on the wire and 50 queued (needed and ahead) when the script ends: the
    exit hook drops the queued ones; the process exits cleanly (no abort, no hang)."""
    log = tmp_path / "ran.txt"
    code = textwrap.dedent(f"""
        import time
        from iolib.sources.fetch_pool import FetchPool

        def read(i):
            time.sleep(0.3)
            with open({str(log)!r}, "a") as f:
                f.write(f"{{i}}\\n")

        pool = FetchPool(1, "iolib-fetch", lambda read, retries: None)
        for i in range(50):
            pool.submit(lambda i=i: read(i), ahead=i % 2 == 1)
        time.sleep(0.1)  # the first read is on the wire
    """)
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr
    ran = log.read_text().split() if log.exists() else []
    assert len(ran) <= 2, ran  # the one on the wire (and at most one more that started)


def test_a_cancel_right_after_a_read_ahead_starts_makes_it_late() -> None:
    """The cancel generation a read starts in is read with the read taken: a cancel
    that lands just after (here, as soon as the thread took it) counts the read's bytes
    apart (`bytes_after_cancel`), never in the batch of the loader that asked again."""
    from iolib.storage import count_bytes

    class CancelledOnTake(FetchPool):
        def _next(self):  # type: ignore[no-untyped-def]
            taken = super()._next()
            if taken is not None:
                self.cancel()  # the loader was dropped as the read left the queue
            return taken

    deposited: list[int] = []
    pool = CancelledOnTake(1, "iolib-late-test", lambda read, retries: deposited.append(read))
    pool.submit(lambda: count_bytes(1000), ahead=True).result(10)
    pool.close()
    assert pool.bytes_after_cancel == 1000 and deposited == []


def test_this_epochs_read_ahead_goes_before_the_next_epochs(tmp_path: Path) -> None:
    """Persistent workers read the next epoch's first batches while this one ends: the
    read-ahead of this epoch's last batches is read first though its batch numbers are
    larger (priority is (epoch, batch)); counted as the order of row-group reads. The
    reader's one read-ahead thread is held in its first read until both are queued."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iolib.sources import ParquetSource

    pq.write_table(pa.table({"x": np.arange(2000)}), tmp_path / "a.parquet", row_group_size=20)
    source = ParquetSource(str(tmp_path / "a.parquet"), readahead=2, cache_bytes=64 << 20)
    source.fit_cache(4)  # sizes known: read-ahead needs them
    reader = source.reader
    epoch0 = [np.arange(20 * k, 20 * k + 4) for k in range(20)]  # batch k: row group k
    epoch1 = [np.arange(20 * (99 - k), 20 * (99 - k) + 4) for k in range(20)]  # 99 - k
    reader.plan_epoch(0, epoch0)
    reader.plan_epoch(1, epoch1)
    order: list[int] = []
    fetch = reader.fetcher.fetch
    queued = threading.Event()

    def recording(group, *args, **kwargs):
        if not kwargs.get("needed"):  # read-ahead: the one thread for it waits here
            assert queued.wait(10)
            order.append(group)
        return fetch(group, *args, **kwargs)

    reader.fetcher.fetch = recording
    reader.read(epoch1[0], 1, 0)  # the next epoch's first batch: 97, 98 ahead
    reader.read(epoch0[17], 0, 17)  # this epoch's batch 17: 18, 19 ahead
    queued.set()  # one read-ahead may have started meanwhile; the rest were queued
    deadline = time.monotonic() + 10
    while len(order) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    rest = order[1:] if order[0] in (97, 98) else order
    assert sorted(rest[:2]) == [18, 19] and set(rest[2:]) <= {97, 98}, order
    assert sorted(order) == [18, 19, 97, 98], order


def test_this_epochs_token_read_ahead_goes_before_the_next_epochs(
    tmp_path: Path, monkeypatch
) -> None:
    """The token reader's version: its read-ahead of this epoch's last batches is read
    before that of the next epoch's first ones (priority is (epoch, batch)); counted as
    the order of row-group reads on one read thread."""
    import numpy as np

    from iolib.text import PackedTokens, packed_reader
    from tests.token_data import write_documents

    monkeypatch.setattr(packed_reader, "READAHEAD_BATCHES", 2)  # batches k+1, k+2 ahead
    monkeypatch.setattr(packed_reader, "_read_threads", lambda d: 1)  # reads in pool order
    write_documents(tmp_path / "c", np.full(640, 20), shards=1, row_group_size=16)
    source = PackedTokens(str(tmp_path / "c"), column="tokens", seq_len=16, eos_id=0,
                          cache_bytes=64 << 20, shuffle_window=64 << 20)  # fmt: skip
    len(source)  # the index: row groups' sizes, which read-ahead needs
    reader = source._reader

    def windows_in(epoch: int, group: int) -> np.ndarray:
        """Two windows (and their next tokens) inside row group `group` in `epoch`."""
        order, cum = reader._epoch(epoch)
        position = int(np.flatnonzero(order == group)[0])
        first = -(-int(cum[position]) // 16)
        assert (first + 2) * 16 < cum[position + 1]
        return np.arange(first, first + 2)

    epoch0 = [windows_in(0, k) for k in range(20)]  # batch k: row group k
    epoch1 = [windows_in(1, 39 - k) for k in range(20)]  # 39 - k
    reader.plan_epoch(0, epoch0)
    reader.plan_epoch(1, epoch1)
    order: list[int] = []
    fetch = source.parquet.fetch_row_group

    def recording(group, *args, **kwargs):
        order.append(group)
        return fetch(group, *args, **kwargs)

    monkeypatch.setattr(source.parquet, "fetch_row_group", recording)
    with reader._reads.pool().needing():  # no read-ahead starts until both are queued
        reader.read(epoch1[0], epoch=1, batch=0)  # the next epoch's first batch: 38, 37 ahead
        reader.read(epoch0[17], epoch=0, batch=17)  # this epoch's batch 17: 18, 19 ahead
        order.clear()
    assert reader._reads.pool().join(10.0)
    assert order == [18, 19, 38, 37], order


def test_one_read_of_several_keys_is_each_keys_flight() -> None:
    """`submit_many`: one read brings several keys (a request that folds neighbouring
    row groups); each key is shared as its own flight until the read ends, a key
    already in flight keeps its own read, a failed key raises to its waiters only, and
    a cancelled read-ahead cancels every key it led."""
    pool = FetchPool(2, "test-many", lambda read, retries: None)
    gate = threading.Event()
    calls: list[list[str]] = []

    def read(keys):
        calls.append(list(keys))
        gate.wait(10)
        return {"a": 1, "b": ValueError("b is bad")}

    own = pool.submit(lambda: gate.wait(10) and "own", key="c")
    futures = pool.submit_many(read, ["a", "b", "c", "d"])
    assert futures["c"] is own and pool.flight("a") is futures["a"]
    gate.set()
    wait(futures.values(), timeout=10)
    assert calls == [["a", "b", "d"]]
    assert futures["a"].result() == 1 and futures["d"].result() is None
    assert isinstance(futures["b"].exception(), ValueError) and own.result() == "own"
    assert pool.flight("a") is None  # landed: the next ask reads again

    with pool.needing():  # read-ahead waits while a batch's own read runs
        ahead = pool.submit_many(lambda keys: {k: 0 for k in keys}, ["x", "y"], ahead=True)
        pool.cancel()
    assert pool.join(10)  # its threads leave once idle: what is left queued never runs
    assert all(f.cancelled() for f in ahead.values())
    pool.close()


def test_a_needed_read_takes_over_queued_read_ahead_of_its_keys() -> None:
    """A batch that needs keys whose read-ahead is still queued reads them in its own
    request, with its other keys: the read-ahead never runs, and whoever waits on it
    gets the needed read's values. Read-ahead already running keeps its own read."""
    pool = FetchPool(1, "test-take", lambda read, retries: None)
    gate = threading.Event()
    calls: list[list[str]] = []

    def read(keys):
        calls.append(list(keys))
        return {k: k.upper() for k in keys}

    busy = pool.submit(lambda: gate.wait(10))  # the one thread: what follows queues
    b_ahead = pool.submit_many(read, ["b"], ahead=True)["b"]
    cd_ahead = pool.submit_many(read, ["c", "d"], ahead=True)  # "d" not asked for below
    futures = pool.submit_many(read, ["a", "b", "c"])
    assert futures["b"] is b_ahead and futures["c"] is cd_ahead["c"]
    gate.set()
    wait([busy, *futures.values(), *cd_ahead.values()], timeout=10)
    assert calls == [["a", "b"], ["c", "d"]]  # "c" stays with "d": nothing left unread
    assert b_ahead.result() == "B" and futures["a"].result() == "A"
    assert cd_ahead["d"].result() == "D"
    pool.close()


def _requests(tmp_path: Path, monkeypatch, shuffle) -> tuple[list[int], int]:
    """The requests (their sizes) one epoch makes at a local `throttled::` store over 100
    row groups of 600 rows (~70 KB each) with a 4 MB cache and batches of 2048 rows,
    inline; and the file's size."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iolib import DataLoader
    from iolib.sources import ParquetSource
    from iolib.storage.throttle import ThrottledFileSystem

    rng = np.random.default_rng(0)
    table = pa.table({"x": np.arange(60000), "blob": [rng.bytes(100) for _ in range(60000)]})
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=600, compression="none")  # 100 row groups
    reads: list[int] = []
    after = ThrottledFileSystem.after_request

    def counting(self, token, data):
        data = after(self, token, data)
        if data is not None:
            reads.append(len(data))
        return data

    monkeypatch.setattr(ThrottledFileSystem, "after_request", counting)
    options = {"throttled": {"latency_ms": 1, "skip_instance_cache": True}}
    source = ParquetSource(f"throttled::file://{path}", storage_options=options,
                           cache_bytes=4_000_000)  # fmt: skip
    loader = DataLoader(source, batch_size=2048, shuffle=shuffle, seed=0, num_workers=0)
    for _ in loader:
        pass
    return reads, path.stat().st_size


def test_a_batch_reads_queued_read_ahead_in_fewer_requests(tmp_path: Path, monkeypatch) -> None:
    """A cache too small for the batches read ahead (issue 42's folding regression): the
    row groups a batch finds still queued for read-ahead come in one request with their
    neighbours, not one request each. Counted at a local `throttled::` store."""
    reads, size = _requests(tmp_path, monkeypatch, shuffle=False)
    assert sum(reads) <= 1.02 * size  # each row group read once
    assert len(reads) <= 80, len(reads)  # 101 when each queued read-ahead came alone


def test_a_shuffled_batch_reads_its_missing_row_groups_in_runs(tmp_path: Path, monkeypatch) -> None:
    """A global shuffle through a cache too small for it: the row groups a batch misses
    (queued for read-ahead or not read at all) come as one request for each run of them
    next to each other in the file, not one request each."""
    reads, _ = _requests(tmp_path, monkeypatch, shuffle="global")
    assert len(reads) <= 50, len(reads)  # 78 when missing row groups came one a request


def test_a_dropped_read_ahead_is_done_for_concurrent_futures_wait() -> None:
    """`wait` and `as_completed` count a cancelled future done only once it is notified as
    such: the reads the pool drops are, so whoever waits on one wakes (before, `wait` ran
    its whole timeout and called them not done)."""
    gate = threading.Event()
    pool = FetchPool(1, "iolib-fetch-test", lambda read, retries: None)
    pool.submit(lambda: gate.wait(10))  # holds the only thread
    queued = [pool.submit(lambda: None, ahead=True) for _ in range(3)]
    pool.cancel()
    done, not_done = wait(queued, timeout=10)
    gate.set()
    assert not not_done and all(f.cancelled() for f in done)
    pool.close()
