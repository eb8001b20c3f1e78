"""The plan is a pure integer function: exhaustive and property tests, golden values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from iolib.errors import ConfigError
from iolib.plan import EpochOrder, RankSchedule, batches_per_epoch, epoch_order
from iolib.plan.rng import sample_rng, sample_seed


def rank_positions(total: int, start: int, batch: int, world: int, drop_last: bool):
    schedules = [RankSchedule(total, start, batch, world, r, drop_last) for r in range(world)]
    return schedules, [[s.positions(k) for k in range(len(s))] for s in schedules]


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_slices_disjoint_complete_equal_counts(world: int, drop_last: bool) -> None:
    for total in (0, 1, 5, 23, 64, 97):
        for batch in (1, 3, 8):
            schedules, per_rank = rank_positions(total, 0, batch, world, drop_last)
            counts = {len(s) for s in schedules}
            assert len(counts) == 1, f"unequal batch counts {counts}"
            flat = np.concatenate([p for batches in per_rank for p in batches] or [[]])
            padded = schedules[0].padded
            unique = np.unique(flat)
            if drop_last:
                usable = total - total % (batch * world)
                assert len(flat) == len(unique) == usable
                assert set(unique.tolist()) == set(range(usable))
            else:
                assert set(unique.tolist()) == set(range(total)), "a sample was lost"
                assert len(flat) == total + padded, "a sample was repeated beyond padding"
                assert padded < world


def test_tail_split_worked_example() -> None:
    _schedules, per_rank = rank_positions(10, 0, 2, 2, False)
    assert [p.tolist() for p in per_rank[0]] == [[0, 1], [4, 5], [8]]
    assert [p.tolist() for p in per_rank[1]] == [[2, 3], [6, 7], [9]]
    assert batches_per_epoch(10, 2, 2) == 3


def test_padding_when_fewer_samples_than_ranks() -> None:
    schedules, per_rank = rank_positions(9, 0, 2, 4, False)
    last = [batches[-1].tolist() for batches in per_rank]
    assert last == [[8], [0], [1], [2]]
    assert schedules[0].padded == 3


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(0, 300),
    batch=st.integers(1, 16),
    world=st.integers(1, 8),
    new_world=st.integers(1, 8),
    cut=st.floats(0, 1),
    drop_last=st.booleans(),
)
# A state saved after the epoch's last step (cut=1.0): drawn only some runs otherwise.
@example(total=37, batch=4, world=3, new_world=2, cut=1.0, drop_last=False)
@example(total=37, batch=4, world=3, new_world=2, cut=1.0, drop_last=True)
def test_elastic_resume_exactly_once(total, batch, world, new_world, cut, drop_last) -> None:
    """Stop after k steps at world size W, resume at W': every sample exactly once."""
    schedule = RankSchedule(total, 0, batch, world, 0, drop_last)
    k = int(cut * len(schedule))
    before = [
        RankSchedule(total, 0, batch, world, r, drop_last).positions(i)
        for r in range(world)
        for i in range(k)
    ]
    position = schedule.position_after(k)
    after_schedules, after = rank_positions(total, position, batch, new_world, drop_last)
    seen = np.concatenate(before + [p for b in after for p in b] or [np.zeros(0, np.int64)])
    pads = after_schedules[0].padded if len(after_schedules[0]) else 0
    pads += schedule.padded if k == len(schedule) else 0
    values, counts = np.unique(seen, return_counts=True)
    if not drop_last:
        assert set(values.tolist()) == set(range(total))
    assert counts.sum() - len(values) == (pads if not drop_last else 0)


@pytest.mark.parametrize("mode", ["none", "global", "block"])
def test_epoch_order_is_a_permutation_and_pure(mode: str) -> None:
    blocks = (10, 7, 13, 20, 5)
    a = epoch_order(55, seed=3, epoch=2, shuffle=mode, blocks=blocks, window=2)
    b = epoch_order(55, seed=3, epoch=2, shuffle=mode, blocks=blocks, window=2)
    assert sorted(a.tolist()) == list(range(55))
    assert a.tolist() == b.tolist()
    if mode != "none":
        c = epoch_order(55, seed=3, epoch=3, shuffle=mode, blocks=blocks, window=2)
        assert a.tolist() != c.tolist(), "set_epoch must reshuffle"


def test_block_shuffle_keeps_windows_local() -> None:
    blocks = (10,) * 12
    order = epoch_order(120, seed=1, epoch=0, shuffle="block", blocks=blocks, window=3)
    for start in range(0, 120, 30):  # each window of 3 blocks covers 30 samples
        touched = {int(i) // 10 for i in order[start : start + 30]}
        assert len(touched) == 3


def test_golden_orders() -> None:
    """Pinned: an upgrade of numpy or of iolib must not silently change an order."""
    assert epoch_order(12, seed=0, epoch=0, shuffle="global").tolist() == GOLDEN_GLOBAL
    assert (
        epoch_order(12, seed=0, epoch=1, shuffle="block", blocks=(4, 4, 4), window=2).tolist()
        == GOLDEN_BLOCK
    )
    ends = np.array([0, 1, BILLION - 1])
    assert EpochOrder(BILLION, seed=0, epoch=0, shuffle="global")[ends].tolist() == (
        GOLDEN_BILLION_GLOBAL
    )
    blocks = np.full(8000, BILLION // 8000)
    block = EpochOrder(BILLION, seed=0, epoch=0, shuffle="block", blocks=blocks, window=8)
    assert block[ends].tolist() == GOLDEN_BILLION_BLOCK
    assert round(float(sample_rng(0, 0, 5).random()), 12) == GOLDEN_SAMPLE
    assert sample_seed(1, 2, 3) == GOLDEN_SEED


# Since 0.2 the shuffles are keyed bijections (iolib.plan.permute), not stored permutations:
# these values changed once, on purpose, with that release.
GOLDEN_GLOBAL = [2, 6, 10, 5, 7, 3, 8, 11, 4, 1, 9, 0]
GOLDEN_BLOCK = [6, 10, 11, 9, 8, 7, 4, 5, 3, 2, 0, 1]
BILLION = 10**9
GOLDEN_BILLION_GLOBAL = [208161241, 986525397, 502202351]
GOLDEN_BILLION_BLOCK = [146588911, 103691800, 633971855]
GOLDEN_SAMPLE = 0.366570820821
GOLDEN_SEED = 3414873798807541450


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        RankSchedule(10, 0, 0)
    with pytest.raises(ConfigError, match="rank"):
        RankSchedule(10, 0, 2, world_size=2, rank=2)
    with pytest.raises(ConfigError, match="Block sizes"):
        epoch_order(10, seed=0, epoch=0, shuffle="block", blocks=(3, 3))
    with pytest.raises(ValueError, match="seed"):
        sample_rng(-1, 0, 0)
