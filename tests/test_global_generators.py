"""The global generators around an iolib loader: the draws torch's DataLoader takes per
iter() are taken too (a script's later draws match torch's), and the inline loader's
fast snapshots of torch's, numpy's and random's states restore them exactly."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

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


# -- the one-call watch (issue 45, item 20): what it must see, and what it gives back ----

WORDS = 78  # 32-bit words a sample draws: a batch of 8 draws 624, one Mersenne Twister round


def _draw_words(name: str) -> float:
    """WORDS words from the named generator (checked in the test below)."""
    if name == "torch":
        return float(torch.randint(0, 2**16, (WORDS,)).sum())
    if name == "numpy":
        return float(np.random.random_sample(WORDS // 2).sum())  # a double is two words
    return float(sum(random.getrandbits(32) for _ in range(WORDS)))


def _consume_cached_gaussian(name: str) -> float:
    """The Gaussian the generator holds from an earlier draw: no word drawn."""
    if name == "torch":
        return float(torch.randn((), dtype=torch.float64))
    if name == "numpy":
        return float(np.random.standard_normal())
    return random.gauss(0, 1)


def _leave_a_gaussian_cached(name: str) -> None:
    if name == "torch":
        torch.randn(3)
    elif name == "numpy":
        np.random.standard_normal()
    else:
        random.gauss(0, 1)


class _Cheap(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> float:
        return float(index)


class _RoundOf624(_Cheap):
    """Each batch of 8 draws 624 words: the generator's position is where it was."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, index: int) -> float:
        return index + _draw_words(self.name)


class _CachedGaussianOnly(_Cheap):
    """Sample 0 takes the caller's cached Gaussian: batch 0 moves no word."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, index: int) -> float:
        return index + (_consume_cached_gaussian(self.name) if index == 0 else 0.0)


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed), np.random.seed(seed), random.seed(seed)


def _public_states() -> tuple:
    name, key, pos, has_gauss, gauss = np.random.get_state()
    numpy_state = (name, key.tobytes(), pos, has_gauss, gauss)
    return torch.get_rng_state().numpy().tobytes(), numpy_state, random.getstate()


def _epoch(dataset, caller_seed: int, *, cached: bool = False) -> tuple[list, tuple, set]:
    """Batches of an inline epoch, the caller's states after it, what the source saw drawn."""
    _seed_all(caller_seed)
    if cached:
        for name in GENERATORS:
            _leave_a_gaussian_cached(name)
    loader = iolib.DataLoader(dataset, batch_size=8, seed=4)
    batches = [b.tolist() for b in loader]
    return batches, _public_states(), loader._feed.source.drawn


@pytest.mark.parametrize("name", ["torch", "numpy", "random"])
def test_a_batch_of_624_words_is_seen_seeded_and_given_back(name) -> None:
    """A batch that draws a multiple of 624 words leaves the position where it was: it is
    seen all the same, seeded per sample (batches do not follow the caller's state), and
    the caller's state is given back bit for bit (as a Dataset that draws nothing)."""
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    before = GENERATORS[name].get()
    saved = global_state.sync(None)
    for _ in range(8):
        _draw_words(name)
    assert GENERATORS[name].get() != before and not global_state.same(saved)
    if name != "torch":  # the position index is where it was: one full round
        position = {
            "numpy": lambda: np.random.get_state()[2],
            "random": lambda: random.getstate()[1][-1],
        }
        assert position[name]() == 624
    first, states, drawn = _epoch(_RoundOf624(name), 1)
    second, _, _ = _epoch(_RoundOf624(name), 2)
    assert first == second and drawn == {name}
    _, untouched, _ = _epoch(_Cheap(), 1)
    assert states == untouched


@pytest.mark.parametrize("name", ["torch", "numpy", "random"])
def test_a_batch_that_only_takes_a_cached_gaussian_is_seen(name) -> None:
    """numpy's legacy has_gauss, random's gauss_next and torch's cached normal: taking one
    moves no word, and is seen: the sample is seeded, the cache given back."""
    first, states, drawn = _epoch(_CachedGaussianOnly(name), 1, cached=True)
    second, _, _ = _epoch(_CachedGaussianOnly(name), 2, cached=True)
    assert drawn == {name}
    assert first == second
    _, untouched, _ = _epoch(_Cheap(), 1, cached=True)
    assert states == untouched


class _TorchOnly(_Cheap):
    def __getitem__(self, index: int) -> float:
        return index + float(torch.rand(()))


def test_a_dataset_drawing_from_torch_only_gets_torch_seeded_only() -> None:
    first, states, drawn = _epoch(_TorchOnly(), 1)
    second, _, _ = _epoch(_TorchOnly(), 2)
    assert drawn == {"torch"} and first == second
    _, untouched, _ = _epoch(_Cheap(), 1)
    assert states == untouched


class _DrawsEverywhere(_Cheap):
    def __len__(self) -> int:
        return 48

    def __getitem__(self, index: int) -> float:
        name = ("torch", "numpy", "random")[index % 3]
        return index + _draw_words(name) + _consume_cached_gaussian(name)


def test_drawing_batches_are_the_same_inline_and_in_process_workers() -> None:
    def batches(**options) -> list:
        loader = iolib.DataLoader(_DrawsEverywhere(), batch_size=8, shuffle=True, seed=6,
                                  **options)  # fmt: skip
        return [b.tolist() for b in loader]

    _seed_all(1)
    inline = batches()
    _seed_all(2)
    assert batches(num_workers=2, worker_mode="process") == inline
    _seed_all(3)
    assert batches() == inline


@pytest.mark.skipif(global_state._public_only(), reason="IOLIB_RNG_SNAPSHOT=public")
def test_torchs_state_is_read_as_bytes_here() -> None:
    """torch's CPU generator located on a private one (its engine and normal caches);
    the bytes give get_state()'s state exactly, caches included."""
    generator = GENERATORS["torch"]
    assert generator.views is not None and generator.get.__qualname__.startswith("_torch.")
    torch.manual_seed(8)
    torch.randn(3)  # a double cached
    raw = bytes(generator.views[0])
    assert global_state._torch_public(raw) == torch.get_rng_state().numpy().tobytes()
    assert global_state._torch_layout(torch.Generator()) is not None


def test_with_public_snapshots_batches_and_states_are_the_same(tmp_path) -> None:
    """IOLIB_RNG_SNAPSHOT=public: every state through its public functions (none read as
    bytes), and the same batches and caller's states as here."""
    script = tmp_path / "public.py"
    script.write_text(
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import test_global_generators as t\n"
        "from iolib.sources import global_state\n"
        "assert all(g.views is None for g in global_state.GENERATORS.values())\n"
        "assert global_state.sync.__name__ == 'slow_sync'\n"
        "out = []\n"
        "for d in (t._RoundOf624('torch'), t._CachedGaussianOnly('numpy'), t._DrawsEverywhere()):\n"
        "    batches, states, drawn = t._epoch(d, 1, cached=True)\n"
        "    out.append([batches, repr(states), sorted(drawn)])\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "IOLIB_RNG_SNAPSHOT": "public"}
    run = subprocess.run([sys.executable, str(script), str(Path(__file__).parent)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    public = json.loads(run.stdout)
    here = []
    for dataset in (_RoundOf624("torch"), _CachedGaussianOnly("numpy"), _DrawsEverywhere()):
        batches, states, drawn = _epoch(dataset, 1, cached=True)
        here.append([batches, repr(states), sorted(drawn)])
    assert public == here


class _DrawsFromBatch2(_Cheap):
    """Batches 0 and 1 (of 8, in order) draw nothing; from batch 2 on, every sample draws
    from the three generators."""

    def __getitem__(self, index: int) -> float:
        if index < 16:
            return float(index)
        return index + float(torch.rand(())) + np.random.rand() + random.random()


def test_the_callers_draws_between_batches_are_kept() -> None:
    """The caller draws between batches (a training step's dropout): the states kept for
    the restore follow them, so the first batch that draws gives back the caller's state
    of that moment, not an older one."""

    def script(kind: type, dataset) -> tuple[list, list]:
        _seed_all(7)
        batches, draws = [], []
        for batch in kind(dataset, batch_size=8):
            batches.append(batch.tolist())
            draws.append((float(torch.rand(())), float(np.random.rand()), random.random()))
        return batches, draws

    _, expected = script(TorchDataLoader, _Cheap())  # torch's loader: no watch, no restore
    batches, draws = script(iolib.DataLoader, _DrawsFromBatch2())
    assert draws == expected
    assert batches[:2] == [[float(i) for i in range(8)], [float(i) for i in range(8, 16)]]
