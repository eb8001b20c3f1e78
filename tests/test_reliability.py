"""Reliability: storage faults, corrupt data, worker failures, crash and resume, the disk
cache under SIGKILL, and credentials kept out of every message.

Every test uses real parts: Parquet and JPEGs written here, fsspec's local and memory
filesystems, the seeded `faulty::` wrapper, moto's S3 server, real subprocesses killed
with SIGKILL. docs/reliability.md summarises what they prove.
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import Dataset

from iolib import DataLoader
from iolib.base.redact import Redactor, redact_options, redact_text
from iolib.decode.images import ImagePipeline
from iolib.errors import DataError, WorkerDied, failure_text
from iolib.loader.testing import assert_batches_equal
from iolib.sources import ParquetSource
from iolib.storage import RetryPolicy, call_with_retries, wrap_url
from tests.conftest import jpeg_bytes, write_parquet_shards
from tests.failures import raises_failure
from tests.fixtures_s3 import s3_options  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
FAST = RetryPolicy(attempts=12, base_delay_s=0.001, max_delay_s=0.01)
FAULTS = {"error_rate": 0.2, "truncate_rate": 0.05, "slow_rate": 0.05, "slow_ms": 20}


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """400 rows, 4 files, row groups of 25 (16 row groups)."""
    write_parquet_shards(tmp_path / "d", 400, shards=4, row_group_size=25)
    return tmp_path / "d"


def _faulty(url: str, options=None, seed: int = 1, **faults):
    faults = {"seed": seed, "shared": True, "skip_instance_cache": True, **faults}
    return wrap_url(url, options, "faulty", faults)


def _in_memory(directory: Path, name: str) -> str:
    """The files of `directory` copied to a fixed path of fsspec's memory filesystem."""
    fs = fsspec.filesystem("memory")
    for path in sorted(directory.iterdir()):
        fs.pipe_file(f"/iolib-reliability/{name}/{path.name}", path.read_bytes())
    return f"memory:///iolib-reliability/{name}"


def _loader(source, **kw) -> DataLoader:
    args = dict(batch_size=16, shuffle="block", shuffle_window=4, num_workers=2, seed=3)
    return DataLoader(source, **{**args, **kw})


# -- 1. storage faults ------------------------------------------------------------------


def test_transient_faults_are_retried_counted_and_change_nothing(shards: Path) -> None:
    clean = list(_loader(ParquetSource(str(shards))))
    # The fault draws are keyed by path: at a fixed path they are the same on every run
    # (under a temporary directory one run in 40 drew no fault at all). Each row group is
    # one request (exact ranges): 15 reads, and seeds 1 and 2 drew no fault among them.
    url, options = _faulty(_in_memory(shards, "transient"), seed=3, **FAULTS)
    loader = _loader(ParquetSource(url, storage_options=options, retry=FAST))
    faulty = list(loader)
    assert_batches_equal(faulty, clean, "faulty local storage")
    stats = loader.stats()
    assert stats["retries"] > 0 and stats["skipped"] == 0
    assert sum(len(b["id"]) for b in faulty) == 400


@pytest.mark.s3
def test_transient_faults_in_front_of_moto_s3(shards: Path, s3_options) -> None:  # noqa: F811
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options)
    fs.put(str(shards), "iolib-bench/rel/", recursive=True)
    root = "s3://iolib-bench/rel/d" if fs.exists("iolib-bench/rel/d") else "s3://iolib-bench/rel"
    clean = list(_loader(ParquetSource(str(shards))))
    plain = list(_loader(ParquetSource(root, storage_options=s3_options)))
    url, options = _faulty(root, s3_options, seed=2, **FAULTS)
    loader = _loader(ParquetSource(url, storage_options=options, retry=FAST))
    assert_batches_equal(plain, clean, "S3 vs local")
    assert_batches_equal(list(loader), clean, "faulty S3 vs local")
    assert loader.stats()["retries"] > 0


def _break_storage_after_listing(source: ParquetSource, **faults) -> ParquetSource:
    """Storage that lists fine, then fails: the files' reads go through `faults`."""
    len(source)  # footers read through healthy storage
    source.storage_options = _faulty(source.urls[0], None, **faults)[1]
    source.urls = [_faulty(u, None)[0] for u in source.urls]
    return source


def test_permanent_failure_names_url_row_group_and_attempts(shards: Path) -> None:
    policy = RetryPolicy(attempts=3, base_delay_s=0.001, max_delay_s=0.001)
    source = _break_storage_after_listing(
        ParquetSource(f"file://{shards}", retry=policy), error_rate=1.0
    )
    loader = _loader(source, shuffle="none")
    with raises_failure(OSError) as info:
        list(loader)
    text = failure_text(info.value)
    assert "part-000.parquet' row group 0: failed after 3 attempts" in text
    assert "ConnectionResetError" in text and info.value.iolib_stage == "read"
    assert not loader.stats()["worker_threads"], "workers must be released after an error"


def test_missing_object_names_url_row_group_and_attempt(shards: Path) -> None:
    source = _break_storage_after_listing(
        ParquetSource(f"file://{shards}"), missing=["*part-002.parquet"]
    )
    with raises_failure(match=r"part-002.parquet' row group 0: failed on attempt 1"):
        list(_loader(source, shuffle="none"))


def test_stuck_request_times_out_instead_of_hanging(shards: Path) -> None:
    policy = RetryPolicy(attempts=2, base_delay_s=0.001, max_delay_s=0.001, timeout_s=0.3)
    source = _break_storage_after_listing(
        ParquetSource(f"file://{shards}", retry=policy), slow_rate=1.0, slow_ms=4000
    )
    start = time.monotonic()
    with raises_failure(OSError, match=r"failed after 2 attempts.*TimeoutError.*0.3 s"):
        list(_loader(source))
    assert time.monotonic() - start < 3.0  # 2 x 0.3 s, not 2 x 4 s


def test_stuck_request_that_recovers_on_retry_changes_nothing(shards: Path) -> None:
    clean = list(_loader(ParquetSource(str(shards))))
    policy = RetryPolicy(attempts=8, base_delay_s=0.001, max_delay_s=0.001, timeout_s=0.15)
    # At a fixed path the fault draws are the same on every run (under a temporary
    # directory about one run in 7 drew no slow read and the test failed).
    source = _break_storage_after_listing(
        ParquetSource(_in_memory(shards, "stuck"), retry=policy),
        slow_rate=0.3,
        slow_ms=1000,
        seed=5,
    )
    loader = _loader(source)
    assert_batches_equal(list(loader), clean, "stuck reads retried")
    assert loader.stats()["retries"] > 0


def test_failed_reads_release_their_memory(tmp_path: Path) -> None:
    """A failed read's traceback once kept the Parquet reader, and with it the read's
    Arrow buffers, alive (a cycle through C++ the garbage collector cannot see): RSS grew
    ~200 MiB/min in the soak. Arrow's allocation must stay flat across epochs."""
    import gc

    write_parquet_shards(tmp_path / "d", 4000, shards=2, row_group_size=250, seq_len=256)
    # At a fixed path the fault draws are the same on every run (under a temporary
    # directory the draws, and so the failed reads, changed from run to run).
    url, options = _faulty(_in_memory(tmp_path / "d", "release"), error_rate=0.3,
                           truncate_rate=0.05)  # fmt: skip
    source = ParquetSource(url, storage_options=options, retry=FAST, cache_bytes=2**21)
    loader = _loader(source, batch_size=50)
    allocated = []
    for epoch in range(6):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        gc.collect()
        allocated.append(pa.total_allocated_bytes())
    # Enough failed reads that their buffers (a row group each, about 250 KiB) would pass the
    # 1 MiB bound below if they were kept.
    assert loader.stats()["retries"] >= 5
    assert allocated[-1] <= allocated[1] + 2**20, [a >> 10 for a in allocated]


def test_wrapped_file_handles_do_not_outlive_their_readers(tmp_path: Path) -> None:
    """Readers dropped after a failed read, and the per-thread readers of workers that
    ended, must free their `faulty::throttled::` file handles (and readahead blocks) by
    reference counting, not wait for a full garbage collection a steady loader rarely
    runs (it was the soak's +66 MiB/min). Collection is off: only live handles count."""
    import gc

    write_parquet_shards(tmp_path / "d", 2000, shards=2, row_group_size=125, seq_len=64)
    url, options = wrap_url(f"file://{tmp_path / 'd'}", None, "throttled", {"seed": 0})
    faults = dict(error_rate=0.1, truncate_rate=0.05, block_size=2**16)  # many requests
    url, options = _faulty(url, options, **faults)
    source = ParquetSource(url, storage_options=options, retry=FAST, cache_bytes=2**16)
    loader = _loader(source, batch_size=50)
    gc.collect()
    gc.disable()
    try:
        for epoch in range(4):
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        loader.close()
        # The workers' I/O helper threads (and their readers) leave within ~0.5 s of their
        # workers; a handle kept by a reference cycle would never go with collection off.
        deadline = time.monotonic() + 10
        while (live := _live("_WrappedFile")) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        gc.enable()
    assert loader.stats()["retries"] > 3  # readers were dropped after failed reads
    assert live == 0, f"{live} wrapped file handles kept alive"


def _live(type_name: str) -> int:
    """Objects of a type that are alive or uncollected garbage."""
    import gc

    return sum(type(o).__name__ == type_name for o in gc.get_objects())


def test_a_failed_attempt_is_freed_without_a_garbage_collection() -> None:
    """An error handed back from the I/O helper thread once formed a cycle (error ->
    traceback -> the waiting frame -> error), keeping every failed attempt's frames, and
    the buffers they held, until a full collection."""
    import gc
    import weakref

    class Buffer:
        """Stands for the bytes a failed read held."""

    held: list[weakref.ref] = []

    def fail() -> None:
        buffer = Buffer()
        held.append(weakref.ref(buffer))
        raise ConnectionResetError("injected")

    policy = RetryPolicy(attempts=3, base_delay_s=0.0, timeout_s=10)
    gc.collect()
    gc.disable()
    try:
        try:
            call_with_retries(fail, what="reading x", policy=policy)
        except OSError as exc:
            assert "after 3 attempts" in str(exc)
        alive = [ref() is not None for ref in held]
    finally:
        gc.enable()
    assert alive == [False, False, False]


def test_storage_errors_other_than_transient_are_not_retried() -> None:
    calls = []

    def missing():
        calls.append(1)
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError, match=r"reading x: failed on attempt 1.*not retried"):
        call_with_retries(missing, what="reading x")
    assert len(calls) == 1


# -- 2. corrupt data -------------------------------------------------------------------


def _corrupt_row_group(path: Path, group: int) -> None:
    meta = pq.ParquetFile(path).metadata.row_group(group).column(0)
    data = bytearray(path.read_bytes())
    start = meta.dictionary_page_offset or meta.data_page_offset
    end = start + meta.total_compressed_size // 2
    data[start + 10 : end] = b"\xff" * (end - start - 10)
    path.write_bytes(bytes(data))


def _ids(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def _assert_skipped(got: list[list[int]], clean: list[list[int]], bad: set[int]) -> None:
    """Every batch of the clean run, less its bad samples; one whose every sample was bad
    is refilled from the plan's spares (good ones), never dropped or empty."""
    assert len(got) == len(clean)
    for have, was in zip(got, clean, strict=True):
        kept = [i for i in was if i not in bad]
        assert have == kept if kept else (have and not set(have) & bad)


def _survivors(clean: list[list[int]], bad: set[int]) -> list[list[int]]:
    """The clean run's batches with the bad samples removed (empty batches dropped)."""
    out = [[i for i in batch if i not in bad] for batch in clean]
    return [b for b in out if b]


@pytest.mark.parametrize("workers", [0, 2])
def test_corrupt_row_group_skipped_without_shifting_others(tmp_path: Path, workers) -> None:
    path = tmp_path / "c.parquet"
    values = np.random.default_rng(0).integers(0, 2**62, 200)
    table = pa.table({"id": np.arange(200), "x": values})
    pq.write_table(table, path, row_group_size=50, compression="snappy")
    clean = _ids(_loader(ParquetSource(str(path)), shuffle="global", num_workers=workers))
    # Column "x" of row group 1 (rows 50..99) is garbled.
    meta = pq.ParquetFile(path).metadata.row_group(1).column(1)
    data = bytearray(path.read_bytes())
    start = meta.dictionary_page_offset or meta.data_page_offset
    end = start + meta.total_compressed_size // 2
    data[start + 10 : end] = b"\xff" * (end - start - 10)
    path.write_bytes(bytes(data))
    with raises_failure(DataError, match=r"c.parquet' row group 1 is corrupt"):
        list(_loader(ParquetSource(str(path)), shuffle="global", num_workers=workers))
    loader = _loader(
        ParquetSource(str(path)), shuffle="global", num_workers=workers, on_error="skip"
    )
    got = _ids(loader)
    assert got == _survivors(clean, set(range(50, 100)))
    assert loader.stats()["skipped"] == 50 and loader.stats()["samples"] == 150


def test_wrong_column_type_raises_or_is_skipped(tmp_path: Path) -> None:
    paths = write_parquet_shards(tmp_path / "d", 90, shards=3, row_group_size=10)
    clean = _ids(_loader(ParquetSource(str(tmp_path / "d")), batch_size=8, shuffle="global"))
    bad = pq.read_table(paths[1])
    labels = bad.column("label").to_numpy().astype(str)
    bad = bad.set_column(1, "label", pa.array(labels))  # "3" where others have 3
    pq.write_table(bad, paths[1], row_group_size=10)
    source = ParquetSource(str(tmp_path / "d"))
    with raises_failure(
        DataError,
        match=r"part-001.parquet. row group \d: its schema differs.*.label. is string",
    ):
        list(_loader(source, batch_size=8, shuffle="global"))
    loader = _loader(ParquetSource(str(tmp_path / "d")), batch_size=8, shuffle="global",
                     on_error="skip")  # fmt: skip
    got = list(loader)
    _assert_skipped(_ids(got), clean, set(range(30, 60)))
    assert all(b["label"].dtype == torch.int32 for b in got)
    assert loader.stats()["skipped"] == 30


def test_truncated_footer_is_named_under_either_policy(shards: Path) -> None:
    path = shards / "part-003.parquet"
    path.write_bytes(path.read_bytes()[:-100])
    for policy in ("raise", "skip"):
        with pytest.raises(DataError, match=r"footer of .*part-003.parquet.*truncated"):
            list(_loader(ParquetSource(str(shards)), on_error=policy))


def _image_table(n: int, bad: dict[int, bytes]) -> pa.Table:
    images = [bad.get(i, jpeg_bytes(i, (24, 20))) for i in range(n)]
    return pa.table({"id": np.arange(n), "image": pa.array(images, pa.binary())})


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_corrupt_images_skipped_and_counted(tmp_path: Path, mode: str) -> None:
    good = jpeg_bytes(7, (24, 20))
    bad = {3: good[: len(good) // 2], 10: b"not an image", 17: b"", 30: good[:20]}
    pq.write_table(_image_table(40, {}), tmp_path / "clean.parquet", row_group_size=10)
    pq.write_table(_image_table(40, bad), tmp_path / "bad.parquet", row_group_size=10)

    def run(name: str, on_error: str = "skip"):
        pipe = ImagePipeline(size=16, backend="pil", device="cpu", on_error=on_error)
        loader = _loader(ParquetSource(str(tmp_path / name)), batch_size=6, decode=pipe,
                         worker_mode=mode)  # fmt: skip
        return loader, list(loader)

    _, clean = run("clean.parquet")
    loader, got = run("bad.parquet")
    assert _ids(got) == _survivors(_ids(clean), set(bad))
    assert loader.stats()["skipped"] == len(bad)
    for batch, ref in zip(got, clean, strict=True):  # survivors' pixels are unchanged
        keep = [i for i, v in enumerate(ref["id"].tolist()) if v not in bad]
        assert torch.equal(batch["image"], ref["image"][keep])
    with raises_failure(match=r"stage 'decode'.*sample") as info:
        run("bad.parquet", on_error="raise")
    assert info.value.iolib_stage == "decode"


def _png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    body = struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk))
    iend = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return b"\x89PNG\r\n\x1a\n" + body + iend


def _jpeg_with_size(width: int, height: int) -> bytes:
    data = bytearray(jpeg_bytes(1, (24, 20)))
    pos = data.find(b"\xff\xc0")
    data[pos + 5 : pos + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


@pytest.mark.parametrize("blob", ["png", "jpeg"])
def test_huge_dimension_header_is_refused_before_decoding(blob: str) -> None:
    crafted = _png_header(200_000, 90_000) if blob == "png" else _jpeg_with_size(65_000, 65_000)
    pipe = ImagePipeline(size=16, backend="pil", device="cpu")
    batch = {"image": [jpeg_bytes(0), crafted], "id": torch.tensor([0, 1])}
    rss = psutil.Process().memory_info().rss
    start = time.monotonic()
    with pytest.raises(DataError, match=r"over max_image_pixels=89478485|too large to open"):
        pipe(batch, np.array([0, 1]), seed=0, epoch=0)
    assert time.monotonic() - start < 2.0
    assert psutil.Process().memory_info().rss - rss < 200 * 2**20  # 40 GP never allocated


# -- 3. worker failures ----------------------------------------------------------------


class Failing(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        time.sleep(0.002)
        if index == 37:
            raise KeyError(f"label missing for {index}")
        return torch.tensor(index)


def _shm_files() -> set[str]:
    return (
        {n for n in os.listdir("/dev/shm") if "torch" in n} if os.path.isdir("/dev/shm") else set()
    )


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _wait_released(
    before_threads: set, before_children: set[int], timeout: float = 10.0
) -> tuple[set, set]:
    """Wait until the loader's processes and threads are gone (others, such as the moto
    server of an S3 test, were there before)."""
    deadline = time.monotonic() + timeout
    while True:
        children = _children() - before_children
        threads = {t for t in threading.enumerate() if t.name.startswith("iolib-")} - before_threads
        if (not children and not threads) or time.monotonic() > deadline:
            return children, threads
        time.sleep(0.05)


def test_process_worker_error_surfaces_and_releases_everything() -> None:
    before = {t for t in threading.enumerate() if t.name.startswith("iolib-")}
    shm, kids = _shm_files(), _children()
    loader = DataLoader(Failing(), batch_size=4, num_workers=2, worker_mode="process")
    with raises_failure(KeyError, match=r"sample\(s\) \[37\].*KeyError") as info:
        list(loader)
    assert "__getitem__" in failure_text(info.value) and info.value.iolib_batch == 9
    children, threads = _wait_released(before, kids)
    assert not children, f"worker processes left: {children}"
    assert not threads, f"threads left: {threads}"
    assert _shm_files() <= shm, "shared memory left behind"


class Busy(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, index: int):
        time.sleep(0.005)
        return torch.full((1024,), index)


def test_worker_killed_from_outside_under_load_is_reported() -> None:
    kids = _children()
    before = {t for t in threading.enumerate() if t.name.startswith("iolib-")}
    loader = DataLoader(Busy(), batch_size=8, num_workers=3, worker_mode="process", prefetch=9)
    it = iter(loader)
    next(it), next(it)
    victim = loader.stats()["worker_pids"][1]
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDied, match=rf"pid {victim}\) exited with code -9"):
        for _ in it:
            pass
    assert time.monotonic() - start < 20
    children, _ = _wait_released(before, kids)
    assert not children


# -- 4. crash and resume ---------------------------------------------------------------

TRAINER = """
import json, os, sys, time
from iolib import DataLoader
from iolib.sources import ParquetSource

data, ckpt, log, step_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
loader = DataLoader(ParquetSource(data), batch_size=8, shuffle=True, num_workers=2, seed=5)
done = 0
if os.path.exists(ckpt):
    with open(ckpt) as f:
        saved = json.load(f)
    loader.load_state_dict(saved["state"])
    done = saved["batches"]
with open(log, "a") as out:
    for k, batch in enumerate(loader, start=done):
        out.write(json.dumps({"pid": os.getpid(), "batch": k, "ids": batch["id"].tolist()}) + "\\n")
        out.flush()
        time.sleep(step_s)  # the training step
        with open(ckpt + ".tmp", "w") as f:
            json.dump({"batches": k + 1, "state": loader.state_dict()}, f)
        os.replace(ckpt + ".tmp", ckpt)  # the commit: atomic
"""


def _trainer(tmp_path: Path, data: Path, step_s: float) -> subprocess.Popen:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [sys.executable, str(script), str(data), str(tmp_path / "ckpt.json"),
            str(tmp_path / "ids.jsonl"), str(step_s)]  # fmt: skip
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_sigkill_mid_epoch_then_resume_delivers_each_sample_once(tmp_path: Path) -> None:
    data = tmp_path / "d"
    write_parquet_shards(data, 200, shards=2, row_group_size=20)
    ckpt = tmp_path / "ckpt.json"
    first = _trainer(tmp_path, data, step_s=0.1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and first.poll() is None:
        if ckpt.exists() and json.loads(ckpt.read_text())["batches"] >= 4:
            break
        time.sleep(0.02)
    assert first.poll() is None, first.stdout.read().decode()
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    committed = json.loads(ckpt.read_text())["batches"]
    assert 4 <= committed < 25, "killed mid-epoch"
    second = _trainer(tmp_path, data, step_s=0.0)
    out, _ = second.communicate(timeout=120)
    assert second.returncode == 0, out.decode()
    lines = [json.loads(x) for x in (tmp_path / "ids.jsonl").read_text().splitlines()]
    run1 = [x for x in lines if x["pid"] == first.pid and x["batch"] < committed]  # committed
    run2 = [x for x in lines if x["pid"] == second.pid]
    assert [x["batch"] for x in run1] == list(range(committed))
    assert [x["batch"] for x in run2] == list(range(committed, 25))
    ids = [i for x in run1 + run2 for i in x["ids"]]
    assert sorted(ids) == list(range(200)), "every sample exactly once"
    reference = DataLoader(ParquetSource(str(data)), batch_size=8, shuffle=True, seed=5)
    assert [x["ids"] for x in run1 + run2] == _ids(reference), "the uninterrupted order"


# -- 5. the disk cache under SIGKILL ---------------------------------------------------

DOWNLOADER = """
import sys
from iolib.storage import open_filesystem
fs, path = open_filesystem(
    "shardcache::throttled::file://" + sys.argv[1],
    {"shardcache": {"cache_storage": sys.argv[2], "skip_instance_cache": True},
     "throttled": {"bandwidth_mbps": 2, "block_size": 262144}},
)
fs.cat_file(path)
"""


def test_cache_killed_mid_download_serves_no_partial_file(tmp_path: Path) -> None:
    blob = tmp_path / "shard.bin"
    payload = os.urandom(6_000_000)  # 3 s at 2 MB/s
    blob.write_bytes(payload)
    cache = tmp_path / "cache"
    script = tmp_path / "dl.py"
    script.write_text(DOWNLOADER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, str(script), str(blob), str(cache)], env=env)
    deadline = time.monotonic() + 60
    partial: list[os.DirEntry] = []
    while time.monotonic() < deadline and proc.poll() is None:
        if cache.exists():
            partial = [e for e in os.scandir(cache) if e.name.startswith(".partial-")]
            if partial and partial[0].stat().st_size > 0:
                break
        time.sleep(0.02)
    assert partial, "the download never started"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    left = os.listdir(cache)
    assert left and all(n.startswith(".partial-") for n in left), left  # nothing final
    from iolib.storage import open_filesystem

    fs, path = open_filesystem(
        f"shardcache::file://{blob}",
        {"shardcache": {"cache_storage": str(cache), "skip_instance_cache": True,
                        "max_bytes": 7_000_000}},
    )  # fmt: skip
    assert fs.cat_file(path) == payload
    names = os.listdir(cache)
    assert not [n for n in names if n.startswith(".partial-")], "orphan partial removed"
    assert sum(os.path.getsize(cache / n) for n in names) <= 7_000_000


# -- 8. security -----------------------------------------------------------------------

SECRET_URL = "memory://AKIAFAKEKEY:SECRETVALUE9@bucket/train.parquet"


def test_credentials_in_urls_never_reach_errors_or_logs(caplog) -> None:
    import fsspec

    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": np.arange(40)}), buffer, row_group_size=10)
    fs = fsspec.filesystem("memory")
    fs.pipe(SECRET_URL.split("://", 1)[1], buffer.getvalue())
    policy = RetryPolicy(attempts=2, base_delay_s=0.001, max_delay_s=0.001)
    source = ParquetSource(SECRET_URL, retry=policy)
    assert len(source) == 40
    _break_storage_after_listing(source, error_rate=1.0)
    caplog.set_level(logging.DEBUG, logger="iolib")
    for workers, mode in ((0, "thread"), (2, "thread"), (2, "process")):
        with pytest.raises(Exception) as info:  # whatever its type, no secret in it
            list(DataLoader(source, batch_size=8, num_workers=workers, worker_mode=mode))
        shown = [failure_text(info.value), repr(info.value.__cause__)]
        text = "\n".join([*shown, source.describe(), source.locate(3), caplog.text])
        assert "AKIAFAKEKEY" not in text and "SECRETVALUE9" not in text, text
        assert "***@bucket/train.parquet" in str(info.value)
    with pytest.raises(DataError) as missing:
        len(ParquetSource("memory://AKIAFAKEKEY:SECRETVALUE9@bucket/absent.parquet"))
    assert "SECRETVALUE9" not in str(missing.value) and "***@bucket" in str(missing.value)


def test_credentials_in_storage_options_never_reach_errors() -> None:
    redact = Redactor(["s3://bucket/x"], {"s3": {"key": "AKIAFAKEKEY", "secret": "SECRETVALUE9"}})

    def denied():
        raise ConnectionError("signature mismatch for AKIAFAKEKEY/SECRETVALUE9")

    with pytest.raises(OSError) as info:
        call_with_retries(denied, what="reading s3://bucket/x", redact=redact,
                          policy=RetryPolicy(attempts=2, base_delay_s=0.001))  # fmt: skip
    assert "SECRETVALUE9" not in str(info.value) and "AKIAFAKEKEY" not in str(info.value)
    assert info.value.__cause__ is None, "the raw error must not ride along as the cause"
    assert redact_options({"s3": {"secret": "x", "anon": False}}) == {
        "s3": {"secret": "***", "anon": False}
    }
    assert redact_text('--storage-options \'{"token": "abcd1234"}\'').count("abcd1234") == 0


def test_bench_command_and_observations_are_redacted(tmp_path: Path) -> None:
    from iolib.cli.bench import records
    from iolib.cli.bench.harness import BenchSpec

    options = {"key": "AKIAFAKEKEY", "secret": "SECRETVALUE9"}
    command = (
        "iolib bench --data s3://AKIAFAKEKEY:SECRETVALUE9@bucket/train "
        f"--storage-options '{json.dumps(options)}'"
    )
    spec = BenchSpec(data="s3://AKIAFAKEKEY:SECRETVALUE9@bucket/train", data_options=options,
                     command=command)  # fmt: skip
    assert "SECRETVALUE9" not in spec.command and "AKIAFAKEKEY" not in spec.command
    assert spec.command.startswith("iolib bench --data s3://***@bucket/train")
    paths = records.write_observations([{"command": command, "workload": "w"}], str(tmp_path))
    for path in paths:
        assert b"SECRETVALUE9" not in Path(path).read_bytes()


def test_storage_bytes_are_never_unpickled_or_executed() -> None:
    """Only Parquet (pyarrow), images (Pillow/DALI) and JSON are parsed from storage; the
    only pickling is torch multiprocessing moving our own BatchFetcher, tasks and
    results between processes. A new unpickling or eval call in iolib fails this test."""
    banned = ("pickle.load", "torch.load(", "eval(", "exec(", "allow_pickle=True",
              "marshal.loads", "yaml.load(", "dill.", "cloudpickle.")  # fmt: skip
    hits = []
    for path in (REPO / "iolib").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if any(b in line for b in banned):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, hits
