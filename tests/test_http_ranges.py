"""Servers that ignore Range requests: Python's http.server answers every request with
the whole file (status 200). Reading that as the requested bytes reported healthy data
as corrupt (on_error="raise") or skipped all of it ("skip")."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.loader.testing import assert_batches_equal
from iolib.sources import ParquetSource

pytest.importorskip("aiohttp")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """tmp_path served on 127.0.0.1 by http.server, which ignores Range headers."""
    handler = functools.partial(_Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_server_without_ranges_gives_the_same_batches_as_local_disk(served, on_error) -> None:
    url, root = served
    table = pa.table({"id": np.arange(128), "x": np.arange(128) * 0.5})
    pq.write_table(table, root / "data.parquet", row_group_size=16)
    options = dict(batch_size=10, shuffle=True, seed=2, on_error=on_error)
    local = list(DataLoader(ParquetSource(str(root / "data.parquet")), **options))
    loader = DataLoader(ParquetSource(f"{url}/data.parquet"), num_workers=2, **options)
    remote = list(loader)
    assert_batches_equal(local, remote, "http.server (no ranges) against local disk")
    assert loader.stats()["skipped"] == 0 and loader.stats()["samples"] == 128
