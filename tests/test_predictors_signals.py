"""The tuner's signal rules (predictors.signals): worked examples and invariants."""

from __future__ import annotations

import doctest

from hypothesis import given
from hypothesis import strategies as st

from predictors import signals

ms = st.floats(min_value=0.1, max_value=5_000, allow_nan=False)


def test_worked_examples_in_the_docstrings_hold() -> None:
    result = doctest.testmod(signals)
    assert result.attempted >= 10 and result.failed == 0


@given(st.lists(ms, min_size=4, max_size=4), st.floats(min_value=1.0, max_value=5.0))
def test_a_steady_service_is_no_change(recent: list[float], scale: float) -> None:
    """Any window is "none" against a baseline mean it stays within 5x of (each way)."""
    baseline = max(recent) / scale  # every batch within 5x above the baseline
    if min(recent) * 5 >= baseline and sum(recent) / 4 * 5 >= baseline:
        assert signals.large_change(recent, baseline)[0] == "none"


@given(ms, st.floats(min_value=5.5, max_value=50.0), st.integers(min_value=0, max_value=2))
def test_two_batches_far_beyond_the_baseline_are_a_slowdown(
    base: float, factor: float, at: int
) -> None:
    recent = [base] * 4
    recent[at] = recent[at + 1] = base * factor
    change, first = signals.large_change(recent, base)
    assert (change, first) == ("slower", at)


@given(
    st.floats(min_value=0.05, max_value=0.95),
    ms,
    st.floats(min_value=0, max_value=10_000),
    st.integers(min_value=1, max_value=1000),
)
def test_the_goal_lies_between_the_target_and_the_cap(target, step, wait, batches) -> None:
    goal = signals.epoch_goal(target, step, wait, batches)
    assert target <= goal <= max(target, 0.98)
    if wait == 0:
        assert goal == target


@given(st.floats(min_value=0.05, max_value=0.99), st.floats(min_value=0.0, max_value=1.0))
def test_one_escalation_buys_between_one_and_a_half_and_three_times(target, observed) -> None:
    assert 1.5 <= signals.memory_step(target, observed) <= 3.0
