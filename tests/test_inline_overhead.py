"""The inline loader's per-batch work: counted in Python calls (not timed), and the
figures recorded in blocks still exact at any moment."""

from __future__ import annotations

import cProfile
import pstats

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

from iolib import DataLoader


class Ints(Dataset):
    """A Dataset of cheap samples: where the loader's own work shows."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index * 3


def _calls_per_batch(loader: object, batches: int) -> float:
    list(loader)  # warm-up: imports, the plan's first lookups
    profile = cProfile.Profile()
    profile.enable()
    for _ in loader:
        pass
    profile.disable()
    return sum(row[1] for row in pstats.Stats(profile).stats.values()) / batches


def test_an_inline_batch_costs_few_python_calls_beyond_torchs() -> None:
    """Torch's DataLoader makes ~100 Python calls a batch of 32 ints (32 of them the
    Dataset's, 10 its profiler annotation's); iolib's, with its RNG watch (one call
    before the batch, one after), telemetry and plan, at most 8 more (~98 here)."""
    batches = 200
    dataset = Ints(32 * batches)
    torch_calls = _calls_per_batch(TorchDataLoader(dataset, batch_size=32, shuffle=True), batches)
    ours = _calls_per_batch(DataLoader(dataset, batch_size=32, shuffle=True, seed=0), batches)
    assert ours <= torch_calls + 8, (ours, torch_calls)


def test_figures_recorded_in_blocks_are_exact_whenever_read() -> None:
    """Mid-block and across epochs: every batch, sample and step is counted once."""
    loader = DataLoader(Ints(32 * 100 + 5), batch_size=32, shuffle=True, seed=0)
    iterator = iter(loader)
    for _ in range(70):  # a window (64) folded, 6 batches pending
        next(iterator)
    stats = loader.stats()
    assert (stats["batches"], stats["samples"]) == (70, 70 * 32)
    assert stats["first_batch_s"] is not None and stats["peak_bytes_in_flight"] == 32 * 8
    assert set(stats["stage_ms"]) == {"read", "collate"}
    assert set(stats["stage_cpu_ms"]) == {"read", "collate"}  # measured on a sample
    for _ in iterator:
        pass
    for _ in loader:  # a second epoch: the gap between them is no step
        pass
    stats = loader.stats()
    assert (stats["batches"], stats["samples"]) == (202, 2 * (32 * 100 + 5))
    steps = loader._feed.runner.telemetry.steps
    assert len(steps) == 64 and min(steps) >= 0.0


def test_the_rng_watch_still_seeds_a_dataset_that_draws_inline() -> None:
    """The cheaper watch still sees a draw: batches equal whatever the caller's state."""

    class Draws(Ints):
        def __getitem__(self, index: int) -> float:
            return float(torch.rand(())) + index

    def epoch(caller_seed: int) -> list[torch.Tensor]:
        torch.manual_seed(caller_seed)
        return list(DataLoader(Draws(64), batch_size=8, shuffle=True, seed=0))

    first, second = epoch(1), epoch(2)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
