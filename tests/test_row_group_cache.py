"""The row-group cache: sized from decoded Arrow bytes, evicting by next use in the plan,
so a block shuffle reads each row group once at a budget below the dataset and a global
shuffle re-reads only what does not fit (counted in stats())."""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.errors import ConfigError
from iolib.sources import ParquetSource
from tests.token_data import doc_lengths, write_documents

GROUPS, ROWS = 16, 32  # row groups, rows per row group


@pytest.fixture
def docs(tmp_path) -> str:
    return write_documents(tmp_path / "d", doc_lengths(GROUPS * ROWS), row_group_size=ROWS)


def _group_bytes(url: str) -> int:
    source = ParquetSource(url)
    return max(source.row_group(g).nbytes for g in range(GROUPS))


def test_size_estimate_matches_the_measured_arrow_size(tmp_path, docs) -> None:
    strings = tmp_path / "s.parquet"
    words = [f"word-{i % 13}" * (1 + i % 5) for i in range(600)]  # dictionary-encoded
    pq.write_table(
        pa.table({"w": words, "x": np.arange(600, dtype=np.float32)}), strings, row_group_size=100
    )
    for url, columns in ((docs, None), (docs, ["tokens"]), (str(strings), None)):
        source = ParquetSource(url, columns=columns)
        estimates = source.estimated_bytes()
        measured = [source.row_group(g).nbytes for g in range(len(estimates))]
        for est, got in zip(estimates, measured, strict=True):
            assert 0.9 * got <= est <= 1.15 * got, (url, columns, est, got)


def test_block_shuffle_reads_each_row_group_once_below_the_dataset(docs) -> None:
    budget = 6 * _group_bytes(docs)  # the dataset takes 16
    for workers in (0, 2):
        source = ParquetSource(docs, cache_bytes=budget)
        loader = DataLoader(
            source, batch_size=20, shuffle="block", shuffle_window=2, num_workers=workers, seed=1
        )
        reads = []
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            seen = np.concatenate([b["id"].numpy() for b in loader])
            assert sorted(seen.tolist()) == list(range(GROUPS * ROWS))
            reads.append(loader.stats()["row_group_reads"])
        stats = loader.stats()
        assert stats["row_group_rereads"] == 0, stats
        # Epoch 1 may find some of epoch 0's last row groups still held.
        assert reads[0] == GROUPS and reads[1] - reads[0] <= GROUPS
        assert stats["cache_held_bytes"] <= budget


def test_global_shuffle_below_the_dataset_rereads_only_what_does_not_fit(docs, caplog) -> None:
    fit = 10  # of 16 row groups
    budget = fit * _group_bytes(docs)
    source = ParquetSource(docs, cache_bytes=budget)
    # "global" spelled out: a full shuffle even over more than the cache (shuffle=True
    # would shuffle in windows of what the cache holds).
    loader = DataLoader(source, batch_size=64, shuffle="global", seed=0)
    with caplog.at_level(logging.WARNING):
        batches = len(list(loader))
    stats = loader.stats()
    # Every batch touches nearly all 16 row groups; an LRU cache of 10 re-reads all 16
    # for each batch. Evicting by next use re-reads at most those that do not fit.
    assert stats["row_group_reads"] <= GROUPS + batches * (GROUPS - fit + 1)
    assert stats["row_group_reads"] < 0.6 * batches * GROUPS
    assert stats["row_group_rereads"] == stats["row_group_reads"] - GROUPS > 0
    warnings = [r for r in caplog.records if "read again" in r.getMessage()]
    assert len(warnings) == 1 and "shuffle='block'" in warnings[0].getMessage()


def test_default_cache_holds_a_global_shuffle_without_rereads(docs) -> None:
    loader = DataLoader(ParquetSource(docs), batch_size=64, shuffle=True, num_workers=2)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        list(loader)
    stats = loader.stats()
    assert stats["row_group_reads"] == GROUPS and stats["row_group_rereads"] == 0


def test_row_groups_of_the_next_batches_are_read_ahead(docs) -> None:
    source = ParquetSource(docs, cache_bytes=8 * _group_bytes(docs), readahead=3)
    loader = DataLoader(source, batch_size=20, shuffle="block", shuffle_window=2, seed=1)
    iterator = iter(loader)
    first = next(iterator)
    own = len(np.unique(first["id"].numpy() // ROWS))  # row groups batch 0 itself reads
    deadline = time.monotonic() + 10
    while loader.stats()["row_group_reads"] <= own and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader.stats()["row_group_reads"] > own
    rest = [b["id"] for b in iterator]
    assert sorted(np.concatenate([first["id"], *rest]).tolist()) == list(range(GROUPS * ROWS))
    assert loader.stats()["row_group_rereads"] == 0


def test_readahead_must_be_a_count(docs) -> None:
    with pytest.raises(ConfigError, match="readahead"):
        ParquetSource(docs, readahead=-1)


@pytest.mark.parametrize("largest", [8, 400])
@pytest.mark.parametrize("spans", [False, True])
def test_the_plans_uses_match_each_batch_looked_at_alone(spans, largest) -> None:
    """The cache's view of an epoch (which row groups each batch reads, and when each row
    group is next used) is built for many batches at once: it must be what each batch
    gives looked at alone, for samples in one row group and for samples (token windows)
    that span several, with empty batches and batches of differing sizes, small (one
    sort for all) and large (a sort a batch)."""
    from iolib.sources import EpochUses

    rng = np.random.default_rng(7)
    groups = 40
    batches = [rng.integers(0, 1000, size=int(rng.integers(0, largest + 1))) for _ in range(300)]

    def alone(indices: np.ndarray) -> set[int]:  # a sample reads groups g .. g + span
        first = indices * groups // 1000
        span = indices % 3 if spans else np.zeros_like(indices)
        return {
            int(g)
            for f, s in zip(first, span, strict=True)
            for g in range(f, min(f + s, groups - 1) + 1)
        }

    def pairs(samples: np.ndarray, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = samples * groups // 1000
        span = samples % 3 if spans else np.zeros_like(samples)
        rows = [
            (k, g)
            for k, f, s in zip(ks, first, span, strict=True)
            for g in range(f, min(f + s, groups - 1) + 1)
        ]
        return np.array([k for k, _ in rows], dtype=np.int64), np.array(
            [g for _, g in rows], dtype=np.int64
        )

    uses = (
        EpochUses(0, batches, pairs_of=pairs, horizon=64)
        if spans
        else EpochUses(0, batches, lambda i: i * groups // 1000, horizon=64)
    )
    read = [alone(indices) for indices in batches]
    for k, indices in enumerate(batches):
        assert set(uses.upcoming(k, 1)) == read[k], k
        if indices.size:
            assert uses.batch_of(int(indices[0])) is not None
    for group in range(groups):
        for after in (0, 63, 64, 130, 299):
            reads = [k for k in range(after, len(batches)) if group in read[k]]
            seen = uses.next_use(group, after)
            # Looked at within two stretches of 64 batches: a use further on is "none".
            expected = reads[0] if reads and reads[0] < (after // 64 + 2) * 64 else None
            assert seen == expected, (group, after)
