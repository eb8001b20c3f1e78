"""The forecaster on its own (predictors.forecast): the physical prior, its lower bound,
the choice. The tuner's use of it is tested by outcomes in test_predictors_tuner.py."""

from __future__ import annotations

import doctest

import numpy as np

from predictors import forecast
from predictors.config import TunerConfig
from predictors.forecast import Forecaster
from predictors.measure import Service

MiB = 2**20


def _storage_bound(**over) -> Service:
    """A map-style Dataset whose reads wait on remote storage: 40 ms a batch, 0.3 ms of
    it CPU, against an 8 ms step, on 2 cores (the case of issue #23)."""
    base = dict(
        service_ms=40.0,
        wait_ms=39.7,
        spread=0.1,
        cpu_ms=0.3,
        step_ms=8.0,
        active=1,
        samples=16,
        read_ms=40.0,
        cpu_count=2,
    )
    return Service(**{**base, **over})


def _choose(forecaster: Forecaster, est: Service, goal: float = 0.9):
    grid = forecaster.grid(MiB, est.cpu_count)
    point, lower = forecaster.predict(grid, est, est.cpu_count)
    allowed = np.ones(len(grid), dtype=bool)
    choice = forecaster.choose(
        grid,
        point,
        lower,
        goal=goal,
        batch_bytes=MiB,
        est=est,
        cpu_count=est.cpu_count,
        allowed=allowed,
    )
    return choice, dict(zip(grid, point, strict=True))


def test_worked_examples_in_the_docstrings_hold() -> None:
    assert doctest.testmod(forecast).failed == 0


def test_workers_that_wait_on_storage_reach_the_target_on_two_cores() -> None:
    """Little's law: 40 ms of waiting against 8 ms steps needs about 5 busy workers,
    and waiting workers cost almost no CPU: the prior must say so, on 2 cores."""
    forecaster = Forecaster(target=0.9, budget=None, max_workers=16)
    choice, point = _choose(forecaster, _storage_bound())
    assert choice.feasible and 5 <= choice.workers <= 8, choice
    assert point[(1, 1)] < 0.25 and point[(6, 8)] >= 0.95


def test_the_cores_bound_what_cpu_bound_workers_can_reach() -> None:
    """40 ms of CPU a batch against 8 ms steps on 2 cores (0.8 usable): at most
    1.6 * 8 / 40 = 0.32, however many workers; the stage that computes is named."""
    forecaster = Forecaster(target=0.9, budget=None, max_workers=16)
    est = _storage_bound(wait_ms=0.0, cpu_ms=40.0, read_ms=0.5, decode_ms=39.5)
    choice, point = _choose(forecaster, est)
    assert max(point.values()) <= 0.33
    assert not choice.feasible and choice.bottleneck == "decode"
    assert "out of reach" in choice.reason


def test_no_candidate_has_more_workers_than_depth_or_exceeds_the_budget() -> None:
    forecaster = Forecaster(target=0.9, budget=6 * MiB, max_workers=16)
    grid = forecaster.grid(MiB, 2)
    assert all(w <= d and d <= 6 for w, d in grid)
    choice, _ = _choose(forecaster, _storage_bound(service_ms=200.0, wait_ms=199.7, read_ms=200.0))
    assert not choice.feasible and choice.bottleneck == "storage" and choice.depth <= 6


def test_the_whole_budget_is_a_candidate_when_it_falls_between_grid_steps() -> None:
    # A budget of 7 batches allows depth 7, not only the grid's 6: torch's default
    # (7 workers x 1) would otherwise beat every candidate the tuner may choose.
    for room in (5, 7, 10):
        forecaster = Forecaster(target=0.9, budget=room * MiB, max_workers=16)
        grid = forecaster.grid(MiB, 8)
        assert max(d for _, d in grid) == room and (room, room) in grid
        slow = _storage_bound(service_ms=100.0, wait_ms=99.7, read_ms=100.0, cpu_count=8)
        choice, _ = _choose(forecaster, slow)
        assert choice.depth == room and choice.workers == room


def test_out_of_reach_it_takes_the_best_workers_at_the_memory_it_chose() -> None:
    # Workers cost no memory: with the target out of reach, the memory chosen gets the
    # workers predicted best, not the fewest within a hair of the best.
    forecaster = Forecaster(target=0.9, budget=None, max_workers=16)
    grid = [(1, 4), (2, 4), (3, 4), (4, 4)]
    point = np.array([0.5, 0.845, 0.848, 0.85])
    choice = forecaster.choose(
        grid,
        point,
        point - 0.05,
        goal=0.9,
        batch_bytes=MiB,
        est=_storage_bound(),
        cpu_count=2,
        allowed=np.ones(4, dtype=bool),
    )
    assert not choice.feasible and (choice.workers, choice.depth) == (4, 4)


def test_late_batches_ask_for_depth_beyond_the_workers() -> None:
    """The same mean service, once steady and once with one batch in five 3x late (a
    heavy tail): the late ones need batches ready ahead, so more depth."""
    forecaster = Forecaster(target=0.9, budget=None, max_workers=16)
    steady, _ = _choose(forecaster, _storage_bound(relative=(1.0,) * 10))
    tail = (0.5,) * 8 + (3.0,) * 2  # mean 1
    late, _ = _choose(forecaster, _storage_bound(relative=tail))
    assert late.depth > steady.depth, (steady, late)


def test_a_larger_confidence_never_buys_less_memory() -> None:
    for spread in (0.0, 0.3):
        est = _storage_bound(spread=spread, samples=4)
        depths = [
            _choose(
                Forecaster(
                    target=0.9, budget=None, max_workers=16, config=TunerConfig(confidence=z)
                ),
                est,
            )[0].depth
            for z in (0.0, 1.0, 2.0)
        ]
        assert depths == sorted(depths), depths
