"""on_error="skip" over any run of bad row groups, in every shuffle mode, on every
rank: no abort, no empty batch, equal batch counts, no bad sample, no good one lost
(issue 33, item 1: a sequential read used to exhaust its spares inside one long bad
row group)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.sources import ParquetSource

GROUPS, ROWS = 40, 25


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("skip") / "clean.parquet"
    values = np.random.default_rng(0).integers(0, 2**62, GROUPS * ROWS)
    table = pa.table({"id": np.arange(GROUPS * ROWS), "x": values})
    pq.write_table(table, path, row_group_size=ROWS, compression="snappy")
    return path


def _corrupted(clean: Path, where: Path, groups: range) -> str:
    shutil.copy(clean, where)
    data = bytearray(where.read_bytes())
    meta = pq.ParquetFile(where).metadata
    for group in groups:
        chunk = meta.row_group(group).column(1)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        end = start + chunk.total_compressed_size // 2
        data[start + 10 : end] = b"\xff" * (end - start - 10)
    where.write_bytes(bytes(data))
    return str(where)


CASES = [
    (s, *map(int, np.random.default_rng(s).integers([0, 1, 0, 1, 0], [GROUPS, 31, 3, 4, 2])))
    for s in range(14)
]


@pytest.mark.parametrize(("seed", "first", "length", "mode", "world", "size"), CASES)
def test_skip_survives_a_run_of_bad_row_groups(clean, tmp_path, seed, first, length, mode,
                                               world, size) -> None:  # fmt: skip
    bad_groups = range(first, min(GROUPS, first + length))
    url = _corrupted(clean, tmp_path / "bad.parquet", bad_groups)
    bad = set(range(bad_groups.start * ROWS, bad_groups.stop * ROWS))
    shuffle = [False, True, "block"][mode]
    batch_size = [4, 16][size]
    per_rank = []
    for rank in range(world):
        loader = DataLoader(ParquetSource(url), batch_size=batch_size, shuffle=shuffle,
                            seed=seed, rank=rank, world_size=world, on_error="skip",
                            shuffle_window=3, num_workers=2)  # fmt: skip
        batches = [np.asarray(b["id"]).tolist() for b in loader]
        assert len(batches) == len(loader), "every rank yields len(loader) batches"
        assert all(batches), "no batch is empty"
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1, "equal batch counts on every rank"
    seen = {i for batches in per_rank for batch in batches for i in batch}
    assert not seen & bad, "a bad sample was delivered"
    assert seen == set(range(GROUPS * ROWS)) - bad, "a good sample was lost"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True, "block"])
def test_skipped_counts_each_bad_row_once_and_blames_no_cache(
    clean, tmp_path, caplog, shuffle, workers
) -> None:
    """Every other row group corrupt (500 bad rows): `skipped` is 500 in every shuffle
    mode (shuffle=False counted the failed spares of refilled batches again: 559), and a
    dataset far below the cache logs no "cache holds less than this shuffle needs"."""
    caplog.set_level("WARNING")
    url = _corrupted(clean, tmp_path / "bad.parquet", range(0, GROUPS, 2))
    loader = DataLoader(ParquetSource(url), batch_size=16, shuffle=shuffle, seed=1,
                        on_error="skip", num_workers=workers)  # fmt: skip
    ids = [i for b in loader for i in np.asarray(b["id"]).tolist()]
    good = {i for i in range(GROUPS * ROWS) if (i // ROWS) % 2}
    assert set(ids) == good
    stats = loader.stats()
    assert stats["skipped"] == GROUPS * ROWS - len(good) == 500, stats
    assert len(ids) == len(good) + stats["refilled"]  # the only repeats: refilled batches
    assert "holds less than this shuffle needs" not in caplog.text
