"""Candidate planning and the shift baseline on their own (predictors.planning,
predictors.shifts); the tuner's use of them is tested in test_predictors_tuner.py."""

from __future__ import annotations

import doctest

import pytest

from predictors import planning
from predictors.baselines import QueueingModel
from predictors.planning import CandidatePlanner
from predictors.shifts import ServiceBaseline
from predictors.state import TunerState, state_features

MiB = 2**20


def _read_bound(read_ms: float = 40.0, stall_ms: float = 0.0, index: int = 0) -> TunerState:
    """One batch of a loader whose only cost is a read (40 ms a batch against 10 ms
    steps: 4 busy workers keep up)."""
    return TunerState(
        batch_index=index,
        workers=1,
        depth=1,
        batch_size=8,
        step_ms=10.0,
        stall_ms=stall_ms,
        read_ms=read_ms,
        decode_ms=0.0,
        bytes_per_batch=MiB,
        memory_bytes=MiB,
        cpu_count=8,
    )


def _planner(budget: float | None = None) -> CandidatePlanner:
    return CandidatePlanner(
        QueueingModel(), target=0.9, margin=0.05, budget=budget, max_workers=16, max_depth=64
    )


def test_worked_examples_in_the_docstrings_hold() -> None:
    result = doctest.testmod(planning)
    assert result.attempted >= 1 and result.failed == 0


def test_the_least_memory_that_meets_the_goal_with_the_margin() -> None:
    state = _read_bound()
    choice = _planner().choose(
        state, state_features(state), goal=0.9, stages={"step_ms": 10.0}, slack=0
    )
    # 3 workers allow 3 * 10 / 40 = 0.75; 4 allow all of it, at depth 4 the least memory.
    assert (choice.workers, choice.depth) == (4, 4)
    assert choice.feasible and choice.bottleneck is None
    assert choice.predicted["memory_bytes"] == 4 * MiB
    assert "least memory predicted to reach 0.95" in choice.note


def test_out_of_reach_within_the_budget_takes_the_best_and_names_the_stage() -> None:
    state = _read_bound()
    stages = {
        "read_ms": 40.0,
        "decode_ms": 0.0,
        "transform_ms": 0.0,
        "step_ms": 10.0,
        "stall_ms": 3.0,
    }
    choice = _planner(budget=3 * MiB).choose(
        state, state_features(state), goal=0.9, stages=stages, slack=0
    )
    assert (choice.workers, choice.depth) == (3, 3)  # 0.75, the most 3 MiB allow
    assert not choice.feasible and choice.bottleneck == "storage"
    assert choice.note.startswith("target 0.90 is out of reach within 3 MiB")


def test_slowness_scales_the_service_planned_for() -> None:
    state = _read_bound()
    planner = _planner()
    planner.slowness = 2.0  # the effective service is twice the measured: 8 workers
    choice = planner.choose(
        state, state_features(state), goal=0.9, stages={"step_ms": 10.0}, slack=0
    )
    assert (choice.workers, choice.depth) == (8, 8)
    assert choice.predicted["service_scale"] == 2.0


def test_a_tenfold_slowdown_is_read_against_the_baseline() -> None:
    baseline = ServiceBaseline(shift_ratio=1.6)
    steady = [_read_bound(index=i) for i in range(8)]
    assert baseline.read(steady, goal=0.9, window=8, fresh_batches=4) is None  # sets it
    assert baseline.median == pytest.approx(40.0, rel=1e-3)
    slow = [_read_bound(read_ms=400.0, stall_ms=90.0, index=8 + i) for i in range(4)]
    shift = baseline.read(steady + slow, goal=0.9, window=8, fresh_batches=4)
    assert shift is not None and shift.large
    assert shift.before == pytest.approx(40.0, rel=1e-3)
    assert shift.now == pytest.approx(400.0, rel=1e-3)


def test_a_slowdown_that_still_meets_the_goal_is_no_shift() -> None:
    baseline = ServiceBaseline(shift_ratio=1.6)
    steady = [_read_bound(index=i) for i in range(8)]
    baseline.read(steady, goal=0.9, window=8, fresh_batches=4)
    slow_but_enough = [_read_bound(read_ms=400.0, index=8 + i) for i in range(4)]
    assert baseline.read(steady + slow_but_enough, goal=0.9, window=8, fresh_batches=4) is None
