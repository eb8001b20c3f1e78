"""on_error="skip" keeps every rank in step: each yields len(loader) batches, none empty.

A batch whose every sample fails is made from its reserve (the samples after it in the
epoch's order) instead of being dropped on the rank that owns it (which left the other
ranks waiting in their next collective) or yielded empty (the image path did that).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import Dataset

from iolib import DataLoader
from iolib.decode.images import ImagePipeline
from iolib.errors import DataError
from iolib.loader.testing import assert_batches_equal
from iolib.sources import ParquetSource
from tests.conftest import jpeg_bytes
from tests.failures import raises_failure


class FailsOn(Dataset):
    def __init__(self, size: int, bad: set[int]) -> None:
        self.size, self.bad = size, bad

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        if index in self.bad:
            raise OSError(f"unreadable sample {index}")
        return torch.tensor(index)


def _rank_batch(world: int, rank: int, k: int, **options) -> set[int]:
    probe = DataLoader(FailsOn(50, set()), rank=rank, world_size=world, **options)
    return {int(i) for i in list(probe)[k]}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_wholly_bad_batch_on_one_rank_keeps_every_rank_in_step(world, workers) -> None:
    options = dict(batch_size=4, shuffle=True, seed=3)
    bad = _rank_batch(world, world - 1, 2, **options)  # the last rank's third batch
    got = {}
    for rank in range(world):
        loader = DataLoader(
            FailsOn(50, bad),
            rank=rank,
            world_size=world,
            num_workers=workers,
            worker_mode="thread",
            on_error="skip",
            **options,
        )
        got[rank] = list(loader)
        assert len(got[rank]) == len(loader), f"rank {rank} yielded another count"
        assert all(len(batch) > 0 for batch in got[rank]), f"rank {rank}: an empty batch"
        assert not bad & {int(i) for batch in got[rank] for i in batch}
    lengths = {len(batches) for batches in got.values()}
    assert len(lengths) == 1
    stats = loader.stats()  # the last rank's: it lost a batch and refilled it
    assert stats["skipped"] == len(bad) and stats["refilled"] > 0


def test_refilled_batches_are_the_same_for_any_worker_count() -> None:
    bad = _rank_batch(1, 0, 1, batch_size=5, shuffle=True, seed=1)

    def run(workers: int) -> list:
        loader = DataLoader(
            FailsOn(40, bad),
            batch_size=5,
            shuffle=True,
            seed=1,
            num_workers=workers,
            worker_mode="process" if workers else "auto",
            on_error="skip",
        )
        return list(loader)

    inline = run(0)
    assert_batches_equal(inline, run(2), "refilled batch, 0 vs 2 process workers")
    assert len(inline[1]) > 0


def test_a_batch_whose_reserve_fails_too_raises_naming_it() -> None:
    loader = DataLoader(FailsOn(12, set(range(12))), batch_size=4, on_error="skip")
    with raises_failure(DataError, match=r"Every sample of batch 0 failed.*reserve"):
        list(loader)


@pytest.mark.parametrize("loader_policy", ["skip", "raise"])
def test_an_all_bad_image_batch_is_refilled_not_yielded_empty(tmp_path, loader_policy) -> None:
    """Whichever skips (the loader, or only the decoder), no batch comes out empty."""
    bad = {6, 7, 8, 9, 10, 11}  # exactly the second batch of 6
    images = [b"not an image" if i in bad else jpeg_bytes(i, (24, 20)) for i in range(24)]
    table = pa.table({"id": np.arange(24), "image": pa.array(images, pa.binary())})
    pq.write_table(table, tmp_path / "bad.parquet", row_group_size=12)
    pipe = ImagePipeline(size=16, backend="pil", device="cpu", on_error="skip")
    loader = DataLoader(
        ParquetSource(str(tmp_path / "bad.parquet")),
        batch_size=6,
        decode=pipe,
        on_error=loader_policy,
    )
    got = list(loader)
    assert len(got) == len(loader) == 4
    assert all(batch["image"].shape[0] > 0 for batch in got)
    ids = [int(i) for batch in got for i in batch["id"]]
    assert not bad & set(ids)
    assert got[1]["id"].tolist() == [12, 13, 14, 15, 16, 17], "refilled from the samples after it"
    assert loader.stats()["skipped"] == len(bad)
