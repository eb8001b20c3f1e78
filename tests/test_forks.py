"""A forked worker inherits no read in flight and no held lock (iolib.forks)."""

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
    source = ParquetSource(str(path))
    assert len(source) == 40
    parent, started, release = os.getpid(), threading.Event(), threading.Event()
    fetch = source._fetch_row_group

    def held_in_the_parent(group: int):
        if os.getpid() == parent:
            started.set()
            release.wait(30)
        return fetch(group)

    source._fetch_row_group = held_in_the_parent  # type: ignore[method-assign]
    reader = threading.Thread(target=source.read, args=(np.arange(8),), kwargs={"epoch": 0})
    reader.start()
    try:
        assert started.wait(10)
        pid = os.fork()
        if pid == 0:  # the worker: read the same rows, then leave at once
            code = 1
            try:
                code = 0 if source.read(np.arange(8), epoch=0).num_rows == 8 else 1
            finally:
                os._exit(code)
        assert _exit_code(pid, within_s=20) == 0, "the forked reader hung or failed"
    finally:
        release.set()
        reader.join(10)
