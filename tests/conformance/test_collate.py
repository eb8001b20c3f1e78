"""Collation: what default_collate makes of dicts (nested, subclasses, OrderedDict),
tuples, namedtuples, numpy arrays, strings and numbers; what default_convert does with
batch_size=None; ragged tensors raising like torch; a user collate_fn."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from tests.conformance.conftest import batches, reference

Point = namedtuple("Point", ["x", "label"])


class Meta(dict):
    """A dict subclass: default_collate keeps the type."""


class Samples(Dataset):
    """Sample i made by `kind` (module level and picklable for process workers)."""

    def __init__(self, kind: str, n: int = 6) -> None:
        self.kind, self.n = kind, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        kind = self.kind
        if kind == "dict":
            return {"x": torch.full((2,), float(i)), "y": i, "name": f"s{i}"}
        if kind == "nested":
            return {"x": torch.tensor([i, -i]), "meta": {"w": i / 2, "tags": {"odd": i % 2}}}
        if kind == "ordered":
            return OrderedDict([("b", i), ("a", torch.tensor(i * 1.5))])
        if kind == "subclass":
            return Meta(id=i, score=np.float32(i) / 4)
        if kind == "tuple":
            return (torch.tensor([i]), i * 1.0, str(i))
        if kind == "namedtuple":
            return Point(x=torch.arange(3) + i, label=i % 3)
        if kind == "numpy":
            return np.full((2, 2), i, dtype=np.float64), np.int32(i), np.arange(i, i + 3)
        if kind == "strings":
            return f"sample-{i}"
        if kind == "numbers":
            return i, float(i) / 3, bool(i % 2)
        if kind == "ragged":
            return torch.zeros(i + 1)
        raise KeyError(kind)


KINDS = [
    "dict",
    "nested",
    "ordered",
    "subclass",
    "tuple",
    "namedtuple",
    "numpy",
    "strings",
    "numbers",
]


@pytest.mark.parametrize("kind", KINDS)
def test_default_collate_matches_torch(Loader, kind) -> None:
    got = batches(Loader(Samples(kind), batch_size=4))
    assert got == reference(Samples(kind), batch_size=4)


@pytest.mark.parametrize("kind", ["nested", "namedtuple", "numpy"])
def test_default_collate_in_workers_matches_torch(Loader, kind) -> None:
    got = batches(Loader(Samples(kind), batch_size=4, num_workers=2))
    assert got == reference(Samples(kind), batch_size=4)


def test_container_types_are_kept(Loader) -> None:
    ordered = next(iter(Loader(Samples("ordered"), batch_size=3)))
    assert type(ordered) is OrderedDict and list(ordered) == ["b", "a"]
    sub = next(iter(Loader(Samples("subclass"), batch_size=3)))
    assert type(sub) is Meta
    point = next(iter(Loader(Samples("namedtuple"), batch_size=3)))
    assert type(point) is Point and point.label.tolist() == [0, 1, 2]
    nested = next(iter(Loader(Samples("nested"), batch_size=3)))
    assert nested["meta"]["tags"]["odd"].tolist() == [0, 1, 0]
    assert nested["meta"]["w"].dtype == torch.float64


def each_batch(loader) -> list:
    """Each batch's outcome: its size, or the type of the exception it raised. Drains
    the iterator, so that torch's workers shut down at its end rather than in a later
    garbage collection (which waits seconds for them)."""
    seen, iterator = [], iter(loader)
    for _ in range(10):
        try:
            seen.append(len(next(iterator)))
        except StopIteration:
            break
        except Exception as exc:  # the type is what is compared
            seen.append(type(exc))
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ragged_tensors_raise_like_torch(Loader, num_workers) -> None:
    expected = each_batch(
        torch.utils.data.DataLoader(Samples("ragged"), batch_size=3, num_workers=num_workers)
    )
    assert expected == [RuntimeError, RuntimeError]  # stack() of unequal sizes, each batch
    assert each_batch(Loader(Samples("ragged"), batch_size=3, num_workers=num_workers)) == (
        expected
    )


@pytest.mark.parametrize(
    "kind", ["dict", "nested", "tuple", "namedtuple", "numpy", "strings", "numbers"]
)
def test_batch_size_none_uses_default_convert(Loader, kind) -> None:
    got = batches(Loader(Samples(kind), batch_size=None))
    assert got == reference(Samples(kind), batch_size=None)
    assert len(got) == 6


def test_batch_size_none_keeps_python_numbers(Loader) -> None:
    samples = list(Loader(Samples("numbers"), batch_size=None))
    expected = list(torch.utils.data.DataLoader(Samples("numbers"), batch_size=None))
    assert samples == expected
    assert [type(v) for v in samples[3]] == [int, float, bool]  # left alone by default_convert
    arrays = list(Loader(Samples("numpy"), batch_size=None))
    assert isinstance(arrays[2][0], torch.Tensor) and arrays[2][0].dtype == torch.float64


def keep_list(samples: list) -> list:
    return samples


def test_user_collate_fn_receives_the_list_of_samples(Loader) -> None:
    got = list(Loader(Samples("strings"), batch_size=4, collate_fn=keep_list))
    assert got == [["sample-0", "sample-1", "sample-2", "sample-3"], ["sample-4", "sample-5"]]
