"""A forked worker inherits no read in flight and no held lock (iolib.base.forks)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib.sources import ParquetSource

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork start method")


def _exit_code(pid: int, within_s: float) -> int | None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_a_forked_worker_reads_what_its_parent_had_in_flight(tmp_path: Path) -> None:
    # A process worker forked while a thread of the trainer (a thread-mode loader, a
    # read-ahead) was reading a row group used to wait for that read forever: its
    # reader stayed in the parent.
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": np.arange(40)}), path, row_group_size=10)
    fast = {"throttled": {"latency_ms": 0, "skip_instance_cache": True}}
    source = ParquetSource(f"throttled::file://{path}", storage_options=fast)
    assert len(source) == 40  # listed and footers read at once
    # Storage turns slow: the parent's read below stays in flight for seconds.
    source.storage_options = {"throttled": {"latency_ms": 3000, "skip_instance_cache": True}}
    reader = threading.Thread(target=source.read, args=(np.arange(8),), kwargs={"epoch": 0})
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while source.cache_stats()["row_group_reads"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # counted as the read starts, before storage answers
        assert source.cache_stats()["row_group_reads"] == 1
        pid = os.fork()
        if pid == 0:  # the worker: read the same rows, then leave at once
            code = 1
            try:
                code = 0 if source.read(np.arange(8), epoch=0).num_rows == 8 else 1
            finally:
                os._exit(code)
        assert reader.is_alive(), "the parent's read ended before the fork: nothing tested"
        assert _exit_code(pid, within_s=30) == 0, "the forked reader hung or failed"
    finally:
        reader.join(30)
