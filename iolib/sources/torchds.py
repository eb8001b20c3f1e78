"""Any map-style torch Dataset as a source.

Why global seeding here: a torch Dataset's transforms usually draw from the global
``torch``/``numpy``/``random`` state. When iolib runs them inline or in a process
worker, it seeds those generators from ``rng.sample_seed(seed, epoch, index)`` before
each ``dataset[index]`` (and restores the caller's state afterwards), so even such
transforms are deterministic. Thread workers share the global state, so with
``worker_mode="thread"`` global-state transforms are not deterministic: use
``transform(sample, rng)`` instead.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from iolib.errors import ConfigError
from iolib.rng import sample_seed
from iolib.sources.base import Source


@contextmanager
def seeded_globals(seed: int) -> Iterator[None]:
    """Seed torch, numpy and random for one sample; restore the caller's state after."""
    saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


class TorchDatasetSource(Source):
    """Wraps a map-style ``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``)."""

    def __init__(self, dataset: Any) -> None:
        if isinstance(dataset, IterableDataset):
            raise ConfigError(
                f"iolib.DataLoader needs a map-style dataset; {type(dataset).__name__} is an "
                "IterableDataset, whose order iolib cannot plan or resume. Keep "
                "torch.utils.data.DataLoader for it, or give it __getitem__ and __len__."
            )
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ConfigError(
                f"`dataset` must be a map-style Dataset or an iolib source; "
                f"{type(dataset).__name__} lacks __getitem__ or __len__."
            )
        self.dataset = dataset
        self.seed_globals = False  # set by the loader where global state is private

    def __len__(self) -> int:
        return len(self.dataset)

    def fingerprint(self) -> str:
        kind = type(self.dataset)
        text = f"{kind.__module__}.{kind.__qualname__}|{len(self.dataset)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{type(self.dataset).__name__} (map-style Dataset)"

    def read(self, indices: np.ndarray, *, seed: int = 0, epoch: int = 0) -> list[Any]:
        samples = []
        for index in indices.tolist():
            try:
                if self.seed_globals:
                    with seeded_globals(sample_seed(seed, epoch, index)):
                        samples.append(self.dataset[index])
                else:
                    samples.append(self.dataset[index])
            except Exception as exc:
                exc.iolib_sample = index  # type: ignore[attr-defined]  # names the culprit
                raise
        return samples


def as_source(dataset: Any) -> Source:
    """An iolib source as is; a torch Dataset wrapped."""
    return dataset if isinstance(dataset, Source) else TorchDatasetSource(dataset)
