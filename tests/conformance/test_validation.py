"""Argument validation: the combinations torch refuses raise ValueError (a subclass is
fine: ``except ValueError:`` still catches it), and the truthy/falsy values torch accepts
are accepted with the same meaning."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler

from tests.conformance.conftest import Numbers, batches, raised, reference


class Stream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(6))


def batch_sampler() -> BatchSampler:
    return BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False)


MAP_STYLE_ERRORS = {
    "prefetch_factor_without_workers": {"prefetch_factor": 2},
    "persistent_workers_without_workers": {"persistent_workers": True},
    "negative_num_workers": {"num_workers": -1},
    "negative_timeout": {"timeout": -1},
    "shuffle_with_sampler": {"shuffle": True, "sampler": SequentialSampler(range(10))},
    "batch_sampler_with_batch_size": {"batch_sampler": batch_sampler(), "batch_size": 3},
    "batch_sampler_with_shuffle": {"batch_sampler": batch_sampler(), "shuffle": True},
    "batch_sampler_with_sampler": {
        "batch_sampler": batch_sampler(),
        "sampler": SequentialSampler(range(10)),
    },
    "batch_sampler_with_drop_last": {"batch_sampler": batch_sampler(), "drop_last": True},
    "unbatched_with_drop_last": {"batch_size": None, "drop_last": True},
}

ITERABLE_ERRORS = {
    "iterable_with_shuffle": {"shuffle": True},
    "iterable_with_sampler": {"sampler": SequentialSampler(range(6))},
    "iterable_with_batch_sampler": {"batch_sampler": batch_sampler()},
}


@pytest.mark.parametrize("name", sorted(MAP_STYLE_ERRORS))
def test_refused_combinations_raise_value_error(Loader, name) -> None:
    kwargs = MAP_STYLE_ERRORS[name]
    assert raised(lambda: torch.utils.data.DataLoader(Numbers(10), **kwargs)) is ValueError
    with pytest.raises(ValueError):
        Loader(Numbers(10), **kwargs)


@pytest.mark.parametrize("name", sorted(ITERABLE_ERRORS))
def test_refused_iterable_combinations_raise_value_error(Loader, name) -> None:
    kwargs = ITERABLE_ERRORS[name]
    assert raised(lambda: torch.utils.data.DataLoader(Stream(), **kwargs)) is ValueError
    with pytest.raises(ValueError, match="IterableDataset"):
        Loader(Stream(), **kwargs)


@pytest.mark.parametrize("shuffle", [False, None, 0, np.bool_(False)], ids=repr)
def test_falsy_shuffle_accepted_with_a_sampler(Loader, shuffle) -> None:
    sampler = [3, 1, 2, 0]
    got = batches(Loader(Numbers(4), batch_size=2, sampler=sampler, shuffle=shuffle))
    assert got == reference(Numbers(4), batch_size=2, sampler=sampler, shuffle=shuffle)


@pytest.mark.parametrize("shuffle", [True, 1, np.bool_(True)], ids=repr)
def test_truthy_shuffle_accepted(Loader, shuffle) -> None:
    loader = Loader(Numbers(12), batch_size=5, shuffle=shuffle)
    ids = [i for x, _ in loader for i in x.tolist()]
    assert sorted(ids) == list(range(12))
    assert len(loader) == 3


@pytest.mark.parametrize("drop_last", [1, np.bool_(True)], ids=repr)
def test_non_bool_drop_last_treated_as_torch_does(Loader, drop_last) -> None:
    """torch 2.13 refuses a drop_last that is not a bool (BatchSampler checks it:
    "drop_last should be a boolean value"), so a script cannot rely on drop_last=1;
    the loaders must agree on that, and on drop_last=True."""
    expected = raised(
        lambda: torch.utils.data.DataLoader(Numbers(11), batch_size=4, drop_last=drop_last)
    )
    assert expected is ValueError
    with pytest.raises(ValueError):
        Loader(Numbers(11), batch_size=4, drop_last=drop_last)
    got = batches(Loader(Numbers(11), batch_size=4, drop_last=bool(drop_last)))
    assert got == reference(Numbers(11), batch_size=4, drop_last=True)
    assert len(got) == 2


@pytest.mark.parametrize("shuffle", [False, None])
def test_iterable_accepts_unset_shuffle(Loader, shuffle) -> None:
    assert [b.tolist() for b in Loader(Stream(), batch_size=4, shuffle=shuffle)] == [
        [0, 1, 2, 3],
        [4, 5],
    ]


def test_valid_edge_values_accepted(Loader) -> None:
    loader = Loader(Numbers(6), batch_size=6, num_workers=0, timeout=0, prefetch_factor=None)
    assert batches(loader) == reference(Numbers(6), batch_size=6)
