"""Candidate planning and the shift baseline on their own (predictors.planning,
predictors.shifts); the tuner's use of them is tested in test_predictors_tuner.py."""

from __future__ import annotations

import dataclasses
import doctest

import pytest

from predictors import planning
from predictors.baselines import QueueingModel
from predictors.planning import CandidatePlanner, Pace, service_spread
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
        state, state_features(state), goal=0.9, stages={"step_ms": 10.0}, pace=Pace(step_ms=10.0)
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
        state, state_features(state), goal=0.9, stages=stages, pace=Pace(step_ms=10.0)
    )
    assert (choice.workers, choice.depth) == (3, 3)  # 0.75, the most 3 MiB allow
    assert not choice.feasible and choice.bottleneck == "storage"
    assert choice.note.startswith("target 0.90 is out of reach within 3 MiB")


def test_slowness_scales_the_service_planned_for() -> None:
    state = _read_bound()
    planner = _planner()
    planner.slowness = 2.0  # the effective service is twice the measured: 8 workers
    choice = planner.choose(
        state, state_features(state), goal=0.9, stages={"step_ms": 10.0}, pace=Pace(step_ms=10.0)
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


def test_early_batches_buy_no_depth_and_late_ones_do() -> None:
    """nas at 4 ms: 11-12.5 ms reads, one of eight 2.5 ms (a worker's read-ahead block
    held its next row group) and one 29 ms (a worker opening the file). Only lateness
    needs depth, and these two samples are not it: 3 workers at depth 4. Counted by
    their standard deviation (0.52 of the mean), they bought depth 6 (4 MiB peak where
    the oracle held 3). A true tail of late batches still buys the depth."""
    state = dataclasses.replace(_read_bound(read_ms=11.5), step_ms=4.0)
    features = state_features(state)
    services = [11.0, 2.5, 12.0, 11.5, 29.0, 12.5, 11.0, 12.0]
    pace = Pace(step_ms=4.0, spread=service_spread(services))
    choice = _planner().choose(state, features, goal=0.9, stages={"step_ms": 4.0}, pace=pace)
    assert (choice.workers, choice.depth) == (3, 4)
    tail = [11.0, 14.0, 10.0, 17.0, 11.5, 15.5, 9.5, 12.0]  # half the batches 2-5 ms late
    pace = Pace(step_ms=4.0, spread=service_spread(tail))
    choice = _planner().choose(state, features, goal=0.9, stages={"step_ms": 4.0}, pace=pace)
    assert choice.depth >= 6 and choice.depth > choice.workers


def test_the_depth_needed_is_the_least_of_two_sufficient_conditions() -> None:
    # With workers to spare, the time condition: the service plus lateness, in steps.
    assert planning.depth_needed(8, service_ms=40.0, step_ms=10.0, spread=0.1) == pytest.approx(
        (40.0 * 1.2 + 40 / 80 / (1 - 40 / 80) * 0.01 / 2 * 40.0) / 10.0
    )
    # Saturated (rho >= 1) with late batches: depth beyond the busy workers, at most 2x.
    assert planning.depth_needed(4, service_ms=80.0, step_ms=10.0, spread=0.3) == 8.0
    # No lateness: the batches being built, nothing more.
    assert planning.depth_needed(4, service_ms=40.0, step_ms=10.0, spread=0.0) == 4.0


class _MoreWorkersLookBetter:
    """A model that, like the learned one outside its data, credits workers beyond
    the depth (which the engine leaves idle)."""

    utilization_error = 0.05

    def predict(self, frame):
        out = QueueingModel().predict(frame)
        out["utilization"] = (out["utilization"] + 0.01 * frame["workers"]).clip(upper=1.0)
        return out


def test_no_candidate_has_more_workers_than_depth() -> None:
    """At most `depth` batches are in flight, so workers beyond it idle: same memory,
    more threads. A model that credits them must not get to pick them."""
    state = _read_bound()
    planner = CandidatePlanner(
        _MoreWorkersLookBetter(), target=0.9, margin=0.05, budget=None, max_workers=16, max_depth=64
    )
    frame = planner.candidates(state, state_features(state), Pace(step_ms=10.0))
    assert len(frame) and (frame["workers"] <= frame["depth"]).all()
    choice = planner.choose(
        state, state_features(state), goal=0.9, stages={"step_ms": 10.0}, pace=Pace(step_ms=10.0)
    )
    assert choice.workers <= choice.depth, choice
