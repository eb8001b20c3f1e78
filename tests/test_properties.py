"""Property tests (hypothesis) of the plan and the loader state: for random dataset sizes,
batch sizes, world sizes, shuffle modes (with random blocks and windows), drop_last and
checkpoint positions, including a world-size change at the checkpoint, every sample of
an epoch is delivered exactly once; the only repeats are the documented tail padding
(plan.py: fewer samples left than ranks) and the only losses are drop_last's tail.
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from iolib import DataLoader
from iolib.plan import RankSchedule, epoch_order

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A cursor saved after the epoch's last step (cut=1.0), which random draws reach only
# some runs: every plan test runs it, once each way of drop_last.
_LAST_STEP = dict(n=37, shuffle="block", blocks=(10, 27), window=2, seed=5, epoch=1,
                  batch=4, world=3, world_after=2, cut=1.0)  # fmt: skip
AT_THE_END = [{**_LAST_STEP, "drop_last": d} for d in (False, True)]


@st.composite
def plans(draw):
    n = draw(st.integers(1, 200))
    shuffle = draw(st.sampled_from(["none", "global", "block"]))
    blocks: tuple[int, ...] = ()
    if shuffle == "block":
        cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=12))) if n > 1 else []
        edges = [0, *cuts, n]
        blocks = tuple(b - a for a, b in itertools.pairwise(edges))
    return dict(
        n=n,
        shuffle=shuffle,
        blocks=blocks,
        window=draw(st.integers(1, 6)),
        seed=draw(st.integers(0, 2**31)),
        epoch=draw(st.integers(0, 5)),
        batch=draw(st.integers(1, 17)),
        world=draw(st.integers(1, 6)),
        world_after=draw(st.integers(1, 6)),
        drop_last=draw(st.booleans()),
        cut=draw(st.floats(0, 1)),
    )


def _phase(total: int, start: int, p: dict, world: int, batches: int | None = None):
    """Positions every rank takes from `start` (all its batches, or the first `batches`),
    the cursor after them, and the padding used."""
    schedules = [
        RankSchedule(total, start, p["batch"], world, r, p["drop_last"]) for r in range(world)
    ]
    lengths = {len(s) for s in schedules}
    assert len(lengths) == 1, "every rank gets the same number of batches"
    k = lengths.pop() if batches is None else min(batches, len(schedules[0]))
    positions = [int(i) for s in schedules for b in range(k) for i in s.positions(b)]
    cursors = {s.position_after(k) for s in schedules}
    assert len(cursors) == 1, "ranks agree on the cursor"
    padded = schedules[0].padded if k == len(schedules[0]) else 0
    return positions, cursors.pop(), padded


def _check_coverage(p: dict, samples: list[int], padded: int, dropped_below: int) -> None:
    counts = Counter(samples)
    n = p["n"]
    assert set(counts) <= set(range(n))
    if p["drop_last"]:
        assert max(counts.values(), default=1) == 1, "drop_last never repeats"
        assert n - len(counts) < dropped_below, "drop_last drops less than one global step"
    else:
        assert set(counts) == set(range(n)), "complete"
        assert sum(counts.values()) - n == padded, "only the documented padding repeats"


@FAST
@given(plans())
@example(AT_THE_END[0])
@example(AT_THE_END[1])
def test_plan_covers_each_sample_once_across_an_elastic_checkpoint(p) -> None:
    order = epoch_order(p["n"], seed=p["seed"], epoch=p["epoch"], shuffle=p["shuffle"],
                        blocks=p["blocks"], window=p["window"])  # fmt: skip
    assert sorted(order.tolist()) == list(range(p["n"])), "the order is a permutation"
    first_len = len(RankSchedule(p["n"], 0, p["batch"], p["world"], 0, p["drop_last"]))
    k = int(p["cut"] * first_len)
    before, cursor, pad1 = _phase(p["n"], 0, p, p["world"], k)
    after, end, pad2 = _phase(p["n"], cursor, p, p["world_after"])
    samples = [int(order[i]) for i in before + after]
    _check_coverage(p, samples, pad1 + pad2, p["batch"] * p["world_after"] + 1)
    assert end == p["n"] or p["drop_last"]


class Indices:
    """A map-style dataset whose sample is its index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def _loaders(p: dict, world: int) -> list[DataLoader]:
    shuffle = {"none": False, "global": True, "block": "block"}[p["shuffle"]]
    return [
        DataLoader(
            Indices(p["n"]),
            batch_size=p["batch"],
            shuffle=shuffle,
            seed=p["seed"],
            drop_last=p["drop_last"],
            rank=r,
            world_size=world,
            shuffle_window=p["window"],
            num_workers=0,
        )
        for r in range(world)
    ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
@example(AT_THE_END[0])
@example(AT_THE_END[1])
def test_loader_state_resumes_exactly_once_with_another_world_size(p) -> None:
    p = {**p, "n": min(p["n"], 90), "blocks": ()}  # the loader's own blocks for "block"
    first = _loaders(p, p["world"])
    for loader in first:
        loader.set_epoch(p["epoch"])
    k = int(p["cut"] * len(first[0]))
    samples, states = [], []
    for loader in first:
        it = iter(loader)
        for _ in range(k):
            samples += next(it).tolist()
        states.append(loader.state_dict())
    assert all(s == states[0] for s in states), "every rank saves the same cursor"
    schedule = RankSchedule(p["n"], 0, p["batch"], p["world"], 0, p["drop_last"])
    pad1 = schedule.padded if k == len(schedule) else 0
    second = _loaders(p, p["world_after"])
    for loader in second:
        loader.load_state_dict(states[0])
        loader.set_epoch(p["epoch"])
        samples += [i for batch in loader for i in batch.tolist()]
    cursor = states[0]["position"]
    rest = RankSchedule(p["n"], cursor, p["batch"], p["world_after"], 0, p["drop_last"])
    _check_coverage(p, samples, pad1 + rest.padded, p["batch"] * p["world_after"] + 1)
    lengths = {len(list(iter(ld))) for ld in _loaders(p, p["world"])}
    assert len(lengths) == 1, "equal batch counts on every rank"
