"""IterableDataset: batched, unbatched, drop_last, inline and with two process workers
(each worker iterates the whole dataset unless it shards itself through
get_worker_info(): the same duplicates as torch), and len(loader)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, get_worker_info

from tests.conformance.conftest import batches, raised, reference


class Stream(IterableDataset):
    """Yields (i, i * 10) for i < n; no __len__."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for i in range(self.n):
            yield i, i * 10


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.n


class ShardedStream(SizedStream):
    """Shards itself by worker id (the pattern torch documents)."""

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield i, i * 10


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 3},
        {"batch_size": 3, "drop_last": True},
        {"batch_size": 1},
        {"batch_size": None},
        {"batch_size": 4, "collate_fn": list},
    ],
    ids=["batched", "drop_last", "batch1", "unbatched", "collate_fn"],
)
def test_inline_iteration_matches_torch(Loader, kwargs) -> None:
    got = batches(Loader(Stream(10), **kwargs))
    assert got == reference(Stream(10), **kwargs)


@pytest.mark.parametrize("drop_last", [False, True])
def test_two_workers_each_iterate_the_whole_dataset(Loader, drop_last) -> None:
    got = batches(Loader(Stream(7), batch_size=3, num_workers=2, drop_last=drop_last))
    expected = reference(Stream(7), batch_size=3, num_workers=2, drop_last=drop_last)
    assert len(expected) == (4 if drop_last else 6)  # every item twice: once per worker
    assert sorted(map(repr, got)) == sorted(map(repr, expected))


def test_two_workers_unbatched_duplicates_like_torch(Loader) -> None:
    got = list(Loader(Stream(5), batch_size=None, num_workers=2))
    expected = list(torch.utils.data.DataLoader(Stream(5), batch_size=None, num_workers=2))
    # default_convert makes each (i, 10 i) tuple a list
    assert sorted(map(tuple, expected)) == sorted([(i, i * 10) for i in range(5)] * 2)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_sharding_itself_yields_each_item_once(Loader, num_workers) -> None:
    loader = Loader(ShardedStream(11), batch_size=2, num_workers=num_workers)
    got = batches(loader)
    ids = sorted(i for b in got for i in b[1][0][3])
    assert ids == list(range(11))
    expected = reference(ShardedStream(11), batch_size=2, num_workers=num_workers)
    assert sorted(map(repr, got)) == sorted(map(repr, expected))


@pytest.mark.parametrize(
    ("batch_size", "drop_last"), [(1, False), (3, False), (3, True), (None, False)]
)
def test_len_from_the_dataset_len(Loader, batch_size, drop_last) -> None:
    loader = Loader(SizedStream(10), batch_size=batch_size, drop_last=drop_last)
    expected = (
        10
        if batch_size is None
        else (10 // batch_size if drop_last else math.ceil(10 / batch_size))
    )
    assert len(loader) == expected
    assert len(loader) == len(
        torch.utils.data.DataLoader(SizedStream(10), batch_size=batch_size, drop_last=drop_last)
    )


def test_len_without_dataset_len_raises_like_torch(Loader) -> None:
    expected = raised(lambda: len(torch.utils.data.DataLoader(Stream(4), batch_size=2)))
    assert expected is TypeError
    assert raised(lambda: len(Loader(Stream(4), batch_size=2))) is expected


def test_iterable_attributes(Loader) -> None:
    loader = Loader(SizedStream(6), batch_size=2)
    assert loader.dataset.n == 6
    assert loader.batch_size == 2
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.batch_size == 2
    assert loader.sampler is not None
    assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
