"""The throttling proxy of benchmarks/bench_peers.py, in front of moto's S3 server: it
relays requests unchanged, counts requests and bytes exactly, and paces what it sends.
(The peers themselves are not needed here.)"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.peers.proxy import Pacer, ThrottlingProxy
from tests.fixtures_s3 import s3_options  # noqa: F401 - the fixture

pytestmark = pytest.mark.s3
BLOB = bytes(range(256)) * 4096  # 1 MiB, every byte position distinguishable


@pytest.fixture(scope="module")
def store(s3_options):  # noqa: F811
    import s3fs

    s3fs.S3FileSystem(**s3_options).pipe("iolib-bench/p/blob.bin", BLOB)
    return s3_options


def _fs(proxy: ThrottlingProxy, options: dict):
    import s3fs

    return s3fs.S3FileSystem(**dict(options, endpoint_url=proxy.url))


@settings(max_examples=12, deadline=None)
@given(ranges=st.lists(st.tuples(st.integers(0, len(BLOB) - 1), st.integers(1, 300_000)),
                       min_size=1, max_size=4))  # fmt: skip
def test_ranges_relay_exact_bytes_and_are_counted(store, ranges):
    with ThrottlingProxy(store["endpoint_url"], latency=0, conn_rate=None, total_rate=None) as p:
        fs = _fs(p, store)
        expected = 0
        for start, size in ranges:
            end = min(len(BLOB), start + size)
            assert fs.cat_file("iolib-bench/p/blob.bin", start=start, end=end) == BLOB[start:end]
            expected += end - start
        stats = p.stats()
    assert stats["bytes"] == expected
    assert stats["requests_by_method"].get("GET") == len(ranges)
    assert stats["requests"] == sum(stats["requests_by_method"].values())


def test_errors_pass_through_and_reset_is_not_counted(store):
    with ThrottlingProxy(store["endpoint_url"], latency=0) as p:
        fs = _fs(p, store)
        with pytest.raises(FileNotFoundError):
            fs.cat_file("iolib-bench/p/missing.bin")
        assert p.stats()["requests"] >= 1
        request = urllib.request.Request(f"{p.url}/__proxy__/reset", method="POST")
        with urllib.request.urlopen(request) as response:
            assert json.loads(response.read())["requests"] == 0
        with urllib.request.urlopen(f"{p.url}/__proxy__/stats") as response:
            assert json.loads(response.read()) == p.stats()
        assert p.stats()["requests"] == 0 and p.stats()["bytes"] == 0


def test_uploads_are_counted_apart_from_downloads(store):
    with ThrottlingProxy(store["endpoint_url"], latency=0) as p:
        fs = _fs(p, store)
        fs.pipe("iolib-bench/p/up.bin", b"z" * 12_345)
        stats = p.stats()
        assert stats["bytes_uploaded"] == 12_345 and stats["bytes"] < 12_345
        assert fs.cat_file("iolib-bench/p/up.bin") == b"z" * 12_345


def test_latency_and_bandwidth_are_paid(store):
    """Lower bounds only: 40 ms a request, and 1 MiB at 4 MB/s a connection."""
    with ThrottlingProxy(store["endpoint_url"], latency=0.04, conn_rate=4e6) as p:
        fs = _fs(p, store)
        start = time.perf_counter()
        fs.cat_file("iolib-bench/p/blob.bin", start=0, end=100)
        assert time.perf_counter() - start >= 0.04
        start = time.perf_counter()
        assert fs.cat_file("iolib-bench/p/blob.bin") == BLOB
        assert time.perf_counter() - start >= len(BLOB) / 4e6


def test_total_rate_is_shared_by_concurrent_connections(store):
    """Three connections at once, each unlimited, share 6 MB/s in all: 3 MiB take at
    least 0.5 s, and the proxy saw them in flight together."""
    with ThrottlingProxy(store["endpoint_url"], latency=0.05, conn_rate=None, total_rate=6e6) as p:
        got, barrier = [], threading.Barrier(3)

        def read() -> None:
            fs = _fs(p, store)
            barrier.wait(timeout=60)
            got.append(fs.cat_file("iolib-bench/p/blob.bin", start=0, end=len(BLOB)))

        start = time.perf_counter()
        threads = [threading.Thread(target=read) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a read did not finish in 120 s"
        assert time.perf_counter() - start >= 3 * len(BLOB) / 6e6
        assert got == [BLOB] * 3
        stats = p.stats()
    assert stats["bytes"] == 3 * len(BLOB) and stats["max_concurrent_requests"] >= 2


@given(rate=st.floats(1e3, 1e9), sizes=st.lists(st.integers(1, 1 << 20), min_size=1, max_size=20))
def test_pacer_books_bytes_back_to_back(rate, sizes):
    """The virtual clock: bytes booked at one instant pass one after another at `rate`."""
    pacer = Pacer(rate)
    for i, n in enumerate(sizes):
        done = pacer.reserve(n, now=10.0)
        assert done == pytest.approx(10.0 + sum(sizes[: i + 1]) / rate)
    assert Pacer(None).reserve(10**9, now=3.0) == 3.0


def test_upstream_must_be_an_http_host_and_port():
    with pytest.raises(ValueError, match="upstream"):
        ThrottlingProxy("s3://bucket")


@pytest.mark.parametrize(("groups", "rows", "batch"), [(19, 105, 64), (2, 105, 64), (250, 40, 64)])
def test_the_first_batch_floor_counts_the_row_groups_a_shuffled_batch_touches(groups, rows, batch):
    """The floor of a shuffled first batch: the row groups a random batch touches on
    average, as a draw of that batch from the rows says."""
    import numpy as np

    from benchmarks.peers.formats import groups_touched

    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(groups), rows)
    drawn = [np.unique(rng.choice(owner, batch, replace=False)).size for _ in range(2000)]
    assert groups_touched(groups, rows, batch) == pytest.approx(np.mean(drawn), rel=0.02)


@pytest.mark.parametrize("sizes", [[32, 16], [5, 5, 5, 5], [40, 1, 1, 1], [7]])
def test_the_token_floor_counts_the_row_groups_random_windows_touch(sizes):
    """A shuffled first batch of 16 windows from a corpus of row groups of these sizes
    (windows in proportion to bytes) touches these bytes on average."""
    import numpy as np

    from benchmarks.peers.formats import bytes_touched

    rng = np.random.default_rng(0)
    owner = np.repeat(np.arange(len(sizes)), np.array(sizes) * 100)  # 100 windows a byte
    sizes_of = np.array(sizes)
    drawn = [sizes_of[np.unique(rng.choice(owner, 16, replace=False))].sum() for _ in range(4000)]
    assert bytes_touched(sizes, 16) == pytest.approx(np.mean(drawn), rel=0.02)
