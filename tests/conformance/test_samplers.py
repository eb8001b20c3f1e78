"""Samplers: the loader draws exactly the user's sampler (it never calls its set_epoch),
keys need not be integers, an endless sampler is consumed lazily, batch samplers yield
lists, a generator seeds the shuffle, DistributedSampler shards as in torch."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    Dataset,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from tests.conformance.conftest import Numbers, batches, reference


class EpochSampler(Sampler[int]):
    """A permutation drawn from the epoch the user set (like DistributedSampler)."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(1000 + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def test_user_set_epoch_is_never_overridden(Loader) -> None:
    sampler = EpochSampler(20)
    sampler.set_epoch(5)
    loader = Loader(Numbers(20), batch_size=4, sampler=sampler)
    first, second = batches(loader), batches(loader)
    assert sampler.epoch == 5
    expected_sampler = EpochSampler(20)
    expected_sampler.set_epoch(5)
    expected = reference(Numbers(20), batch_size=4, sampler=expected_sampler)
    epoch5 = torch.randperm(20, generator=torch.Generator().manual_seed(1005)).tolist()
    assert [i for b in expected for i in b[1][0][3]] == epoch5
    assert first == expected
    assert second == expected  # torch does not advance the sampler's epoch either


def test_distributed_sampler_epoch_set_by_the_script(Loader) -> None:
    def sampler() -> DistributedSampler:
        s = DistributedSampler(Numbers(21), num_replicas=1, rank=0, shuffle=True, seed=0)
        s.set_epoch(5)
        return s

    got = batches(Loader(Numbers(21), batch_size=4, sampler=sampler()))
    assert got == reference(Numbers(21), batch_size=4, sampler=sampler())


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("rank", [0, 1])
def test_distributed_sampler_explicit_ranks_match_torch(Loader, rank, num_workers) -> None:
    for epoch in (0, 1, 2):
        runs = []
        for _ in range(2):
            sampler = DistributedSampler(
                Numbers(23), num_replicas=2, rank=rank, shuffle=True, seed=0
            )
            sampler.set_epoch(epoch)
            runs.append(sampler)
        got = batches(Loader(Numbers(23), batch_size=3, sampler=runs[0], num_workers=num_workers))
        assert got == reference(Numbers(23), batch_size=3, sampler=runs[1])


class KeyedDataset(Dataset):
    """Keys that are not integers: strings into a dict, or (row, column) tuples."""

    def __init__(self) -> None:
        self.table = {
            name: torch.tensor([ord(name[0]), len(name)])
            for name in ("apple", "kiwi", "banana", "fig", "cherry")
        }

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            row, column = key
            return torch.tensor(row * 10 + column)
        return self.table[key]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sampler_with_string_keys(Loader, num_workers) -> None:
    keys = ["kiwi", "fig", "apple", "cherry", "banana"]
    got = batches(Loader(KeyedDataset(), batch_size=2, sampler=keys, num_workers=num_workers))
    assert got == reference(KeyedDataset(), batch_size=2, sampler=keys)
    assert len(got) == 3


def test_sampler_with_tuple_keys(Loader) -> None:
    keys = [(2, 1), (0, 3), (1, 1), (4, 0)]
    got = batches(Loader(KeyedDataset(), batch_size=3, sampler=keys))
    assert got == reference(KeyedDataset(), batch_size=3, sampler=keys)
    assert got[0][3] == [21, 3, 11]


class EndlessSampler(Sampler[int]):
    """Yields 0, 1, 2, ... for ever (no __len__). The guard turns an eager loader's
    endless read into an error instead of exhausting memory; a lazy loader (torch's)
    draws only what it prefetches, far below the guard."""

    GUARD = 100_000

    def __init__(self) -> None:
        self.drawn = 0

    def __iter__(self) -> Iterator[int]:
        index = 0
        while True:
            if index >= self.GUARD:
                raise RuntimeError("the sampler was consumed eagerly (100,000 draws)")
            self.drawn = index + 1
            yield index
            index += 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_endless_sampler_is_consumed_lazily(Loader, num_workers) -> None:
    sampler = EndlessSampler()
    loader = Loader(Numbers(10**9), batch_size=4, sampler=sampler, num_workers=num_workers)
    start = time.monotonic()
    iterator = iter(loader)
    first = next(iterator)
    assert time.monotonic() - start < 20, "next(iter(loader)) must return promptly"
    assert first[0].tolist() == [0, 1, 2, 3]
    assert next(iterator)[0].tolist() == [4, 5, 6, 7]
    if num_workers == 0:
        assert sampler.drawn == 8  # torch draws one batch of indices per batch
    del iterator


class ListBatches(Sampler[list[int]]):
    """A batch sampler that yields lists of uneven sizes, from a generator."""

    def __iter__(self) -> Iterator[list[int]]:
        yield [3, 1]
        yield [0, 2, 4]
        yield [9]
        yield [5, 6, 7, 8]

    def __len__(self) -> int:
        return 4


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_sampler_yielding_lists(Loader, num_workers) -> None:
    got = batches(Loader(Numbers(10), batch_sampler=ListBatches(), num_workers=num_workers))
    assert got == reference(Numbers(10), batch_sampler=ListBatches())
    assert [b[1][0][3] for b in got] == [[3, 1], [0, 2, 4], [9], [5, 6, 7, 8]]


def test_batch_sampler_over_a_seeded_random_sampler(Loader) -> None:
    def make() -> BatchSampler:
        generator = torch.Generator().manual_seed(7)
        return BatchSampler(RandomSampler(range(17), generator=generator), 5, drop_last=False)

    assert batches(Loader(Numbers(17), batch_sampler=make())) == reference(
        Numbers(17), batch_sampler=make()
    )


def test_sampler_draws_anew_each_pass(Loader) -> None:
    """A RandomSampler with its own generator gives a new order on each pass, in torch;
    the loader must not cache the first pass's order."""
    sampler = RandomSampler(range(16), generator=torch.Generator().manual_seed(3))
    loader = Loader(Numbers(16), batch_size=4, sampler=sampler)
    twin = RandomSampler(range(16), generator=torch.Generator().manual_seed(3))
    expected = reference(Numbers(16), batch_size=4, sampler=twin)
    expected_second = reference(Numbers(16), batch_size=4, sampler=twin)
    assert batches(loader) == expected
    assert batches(loader) == expected_second != expected


def test_plain_list_and_sequential_sampler(Loader) -> None:
    for sampler in ([4, 2, 0, 1, 3], SequentialSampler(range(5))):
        got = batches(Loader(Numbers(5), batch_size=2, sampler=sampler))
        assert got == reference(Numbers(5), batch_size=2, sampler=sampler)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_generator_shuffle_is_a_permutation_each_epoch(Loader, num_workers) -> None:
    loader = Loader(
        Numbers(23),
        batch_size=5,
        shuffle=True,
        num_workers=num_workers,
        generator=torch.Generator().manual_seed(0),
    )
    orders = []
    for _ in range(2):
        epoch = [b[0].tolist() for b in loader]
        assert [len(b) for b in epoch] == [5, 5, 5, 5, 3]
        flat = [i for b in epoch for i in b]
        assert sorted(flat) == list(range(23))
        orders.append(flat)
    assert orders[0] != list(range(23))  # shuffled at all
    if Loader is torch.utils.data.DataLoader:
        assert orders[0] != orders[1]
