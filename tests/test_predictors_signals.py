"""The tuner's signal rules (predictors.signals): worked examples and invariants."""

from __future__ import annotations

import doctest

from hypothesis import given
from hypothesis import strategies as st

from predictors import signals, state

ms = st.floats(min_value=0.1, max_value=5_000, allow_nan=False)


def test_worked_examples_in_the_docstrings_hold() -> None:
    result = doctest.testmod(signals)
    assert result.attempted >= 10 and result.failed == 0
    result = doctest.testmod(state)  # the cores bound
    assert result.attempted >= 1 and result.failed == 0


@given(ms, st.lists(st.floats(min_value=0.2, max_value=5.0), min_size=4, max_size=4))
def test_a_steady_service_is_no_change(base: float, factors: list[float]) -> None:
    """Batches within 5x of the baseline mean, either way, are no large change."""
    assert signals.large_change([base * f for f in factors], base)[0] == "none"


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


@given(
    st.floats(min_value=0.05, max_value=0.99),
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_a_larger_shortfall_never_buys_less_memory(target, a, b) -> None:
    """Monotone in the shortfall, 1.5x at a shortfall of nothing, 3x at a large one."""
    worse, better = sorted((a, b))
    assert signals.memory_step(target, worse) >= signals.memory_step(target, better)
    assert signals.memory_step(target, target) == 1.5
    assert signals.memory_step(target, target / 2) == 3.0
