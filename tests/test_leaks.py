"""Loaders free what they hold: a closed or dropped loader leaves no thread, no source
and no Arrow memory behind, with the cycle collector on or off (issue 33, item 5)."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.sources import ParquetSource
from iolib.text import PackedTokens
from tests.token_data import doc_lengths, write_documents


@pytest.fixture
def shard(tmp_path) -> str:
    path = tmp_path / "blobs.parquet"
    table = pa.table({"x": np.arange(4000), "blob": [bytes(1000)] * 4000})
    pq.write_table(table, path, row_group_size=500)
    return str(path)


OURS = ("iolib-readahead", "iolib-fetch", "iolib-tokens")


def _our_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(OURS)]


def _settle(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


@pytest.mark.parametrize("collector", ["on", "off"])
@pytest.mark.parametrize("ending", ["close", "drop"])
def test_a_new_loader_each_epoch_leaves_nothing_behind(shard, collector, ending) -> None:
    before = set(_our_threads())
    sources = []
    if collector == "off":
        gc.disable()
    try:
        for _ in range(4):
            source = ParquetSource(shard)
            loader = DataLoader(source, batch_size=64, num_workers=2, shuffle=True, seed=0)
            for _batch in loader:
                pass
            if ending == "close":
                loader.close()
            sources.append(weakref.ref(source))
            del loader, source, _batch
        assert _settle(lambda: all(ref() is None for ref in sources)), "a source outlived it"
        assert _settle(lambda: set(_our_threads()) <= before), _our_threads()
        assert pa.total_allocated_bytes() < 8 * 2**20  # 2 MB a row group were read
    finally:
        gc.enable()


def test_close_frees_the_cache_of_a_source_still_referenced(shard) -> None:
    gc.collect()
    before = pa.total_allocated_bytes()  # what earlier tests' objects still hold
    source = ParquetSource(shard)
    for _batch in DataLoader(source, batch_size=64, num_workers=2):
        pass
    del _batch
    assert pa.total_allocated_bytes() > before + 2 * 2**20
    source.close()
    # The loader (its worker threads, each batch's last read) is gone once collected; a
    # read close() stopped waiting for may still be landing: bounded, never kept.
    gc.collect()
    assert _settle(lambda: pa.total_allocated_bytes() < before + 2**20), (
        before,
        pa.total_allocated_bytes(),
    )
    assert len(next(iter(DataLoader(source, batch_size=8)))["x"]) == 8  # reads again


def test_packed_tokens_let_go_of_their_threads_and_rows(tmp_path, monkeypatch) -> None:
    # Threads of sources other tests dropped end when those are collected: not ours.
    gc.collect()
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))
    url = write_documents(tmp_path / "t", doc_lengths(200), row_group_size=16)
    windows = PackedTokens(url, column="tokens", seq_len=8, eos_id=0)
    # seed=0, the source's own: the loader reads this object, not a copy for its seed.
    for _ in DataLoader(windows, batch_size=4, shuffle=True, num_workers=2, seed=0):
        pass
    assert windows.cache_stats()["cache_held_bytes"] > 0
    windows.close()
    assert windows.cache_stats()["cache_held_bytes"] == 0
    assert _settle(lambda: not _our_threads()), _our_threads()
