"""Any map-style torch Dataset as a source.

Why global seeding here: a torch Dataset's transforms usually draw from the global
``torch``/``numpy``/``random`` state. Where that state is private to the loader (inline,
or in a process worker), iolib seeds those generators from (seed, epoch, sample key)
before each ``dataset[key]``, so even such transforms give the same sample whatever
worker reads it. Inline, the caller's state is saved before a batch and restored after
it. Thread workers share the global state, so with ``worker_mode="thread"`` global-state
transforms are not deterministic: use ``transform(sample, rng)`` instead.

Seeding costs about 6 µs a sample (torch's CPU generator, numpy's legacy generator and
``random``, from a 64-bit mix of the key): torch.manual_seed would add 70 µs (it also
seeds every accelerator), numpy's get/set_state 50 µs, so neither is used per sample.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from iolib.errors import ConfigError
from iolib.sources.base import Source

_MASK64 = (1 << 64) - 1


def global_seed(seed: int, epoch: int, key: Any) -> int:
    """A 63-bit seed for one sample's global generators: splitmix64 over (seed, epoch,
    key); a key that is not an integer (a dict-backed dataset's string) by its CRC."""
    index = key if isinstance(key, (int, np.integer)) else zlib.crc32(repr(key).encode())
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(epoch) * 0xD1B54A32D192ED03 + int(index)) & _MASK64
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ((z ^ (z >> shift)) * mult) & _MASK64
    return (z ^ (z >> 31)) >> 1


def _seed_globals(seed: int) -> None:
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    random.seed(seed)


@contextmanager
def saved_globals() -> Iterator[None]:
    """Restore torch's, numpy's and random's global state on exit."""
    saved = (torch.default_generator.get_state(), np.random.get_state(), random.getstate())
    try:
        yield
    finally:
        torch.default_generator.set_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


class TorchDatasetSource(Source):
    """Wraps a map-style ``torch.utils.data.Dataset`` (``__getitem__`` and ``__len__``).

    ``seed_globals``: seed the global generators per sample (the loader sets it where
    that state is private: inline and in process workers); ``restore_globals``: give the
    caller's state back after each batch (inline)."""

    def __init__(
        self,
        dataset: Any,
        *,
        seed: int = 0,
        seed_globals: bool = False,
        restore_globals: bool = False,
    ) -> None:
        if isinstance(dataset, IterableDataset):
            raise ConfigError(
                f"{type(dataset).__name__} is an IterableDataset: it has no indices to "
                "read. Pass it to iolib.DataLoader directly, which iterates it as torch does."
            )
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise ConfigError(
                f"`dataset` must be a map-style Dataset or an iolib source; "
                f"{type(dataset).__name__} lacks __getitem__ or __len__."
            )
        self.dataset = dataset
        self.seed, self.seed_globals, self.restore_globals = seed, seed_globals, restore_globals

    def __len__(self) -> int:
        return len(self.dataset)

    def fingerprint(self) -> str:
        kind = type(self.dataset)
        text = f"{kind.__module__}.{kind.__qualname__}|{len(self.dataset)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"{type(self.dataset).__name__} (map-style Dataset)"

    def read(self, indices: Any, *, epoch: int = 0) -> list[Any]:
        keys = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
        if not self.seed_globals:
            return [self._get(key) for key in keys]
        if not self.restore_globals:
            return [self._seeded(key, epoch) for key in keys]
        with saved_globals():
            return [self._seeded(key, epoch) for key in keys]

    def _seeded(self, key: Any, epoch: int) -> Any:
        _seed_globals(global_seed(self.seed, epoch, key))
        return self._get(key)

    def _get(self, key: Any) -> Any:
        try:
            return self.dataset[key]
        except Exception as exc:
            exc.iolib_sample = key  # type: ignore[attr-defined]  # names the culprit
            raise


def as_source(dataset: Any, **options: Any) -> Source:
    """An iolib source as is; a torch Dataset wrapped (`options` go to the wrapper)."""
    return dataset if isinstance(dataset, Source) else TorchDatasetSource(dataset, **options)
