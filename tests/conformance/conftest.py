"""Shared fixtures of the conformance suite: every behaviour runs against torch's
DataLoader and iolib's (``Loader`` ids ``torch`` and ``iolib``), and the assertions say
that iolib agrees with torch: same batches, exception types and attribute values.

The tests are written from torch's documentation and source (torch/utils/data), not
copied from torch's test-suite. Each one passes with torch's DataLoader by construction.
"""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset


def iolib_loader() -> type:
    from iolib import DataLoader

    return DataLoader


@pytest.fixture(params=["torch", "iolib"])
def Loader(request) -> type:
    """The DataLoader class under test."""
    return TorchDataLoader if request.param == "torch" else iolib_loader()


@pytest.fixture(autouse=True)
def _collect_iterators():
    """Free each test's loader iterators when it ends. An exception re-raised by torch's
    iterator sits in a reference cycle (its frames hold it) that keeps the iterator and
    its worker processes alive until some later garbage collection; workers forked by a
    later test then inherit it, and its shutdown stalls that test for seconds."""
    yield
    gc.collect()


class Numbers(Dataset):
    """Sample i is (tensor(i), tensor(i * i)); picklable for process workers."""

    def __init__(self, n: int = 20) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(index), torch.tensor(index * index)


def plain(value: Any) -> Any:
    """A batch as plain Python data that keeps the types that matter: tensors become
    ('tensor', dtype, shape, values); containers keep their type name."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), tuple(value.shape), value.tolist())
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tolist())
    if isinstance(value, collections.abc.Mapping):
        return (type(value).__name__, {k: plain(v) for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return (type(value).__name__, tuple(plain(v) for v in value))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [plain(v) for v in value])
    return (type(value).__name__, value)


def batches(loader: Iterable[Any]) -> list[Any]:
    return [plain(b) for b in loader]


def reference(dataset: Any, **kwargs: Any) -> list[Any]:
    """torch's batches for the same arguments (the expected value)."""
    return batches(TorchDataLoader(dataset, **kwargs))


def raised(fn: Callable[[], Any]) -> type[BaseException] | None:
    """The type of the exception `fn` raises, None if it returns."""
    try:
        fn()
    except Exception as exc:  # the type is what is compared
        return type(exc)
    return None
