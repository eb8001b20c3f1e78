"""Any map-style torch Dataset as a source.

Why global seeding here: a torch Dataset's transforms usually draw from the global
``torch``/``numpy``/``random`` state. Where that state is private to the loader (inline,
or in a process worker), iolib seeds those generators from (seed, epoch, sample key)
before each ``dataset[key]``, so even such transforms give the same sample whatever
worker reads it. Inline, the caller's state is saved before a batch and restored after
it. Thread workers share the global state, so with ``worker_mode="thread"`` global-state
transforms are not deterministic: use ``transform(sample, rng)`` instead.

Seeding costs about 6-18 µs a sample for the three generators (torch's CPU generator
1 µs, numpy's legacy one 5 µs, ``random`` 12 µs): 20-38x torch's whole cost for a Dataset
whose sample is an int. So a batch is first read without seeding, between two checks of
the three generators' whole states against copies of them (compared in place, copied
again only where they differ: ~0.4 µs each, `global_state.sync` and `same`); if none
moved, no sample drew, and the batch is what per-sample seeding would have made. A
generator that moved is seeded per sample from then on in this reader (the inline
loader, or one process worker), and the batch is read again: a drawing Dataset has one
batch per worker and generator read twice. The generators no sample drew from stay
watched, never seeded. torch.manual_seed would add 70 µs a sample (it also seeds every
accelerator), so it is not used per sample.

A Dataset with ``__getitems__`` (Hugging Face ``datasets``, or any batched Dataset) is
read with one ``__getitems__(keys)`` call per batch, as torch's fetcher does.
"""

from __future__ import annotations

import hashlib
import operator
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from iolib.errors import ConfigError, tag_sample
from iolib.sources import global_state
from iolib.sources.base import Source
from iolib.sources.global_state import GENERATORS

_MASK64 = (1 << 64) - 1


def global_seed(seed: int, epoch: int, key: Any) -> int:
    """A 63-bit seed for one sample's global generators: splitmix64 over (seed, epoch,
    key); a key that is not an integer (a dict-backed dataset's string) by its CRC."""
    index = key if isinstance(key, (int, np.integer)) else zlib.crc32(repr(key).encode())
    z = (int(seed) * 0x9E3779B97F4A7C15 + int(epoch) * 0xD1B54A32D192ED03 + int(index)) & _MASK64
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        z = ((z ^ (z >> shift)) * mult) & _MASK64
    return (z ^ (z >> 31)) >> 1


def _states(names: Any) -> dict[str, Any]:
    return {name: GENERATORS[name].get() for name in names}


def _moved(before: dict[str, Any]) -> set[str]:
    """The generators whose state is no longer `before`'s: a sample drew from them."""
    moved = set()
    for name, state in before.items():  # a loop, not a comprehension: read per batch
        if GENERATORS[name].get() != state:
            moved.add(name)
    return moved


_TORCH_INITIAL_SEED = (torch.initial_seed, torch.random.initial_seed)
_watch = threading.local()  # .notes: where this thread's seeded read notes a call
_watch_lock = threading.Lock()
_watchers = 0  # seeded reads in progress, over all threads


def _watched_initial_seed() -> int:
    notes = getattr(_watch, "notes", None)
    if notes is not None:
        notes.add("initial_seed")
    return _TORCH_INITIAL_SEED[1]()


@contextmanager
def watch_initial_seed(notes: set[str]) -> Iterator[None]:
    """Note a call of torch.initial_seed() while samples are seeded one by one: it then
    returns the sample's seed, where torch's loader returns the worker's (a difference
    by design that the loader warns about once). torch's function is replaced only while
    some thread reads seeded samples; other threads' calls pass through unnoted."""
    global _watchers
    with _watch_lock:
        if _watchers == 0:
            torch.initial_seed = torch.random.initial_seed = _watched_initial_seed
        _watchers += 1
    _watch.notes = notes
    try:
        yield
    finally:
        _watch.notes = None
        with _watch_lock:
            _watchers -= 1
            if _watchers == 0:
                torch.initial_seed, torch.random.initial_seed = _TORCH_INITIAL_SEED


def _put(states: dict[str, Any]) -> None:
    for name, state in states.items():
        GENERATORS[name].put(state)


def _seed_globals(seed: int, names: Any = GENERATORS) -> None:
    for name in names:
        GENERATORS[name].seed(seed)


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
        batched: bool = True,
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
        # torch's fetcher calls __getitems__ where it is defined and truthy, for batches only.
        self.getitems = batched and bool(getattr(dataset, "__getitems__", None))
        self.drawn: set[str] = set()  # generators samples drew from: seeded per sample
        self.notes: set[str] = set()  # differences from torch met while reading
        self._saved: Any = None  # the caller's generator states (global_state.sync)

    def __len__(self) -> int:
        return len(self.dataset)

    def fingerprint(self) -> str:
        kind = type(self.dataset)
        text = f"{kind.__module__}.{kind.__qualname__}|{len(self.dataset)}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def fingerprint_fields(self) -> dict[str, str]:
        """What fingerprint() hashes, by name (a refused resume names what differs)."""
        kind = type(self.dataset)
        return {"dataset type": f"{kind.__module__}.{kind.__qualname__}", "len": str(len(self))}

    def describe(self) -> str:
        return f"{type(self.dataset).__name__} (map-style Dataset)"

    def read(self, indices: Any, *, epoch: int = 0, batch: int | None = None) -> list[Any]:
        keys = indices.tolist() if isinstance(indices, np.ndarray) else list(indices)
        if not self.seed_globals:
            return self._fetch(keys)
        if self.drawn:
            saved = _states(GENERATORS) if self.restore_globals else None
            return self._read_watching(keys, epoch, saved)
        # No sample drew yet: every generator is watched. The caller's states are kept
        # as copies, checked against the generators before the batch (copied again only
        # where they differ) and after it: the batch drew nothing where all still match.
        self._saved = saved = global_state.sync(self._saved)
        try:
            data = self._fetch(keys)
        except BaseException:
            if self.restore_globals:  # a sample that raised may have drawn from any of them
                _put(global_state.states(saved))
            raise
        if global_state.same(saved):
            return data
        before = global_state.states(saved)
        now = _states(GENERATORS)
        moved = {name for name in GENERATORS if now[name] != before[name]}
        if not moved:  # bytes that hold no state changed (torch's padding)
            return data
        self.drawn |= moved
        return self._read_watching(keys, epoch, before if self.restore_globals else None)

    # Which batch of the plan it is changes nothing here: read at once (a call less).
    read_batch = read  # type: ignore[assignment]

    def _read_watching(self, keys: list[Any], epoch: int, saved: dict[str, Any] | None) -> Any:
        """The batch read with the generators samples drew from seeded per sample, the
        others watched; `saved`: the caller's states, given back after it (inline)."""
        watched = [n for n in GENERATORS if n not in self.drawn]
        try:
            while True:
                # Seed per sample the generators samples were seen drawing from; watch
                # the others. One that moved joins them and the batch is read again.
                before = _states(watched) if saved is None else {n: saved[n] for n in watched}
                data = self._read_seeded(keys, epoch)
                moved = _moved(before)
                if not moved:
                    break
                self.drawn |= moved
                watched = [n for n in watched if n not in moved]
        except BaseException:
            if saved is not None:  # a sample that raised may have drawn from any of them
                _put(saved)
            raise
        if saved is not None:
            _put({name: saved[name] for name in self.drawn})
        return data

    def take_notes(self) -> list[str]:
        """Differences from torch met since the last call (see watch_initial_seed)."""
        if not self.notes:
            return []
        notes, self.notes = sorted(self.notes), set()
        return notes

    def _read_seeded(self, keys: list[Any], epoch: int) -> list[Any]:
        drawn = [name for name in GENERATORS if name in self.drawn]
        watch = watch_initial_seed(self.notes) if "torch" in drawn else nullcontext()
        with watch:
            return [self._seeded(key, epoch, drawn) for key in keys]

    def _fetch(self, keys: list[Any]) -> Any:
        if self.getitems:
            return self.dataset.__getitems__(keys)
        # One comprehension, as torch's fetcher: no call per sample but the Dataset's (a
        # Dataset of cheap samples paid ~0.4 µs each). The iterator says where it failed.
        dataset, remaining = self.dataset, iter(keys)
        try:
            return [dataset[key] for key in remaining]
        except Exception as exc:
            tag_sample(exc, keys[len(keys) - operator.length_hint(remaining) - 1])
            raise

    def _seeded(self, key: Any, epoch: int, drawn: list[str]) -> Any:
        _seed_globals(global_seed(self.seed, epoch, key), drawn)
        return self._get(key)  # one sample: __getitem__, as __getitems__ promises to match

    def _get(self, key: Any) -> Any:
        try:
            return self.dataset[key]
        except Exception as exc:
            tag_sample(exc, key)
            raise


def as_source(dataset: Any, **options: Any) -> Source:
    """An iolib source as is; a torch Dataset wrapped (`options` go to the wrapper)."""
    return dataset if isinstance(dataset, Source) else TorchDatasetSource(dataset, **options)
