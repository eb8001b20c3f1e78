"""The keyed bijection behind every shuffle: a permutation for any size, uniform enough
to stand in for a drawn one, and computed per position at 10^9 samples."""

from __future__ import annotations

import tracemalloc

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from iolib.plan import EpochOrder, RankSchedule
from iolib.plan.permute import feistel, round_keys


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**32), tweak=st.integers(0, 10**6))
def test_feistel_is_a_bijection_for_any_size(n: int, seed: int, tweak: int) -> None:
    image = feistel(np.arange(n), n, round_keys(seed), tweak)
    assert np.array_equal(np.sort(image), np.arange(n))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=12), seed=st.integers(0, 99))
def test_per_element_domains_permute_each_window(sizes: list[int], seed: int) -> None:
    """One call, many windows of different sizes: each window is permuted on its own."""
    x = np.concatenate([np.arange(s) for s in sizes])
    n = np.repeat(sizes, sizes)
    w = np.repeat(np.arange(len(sizes)), sizes)
    image = feistel(x, n, round_keys(seed), w)
    for window, size in enumerate(sizes):
        assert np.array_equal(np.sort(image[w == window]), np.arange(size))


def test_positions_are_uniform_across_keys() -> None:
    """Where sample 0 lands, over 3,000 keys, spreads over all 50 positions like a drawn
    permutation (chi-square well below the 0.1 % critical value, 86.7 for 49 dof), and
    neighbours are in either order half of the time."""
    n, keys = 50, 3000
    landing = np.zeros(n, dtype=np.int64)
    ascending = 0
    for seed in range(keys):
        order = np.asarray(EpochOrder(n, seed=seed, epoch=0, shuffle="global"))
        landing[int(np.flatnonzero(order == 0)[0])] += 1
        ascending += int(np.sum(np.diff(order) > 0))
    expected = keys / n
    chi2 = float(((landing - expected) ** 2 / expected).sum())
    assert chi2 < 86.7, landing
    assert abs(ascending / (keys * (n - 1)) - 0.5) < 0.02


def test_epochs_and_seeds_give_different_orders() -> None:
    base = np.asarray(EpochOrder(1000, seed=1, epoch=0, shuffle="global"))
    for other in ({"seed": 1, "epoch": 1}, {"seed": 2, "epoch": 0}):
        order = np.asarray(EpochOrder(1000, shuffle="global", **other))
        assert np.mean(order == base) < 0.02


def test_a_billion_sample_plan_is_computed_not_stored() -> None:
    """Rank slices of a 10^9-sample epoch at world sizes 1 and 64, spot-checked: each
    rank's batches are distinct samples, disjoint across ranks, and cost kilobytes."""
    n, batch = 10**9, 32
    tracemalloc.start()
    for shuffle in ("global", "block"):
        blocks = np.full(n // 100_000, 100_000) if shuffle == "block" else ()
        order = EpochOrder(n, seed=5, epoch=3, shuffle=shuffle, blocks=blocks)
        for world in (1, 64):
            for k in (0, 1, 12_345, n // (batch * world) - 1):
                taken = [
                    order[RankSchedule(n, 0, batch, world, r).positions(k)] for r in range(world)
                ]
                flat = np.concatenate(taken)
                assert flat.size == batch * world == np.unique(flat).size
                assert flat.min() >= 0 and flat.max() < n
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 50 * 2**20, f"plan memory peaked at {peak / 2**20:.0f} MiB"


def test_block_windows_stay_local_at_scale() -> None:
    """A window of 8 blocks: its samples come from those 8 blocks only."""
    n, rows = 10**9, 125_000
    order = EpochOrder(n, seed=0, epoch=0, shuffle="block", blocks=np.full(n // rows, rows))
    first_window = order[np.arange(0, 8 * rows, 997)]
    assert np.unique(first_window // rows).size == 8
