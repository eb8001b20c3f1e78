"""The global generators around an iolib loader: the draws torch's DataLoader takes per
iter() are taken too (a script's later draws match torch's), and the inline loader's
fast snapshots of torch's, numpy's and random's states restore them exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
from torch.utils.data import DataLoader as TorchDataLoader

import iolib
from iolib.sources import global_state
from iolib.sources.global_state import GENERATORS

DATA = list(range(20))
CASES = {
    "shuffle": {"shuffle": True},
    "no shuffle": {"shuffle": False},
    "workers": {"shuffle": True, "num_workers": 2},
    "persistent": {"shuffle": True, "num_workers": 2, "persistent_workers": True},
    "generator": {"shuffle": True, "generator": lambda: torch.Generator().manual_seed(1)},
    "sampler": {"sampler": lambda: RandomSampler(DATA)},
    "batch sampler": {"batch_sampler": lambda: BatchSampler(SequentialSampler(DATA), 4, False),
                      "batch_size": 1},
}  # fmt: skip


def _script(kind: type, options: dict) -> list[float]:
    """A training script's shape: seed, build the loader, two epochs with a draw per
    step (dropout), then a draw after the loop."""
    torch.manual_seed(5)
    built = {k: v() if callable(v) else v for k, v in options.items()}
    loader = kind(DATA, **{"batch_size": 4, **built})
    draws = []
    for _ in range(2):
        for _ in loader:
            draws.append(torch.rand(()).item())
    draws.append(torch.rand(()).item())
    return draws


@pytest.mark.parametrize("case", list(CASES))
def test_the_scripts_draws_after_each_epoch_match_torchs(case) -> None:
    assert _script(iolib.DataLoader, CASES[case]) == _script(TorchDataLoader, CASES[case])


def test_the_order_does_not_follow_the_draws() -> None:
    """The draws are taken, not used: the order is `seed`'s, as before."""
    a = [b.tolist() for b in iolib.DataLoader(DATA, batch_size=4, shuffle=True, seed=3)]
    torch.rand(100)
    b = [b.tolist() for b in iolib.DataLoader(DATA, batch_size=4, shuffle=True, seed=3)]
    assert a == b


@pytest.mark.parametrize("name", ["torch", "numpy", "random"])
def test_snapshots_give_each_generator_back_exactly(name) -> None:
    """Gaussian caches included (numpy's legacy has_gauss, random's gauss_next)."""
    draw = {
        "torch": lambda: torch.randn(3).tolist(),
        "numpy": lambda: np.random.standard_normal(3).tolist(),
        "random": lambda: [random.gauss(0, 1) for _ in range(3)],
    }[name]
    np.random.standard_normal(1), random.gauss(0, 1)  # leave one Gaussian cached
    generator = GENERATORS[name]
    saved = generator.get()
    first = draw()
    assert generator.get() != saved
    generator.put(saved)
    assert generator.get() == saved and draw() == first


@pytest.mark.parametrize("name", ["numpy", "random"])
def test_the_public_fallback_compares_and_restores(name, monkeypatch) -> None:
    """Where the layout does not match (or IOLIB_RNG_SNAPSHOT=public), states from the
    public functions compare with == (numpy's key is an array) and restore exactly."""
    monkeypatch.setenv("IOLIB_RNG_SNAPSHOT", "public")
    generator = getattr(global_state, f"_{name}")()
    draw = {"numpy": lambda: np.random.rand(3).tolist(), "random": lambda: random.random()}[name]
    saved = generator.get()
    assert generator.get() == saved
    first = draw()
    assert generator.get() != saved
    generator.put(saved)
    assert generator.get() == saved and draw() == first


@pytest.mark.skipif(global_state._public_only(), reason="IOLIB_RNG_SNAPSHOT=public")
def test_this_platform_takes_the_fast_snapshots() -> None:
    """numpy's and random's states are read as bytes here (CPython, numpy's MT19937):
    falling back to their public functions costs ~0.2 ms a batch inline."""
    assert GENERATORS["numpy"].get.__qualname__.startswith("_numpy.")
    assert GENERATORS["random"].get.__qualname__.startswith("_random.")


class Drawing(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> float:
        return index + random.random() + float(np.random.rand()) + float(torch.rand(()))


def test_inline_the_callers_generators_are_given_back_after_each_batch() -> None:
    """A Dataset drawing from all three: batches are the same on every run, and the
    script's own streams are as if the loader had drawn only what torch's takes."""
    runs = []
    for _ in range(2):
        random.seed(1), np.random.seed(1), torch.manual_seed(1)
        batches = [b.tolist() for b in iolib.DataLoader(Drawing(), batch_size=4, seed=2)]
        runs.append((batches, random.random(), float(np.random.rand())))
    assert runs[0] == runs[1]
    random.seed(1), np.random.seed(1)
    assert runs[0][1:] == (random.random(), float(np.random.rand()))
