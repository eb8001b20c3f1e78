"""What an import swap must not change (issue 33, items 16-18 and 20): a Dataset's batched
``__getitems__``, the shuffle that ``torch.manual_seed`` moves, a fresh order per
``iter()``, and global generators left as torch leaves them for a Dataset that draws
nothing from them. Each runs against torch's DataLoader and iolib's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from tests.conformance.conftest import batches, reference


class Table(Dataset):
    """The contract of Hugging Face ``datasets.Dataset`` in torch format (not installed
    here): columns stored apart, ``__getitem__(int)`` gives one row as a dict of tensors,
    ``__getitems__(keys)`` slices every column once and splits the rows. ``via`` says
    which one made a row, so a batch shows what the loader called."""

    def __init__(self, n: int = 24) -> None:
        self.columns = {"x": np.arange(n, dtype=np.float32) * 0.5, "label": np.arange(n) % 3}

    def __len__(self) -> int:
        return len(self.columns["x"])

    def __getitem__(self, key: int) -> dict[str, torch.Tensor]:
        row = {name: torch.tensor(column[key]) for name, column in self.columns.items()}
        return {**row, "via": torch.tensor(0)}

    def __getitems__(self, keys: list[int]) -> list[dict[str, torch.Tensor]]:
        rows = np.asarray(keys, dtype=np.int64)
        batch = {name: torch.from_numpy(column[rows]) for name, column in self.columns.items()}
        return [
            {**{name: values[i] for name, values in batch.items()}, "via": torch.tensor(1)}
            for i in range(len(keys))
        ]


def _vias(got: list) -> set[int]:
    """The `via` values of every row of plain() batches (a list, or one value unbatched)."""
    values = [batch[1]["via"][3] for batch in got]
    return {v for value in values for v in (value if isinstance(value, list) else [value])}


class TableWithoutBatchedReads(Table):
    __getitems__ = None  # torch's fetcher tests the attribute's truth, not its presence


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [1, 5, 24])
def test_getitems_makes_each_batch_as_in_torch(Loader, workers: int, batch_size: int) -> None:
    kwargs = dict(batch_size=batch_size, num_workers=workers)
    got = batches(Loader(Table(), **kwargs))
    assert got == reference(Table(), **kwargs)
    assert _vias(got) == {1}, "every row came from __getitems__"


@pytest.mark.parametrize("workers", [0, 2])
def test_getitems_gets_a_samplers_keys_in_its_order(Loader, workers: int) -> None:
    order = [23, 0, 7, 7, 12, 3, 19]
    kwargs = dict(batch_size=3, sampler=order, num_workers=workers)
    assert batches(Loader(Table(), **kwargs)) == reference(Table(), **kwargs)


@pytest.mark.parametrize(
    ("dataset", "kwargs"),
    [(Table, dict(batch_size=None)), (TableWithoutBatchedReads, dict(batch_size=4))],
    ids=["unbatched", "getitems-None"],
)
def test_getitem_where_torch_calls_it(Loader, dataset: type, kwargs: dict) -> None:
    got = batches(Loader(dataset(), **kwargs))
    assert got == reference(dataset(), **kwargs)
    assert _vias(got) == {0}, "every row came from __getitem__"


def _first_order(Loader, seed: int) -> list[int]:
    torch.manual_seed(seed)
    loader = Loader(list(range(64)), batch_size=64, shuffle=True)
    return next(iter(loader)).tolist()


def test_torch_manual_seed_moves_the_shuffle(Loader) -> None:
    """A seed sweep (torch.manual_seed(args.seed)) trains each seed on its own order, and
    one seed on one order, run after run."""
    orders = {seed: _first_order(Loader, seed) for seed in (0, 1, 2)}
    assert len({tuple(order) for order in orders.values()}) == 3
    assert _first_order(Loader, 1) == orders[1]


def test_a_new_iter_after_a_partial_pass_gives_a_fresh_order(Loader) -> None:
    """A loop that takes a few batches per "epoch" and calls iter() again sees new samples
    each time, not the same first batches (issue: 20 of 100 samples over 5 epochs)."""
    torch.manual_seed(0)
    loader = Loader(list(range(100)), batch_size=4, shuffle=True)
    firsts, seen = [], set()
    for _ in range(5):
        iterator = iter(loader)
        taken = [next(iterator).tolist() for _ in range(5)]
        firsts.append(taken[0])
        seen.update(i for batch in taken for i in batch)
    assert len({tuple(first) for first in firsts}) == 5
    assert len(seen) > 40


class SeedProbe(Dataset):
    """Draws nothing from the global generators; reports what torch.initial_seed() says."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> int:
        return torch.initial_seed()


def test_a_dataset_that_draws_nothing_sees_the_generators_as_torch_leaves_them(Loader) -> None:
    """Inline, torch leaves the caller's generators alone: a Dataset that draws nothing
    sees the process's seed. Re-seeding it per sample changed that and cost 20-38x
    torch's time on cheap samples (issue 33, item 20)."""
    torch.manual_seed(1234)
    got = batches(Loader(SeedProbe(), batch_size=20))
    assert got == reference(SeedProbe(), batch_size=20)
    assert {value for batch in got for value in batch[3]} == {1234}
