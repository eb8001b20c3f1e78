"""Storage wrappers: throttled (really delays, seeded), faulty (seeded faults), bounded
atomic cache, chained URLs through open_filesystem and ParquetSource."""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib.errors import ConfigError, StorageError
from iolib.sources import ParquetSource
from iolib.storage import (
    PROFILES,
    RetryPolicy,
    ThrottledFileSystem,
    call_with_retries,
    open_filesystem,
    resolve_profile,
    wrap_url,
)
from tests.fixtures_s3 import s3_options  # noqa: F401


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(2_000_000))
    return str(path)


@pytest.fixture
def parquet_file(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(1000)}), path, row_group_size=100)
    return str(path)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _throttled(path, **options):
    return open_filesystem(
        f"throttled::file://{path}", {"throttled": {"skip_instance_cache": True, **options}}
    )


def test_latency_is_applied_per_request(blob):
    fs, path = _throttled(blob, latency_ms=40)
    assert isinstance(fs, ThrottledFileSystem)
    times = [_timed(lambda: fs.cat_file(path, 0, 100))[0] for _ in range(3)]
    assert all(0.039 <= t < 0.4 for t in times), times
    assert fs.requests == 3


def test_bandwidth_cap_bounds_the_transfer(blob):
    fs, path = _throttled(blob, bandwidth_mbps=10)  # 2 MB at 10 MB/s: 0.2 s
    elapsed, data = _timed(lambda: fs.cat_file(path))
    assert len(data) == 2_000_000
    assert 0.19 <= elapsed < 1.5, elapsed


def test_shared_link_serialises_concurrent_reads(blob):
    from concurrent.futures import ThreadPoolExecutor

    fs, path = _throttled(blob, total_bandwidth_mbps=20)  # 4 x 1 MB over one 20 MB/s link
    with ThreadPoolExecutor(4) as pool:
        elapsed, _ = _timed(
            lambda: list(pool.map(lambda k: fs.cat_file(path, 0, 1_000_000), range(4)))
        )
    assert 0.19 <= elapsed < 2.0, elapsed


def test_jitter_is_seeded_and_independent_of_instances(blob):
    draws = []
    for _ in range(2):
        fs, path = _throttled(blob, latency_ms=50, jitter=0.5, seed=3)
        draws.append([fs.before_request("read", path, k, k + 10)[1] for k in range(200)])
    assert draws[0] == draws[1]
    assert len(set(draws[0])) == 200
    assert 0.035 < float(np.median(draws[0])) < 0.07  # median stays at latency_ms
    fs, path = _throttled(blob, latency_ms=50, jitter=0.5, seed=4)
    assert [fs.before_request("read", path, k, k + 10)[1] for k in range(200)] != draws[0]


def test_presets_and_overrides():
    assert resolve_profile("object-store").latency_ms == PROFILES["object-store"].latency_ms
    assert resolve_profile("nas", latency_ms=7).latency_ms == 7
    with pytest.raises(ConfigError, match="Unknown throttle profile"):
        resolve_profile("tape")
    with pytest.raises(ConfigError, match="latency_ms"):
        resolve_profile(None, latency_ms=-1)


def test_throttled_parquet_reads_and_pickles(parquet_file):
    fs, path = _throttled(parquet_file, profile="nvme")
    with fs.open(path, "rb") as f:
        table = pq.ParquetFile(f).read_row_group(3)
    assert table.column("x").to_pylist() == list(range(300, 400))
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.profile == fs.profile
    assert fs.isfile(path) and fs.ls(os.path.dirname(path), detail=False)


def test_parquet_source_reads_through_the_throttle(parquet_file):
    from iolib.sources import ParquetSource

    url, options = wrap_url(f"file://{parquet_file}", None, "throttled", {"latency_ms": 1})
    src = ParquetSource(url, storage_options=options)
    assert len(src) == 1000
    assert src[123]["x"] == 123


def test_wrap_url_nests_flat_options():
    url, options = wrap_url("s3://b/k", {"key": "a", "client_kwargs": {}}, "throttled", {"seed": 1})
    assert url == "throttled::s3://b/k"
    assert options == {"s3": {"key": "a", "client_kwargs": {}}, "throttled": {"seed": 1}}


def _faulty(path, **options):
    return open_filesystem(
        f"faulty::file://{path}", {"faulty": {"skip_instance_cache": True, **options}}
    )


def test_faults_are_seeded_and_retries_recover(blob):
    fs, path = _faulty(blob, error_rate=0.3, seed=7)
    outcomes = []
    for k in range(200):
        try:
            fs.cat_file(path, k, k + 10)
            outcomes.append(True)
        except ConnectionResetError:
            outcomes.append(False)
    assert 30 < outcomes.count(False) < 90
    fs2, _ = _faulty(blob, error_rate=0.3, seed=7)
    again = []
    for k in range(200):
        try:
            fs2.cat_file(path, k, k + 10)
            again.append(True)
        except ConnectionResetError:
            again.append(False)
    assert again == outcomes
    fs3, _ = _faulty(blob, error_rate=0.5, seed=1)
    policy = RetryPolicy(attempts=20, base_delay_s=0.0001, max_delay_s=0.001)
    with open(blob, "rb") as f:
        expected = f.read(100)
    for _ in range(20):
        assert (
            call_with_retries(lambda: fs3.cat_file(path, 0, 100), what="t", policy=policy)
            == expected
        )
    assert fs3.faults["errors"] > 0


def test_missing_slow_and_truncated(blob):
    fs, path = _faulty(blob, missing=["*blob.bin"])
    with pytest.raises(FileNotFoundError, match="permanently missing"):
        fs.cat_file(path, 0, 10)
    fs, path = _faulty(blob, truncate_rate=1.0)
    assert len(fs.cat_file(path, 0, 100)) == 50
    fs, path = _faulty(blob, slow_rate=1.0, slow_ms=50)
    elapsed, _ = _timed(lambda: fs.cat_file(path, 0, 10))
    assert elapsed >= 0.049 and fs.faults["slow"] == 1
    with pytest.raises(ConfigError, match="error_rate"):
        _faulty(blob, error_rate=2)


def test_a_dropped_wrapped_file_frees_its_readahead_block_at_once(blob):
    """A wrapped file and fsspec's readahead cache once referred to each other, so a file
    dropped without close() kept its block (1 MiB here) until a full garbage collection:
    the soak's RSS grew +66 MiB/min. With collection off, dropping it must free it."""
    import gc
    import weakref

    fs, path = open_filesystem(
        f"faulty::throttled::file://{blob}",
        {"faulty": {"seed": 0}, "throttled": {"seed": 0}},
    )
    gc.collect()
    gc.disable()
    try:
        handle = fs.open(path, "rb")
        assert len(handle.read(100)) == 100 and len(handle.cache.cache) >= 2**20
        files, blocks = weakref.ref(handle), weakref.ref(handle.cache)
        del handle
        assert files() is None and blocks() is None
    finally:
        gc.enable()


def _cached(path, cache_dir, **extra):
    return open_filesystem(
        f"shardcache::throttled::file://{path}",
        {"shardcache": {"cache_storage": str(cache_dir), "skip_instance_cache": True, **extra},
         "throttled": {"latency_ms": 100}},
    )  # fmt: skip


def test_cache_serves_second_read_locally(blob, tmp_path):
    fs, path = _cached(blob, tmp_path / "c")
    first, data = _timed(lambda: fs.cat_file(path))
    second, again = _timed(lambda: fs.cat_file(path))
    assert data == again and len(data) == 2_000_000
    assert first >= 0.1 and second < 0.05
    assert not [n for n in os.listdir(tmp_path / "c") if n.startswith(".partial-")]


def test_cache_respects_its_size_bound(tmp_path):
    files = []
    for k in range(4):
        p = tmp_path / f"f{k}.bin"
        p.write_bytes(b"x" * 1_000_000)
        files.append(str(p))
    fs, _ = _cached(files[0], tmp_path / "c", max_bytes=2_500_000)
    for p in files:
        with fs.open(p, "rb") as f:
            f.read()
    sizes = [e.stat().st_size for e in os.scandir(tmp_path / "c") if e.is_file()]
    assert sum(sizes) <= 2_500_000 and len(sizes) == 2


def test_cache_never_serves_a_partial_download(blob, tmp_path):
    fs, path = _cached(blob, tmp_path / "c")
    real = fs.fs.get_file

    def crash(rpath, lpath, **kw):
        with open(lpath, "wb") as f:
            f.write(b"partial")
        raise ConnectionResetError("killed mid-download")

    fs.fs.get_file = crash
    with pytest.raises(ConnectionResetError):
        fs.cat_file(path)
    assert os.listdir(tmp_path / "c") == []
    fs.fs.get_file = real
    with open(blob, "rb") as f:
        assert fs.cat_file(path) == f.read()


def test_every_read_path_serves_one_copy_that_a_new_instance_reuses(blob, tmp_path):
    """open, cat_file and cat_ranges share one local copy, downloaded once; another
    instance on the same directory (another worker) reads nothing remote; a write through
    the cache drops the stale copy."""
    data = Path(blob).read_bytes()

    def cached():
        return open_filesystem(
            f"shardcache::throttled::file://{blob}",
            {"shardcache": {"cache_storage": str(tmp_path / "c"), "skip_instance_cache": True},
             "throttled": {"skip_instance_cache": True}},
        )  # fmt: skip

    fs, path = cached()
    assert fs.cat_ranges([path, path], [0, 100], [5, 200]) == [data[:5], data[100:200]]
    downloaded = fs.fs.requests
    with fs.open(path, "rb") as f:
        assert f.read() == data
    assert fs.cat_file(path, 10, 20) == data[10:20] and fs.cat_file(path, -5) == data[-5:]
    assert downloaded > 0 and fs.fs.requests == downloaded, "read again from the store"
    other, _ = cached()
    assert other.cat_file(path) == data and other.fs.requests == 0
    assert not [n for n in os.listdir(tmp_path / "c") if n.startswith(".partial-")]
    fs.pipe_file(path, b"rewritten")
    assert other.cat_file(path) == b"rewritten", "a stale copy served after a write"


@pytest.mark.s3
def test_throttle_in_front_of_moto_s3(s3_options):  # noqa: F811
    import s3fs

    s3fs.S3FileSystem(**s3_options).pipe("iolib-bench/t/x.bin", b"y" * 1000)
    url, options = wrap_url("s3://iolib-bench/t/x.bin", s3_options, "throttled", {"latency_ms": 30})
    fs, path = open_filesystem(url, options)
    elapsed, data = _timed(lambda: fs.cat_file(path))
    assert data == b"y" * 1000 and elapsed >= 0.029


def test_wrapper_entry_points_and_public_names_resolve():
    """pyproject.toml's and the installed metadata's `fsspec.specs` entry points, and
    fsspec's registry, all name the same classes, importable from `iolib.storage`."""
    import importlib
    import importlib.metadata
    from pathlib import Path

    import fsspec

    import iolib.storage

    tomllib = pytest.importorskip("tomllib")
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    declared = tomllib.loads(pyproject.read_text())["project"]["entry-points"]["fsspec.specs"]
    assert set(declared) == {"throttled", "faulty", "shardcache"}
    installed = {e.name: e for e in importlib.metadata.entry_points(group="fsspec.specs")}
    for name, target in declared.items():
        module, attr = target.split(":")
        cls = getattr(importlib.import_module(module), attr)
        assert fsspec.get_filesystem_class(name) is cls
        if name in installed:
            assert installed[name].load() is cls
    for name in iolib.storage.__all__:
        assert getattr(iolib.storage, name) is not None


def test_exit_hook_stops_idle_io_helpers():
    # An idle helper wakes every so often; one waking while the interpreter finalizes
    # aborted the process (3 of 12 runs of a script exiting after an epoch). The hook
    # runs in a child, since it switches its process to inline calls for good.
    script = """
from iolib.storage import timeouts
assert timeouts.call_with_timeout(lambda: 1, 5.0, "x") == 1
helpers = timeouts.live_helper_threads()
assert helpers, "the call should have started a helper thread"
timeouts.stop_helpers()
assert not any(t.is_alive() for t in helpers)
assert timeouts.call_with_timeout(lambda: 2, 5.0, "x") == 2  # after the hook: inline
assert not timeouts.live_helper_threads()
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_cpu_of_a_call_on_the_timeout_helper_counts_for_the_caller():
    """Reads run on a helper thread (so a stuck one can be abandoned); their CPU must
    reach the calling worker's stage times, or CPU-bound reads look like waiting."""
    from iolib.storage import helper_cpu_s, timeouts

    def compute() -> int:
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass
        return 7

    before = helper_cpu_s()
    assert timeouts.call_with_timeout(compute, 5.0, "x") == 7
    assert helper_cpu_s() - before >= 0.02


@pytest.fixture
def tiny_disk(tmp_path):
    """A 256 KiB filesystem (tmpfs, mounted by the test; needs root, as CI runs)."""
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        timeout=60,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=60)


def test_a_full_cache_disk_is_a_storage_error_at_once_not_bad_data(tmp_path, tiny_disk, caplog):
    table = pa.table({"x": np.arange(200_000, dtype=np.int64)})  # ~1.6 MB: does not fit
    pq.write_table(table, tmp_path / "big.parquet", compression="none")
    url = f"shardcache::file://{tmp_path / 'big.parquet'}"
    options = {"shardcache": {"cache_storage": str(tiny_disk), "skip_instance_cache": True}}
    policy = RetryPolicy(attempts=5, base_delay_s=0.01, max_delay_s=0.01)
    caplog.set_level(logging.DEBUG, logger="iolib")
    with pytest.raises(StorageError, match=r"disk is full.*The data itself is fine") as info:
        len(ParquetSource(url, storage_options=options, retry=policy))
    assert "retrying" not in caplog.text, "a full disk is no transient error"
    assert "corrupt" not in str(info.value) and str(tiny_disk) in str(info.value)


class NoCredentialsError(Exception):
    """Stands in for botocore's: iolib recognises it by name, without importing botocore."""


def test_missing_credentials_fail_at_once_and_say_how_to_pass_them() -> None:
    calls = []

    def no_credentials():
        calls.append(1)
        raise NoCredentialsError("Unable to locate credentials")

    with pytest.raises(PermissionError) as info:
        call_with_retries(no_credentials, what="listing 's3://bucket/train/'")
    assert len(calls) == 1, "a retry cannot find credentials"
    text = str(info.value)
    assert "s3://bucket/train/" in text and "Unable to locate credentials" in text
    assert "storage_options" in text and "-o key=" in text
