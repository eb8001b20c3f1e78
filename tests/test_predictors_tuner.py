"""Tuners on a SYNTHETIC simulated loader (`predictors.synthetic`): reach the target,
stay within the budget, react to a storage slowdown, report infeasible targets."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from predictors.baselines import HillClimbTuner, OracleTuner, QueueingModel, StaticDefaultTuner
from predictors.errors import TunerConfigError
from predictors.model import Predictor
from predictors.state import Decision, TunerState, name_bottleneck
from predictors.synthetic import SimWorkload, make_observations, measure, run_tuner
from predictors.tuner import LearnedTuner, Measured

GiB = 2**30
# Latency-bound token reads: 4 requests of 5 ms per batch, a 10 ms step.
TOKENS = SimWorkload(
    "tokens-t",
    "nas",
    bytes_per_sample=8000,
    decode_ms_per_sample=0.01,
    storage_latency_ms=5.0,
    storage_bandwidth_mbps=2000,
    batch_size=256,
    step_ms=10.0,
    rows_per_read=64,
    cpu_count=16,
)
# Decode-bound images on 2 cores: 64 x 3 ms = 192 ms of CPU per batch, a 20 ms step.
HEAVY_DECODE = SimWorkload(
    "images-t",
    "local",
    bytes_per_sample=100e3,
    decode_ms_per_sample=3.0,
    storage_latency_ms=0.1,
    storage_bandwidth_mbps=2000,
    batch_size=64,
    step_ms=20.0,
    rows_per_read=1,
    cpu_count=2,
)


@pytest.fixture(scope="module")
def learned_model() -> Predictor:
    return Predictor().fit(make_observations(n_workloads=10, n_batches=60, seed=11))


def _state(**over) -> TunerState:
    base = dict(
        batch_index=0,
        workers=2,
        depth=2,
        batch_size=64,
        step_ms=10.0,
        stall_ms=5.0,
        read_ms=5.0,
        decode_ms=5.0,
        bytes_per_batch=1e6,
        memory_bytes=2e6,
        cpu_count=8,
    )
    return TunerState(**{**base, **over})


@pytest.mark.parametrize("target", [0.0, 1.0, 1.5, -0.1, True])
def test_target_outside_open_unit_interval_is_refused(target):
    with pytest.raises(TunerConfigError, match=r"between 0 and 1.*0\.9"):
        LearnedTuner(QueueingModel(), target_utilization=target)


def test_budget_below_one_batch_is_refused():
    for tuner in (
        LearnedTuner(QueueingModel(), memory_budget_bytes=1e6),
        HillClimbTuner(memory_budget_bytes=1e6),
    ):
        with pytest.raises(TunerConfigError, match="at least one batch"):
            tuner.decide(_state(batch_memory_bytes=4e6))


def test_static_default_is_two_batches_per_worker():
    d = StaticDefaultTuner(workers=4).decide(_state())
    assert (d.workers, d.depth) == (4, 8) and "static" in d.reason


@pytest.mark.parametrize("which", ["queueing", "learned"])
def test_learned_tuner_reaches_the_target_within_budget(which, learned_model):
    model = QueueingModel() if which == "queueing" else learned_model
    budget = 64 * TOKENS.memory_factor * TOKENS.batch_bytes
    tuner = LearnedTuner(model, target_utilization=0.85, memory_budget_bytes=budget)
    trace = run_tuner(tuner, TOKENS, 160)
    assert trace["memory_bytes"].max() <= budget
    assert trace["bound_bytes"].max() <= budget
    assert trace["utilization"].iloc[60:].mean() >= 0.85
    assert all(d.reason for _, d in tuner.history)
    # Reached sooner than the hill-climber (rolling mean of 5 batches over the target).
    hill = run_tuner(HillClimbTuner(memory_budget_bytes=budget), TOKENS, 160)
    reached = (trace["utilization"].rolling(5).mean() >= 0.85).idxmax()
    reached_hill = (hill["utilization"].rolling(5).mean() >= 0.85).idxmax()
    assert reached < reached_hill


def test_learned_tuner_reacts_to_a_tenfold_storage_slowdown():
    """Planned for 3x the slow service (`surge`), the slowdown is out of reach within this
    budget; 2x is not, and the tuner plans for that. Holding a ceiling instead, it
    climbed by single workers, each change blind for the 64 batches in flight, and
    released the memory 117 batches after the recovery."""
    budget = 64 * TOKENS.memory_factor * TOKENS.batch_bytes
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.85, memory_budget_bytes=budget)
    trace = run_tuner(tuner, TOKENS, 300, slowdown=(80, 180, 10.0))
    shifts = [d.reason for b, d in tuner.history if "regime shift" in d.reason]
    assert shifts and "planning for 2x" in shifts[0], shifts
    before = trace.loc[60:79, "workers"].median()
    # It reacts (a detected shift, or the measured shortfall) with more workers, within
    # 20 batches once the batches already in flight (up to the depth) are consumed.
    reactions = [b for b, d in tuner.history if b >= 80 and d.workers > before]
    assert reactions and reactions[0] - 80 <= 20 + int(trace.loc[79, "depth"])
    during = trace.loc[140:179]
    assert during["workers"].median() > 2 * before
    assert during["utilization"].mean() >= 0.8
    # Memory released once the slow batches already in flight (up to the depth) drained.
    after = trace.loc[270:299]
    assert after["bound_bytes"].max() < during["bound_bytes"].max()
    assert trace["bound_bytes"].max() <= budget


def test_infeasible_target_names_the_bottleneck():
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=GiB)
    trace = run_tuner(tuner, HEAVY_DECODE, 60)
    last = tuner.history[-1][1]
    assert not last.feasible and last.bottleneck == "decode"
    assert "out of reach" in last.reason and "decode" in last.reason
    assert trace["utilization"].iloc[30:].mean() > 0.15  # still does the best it can


def test_reads_that_keep_the_cores_busy_are_named_cpu_not_storage():
    """nas at 2 ms steps, measured: reads took 19 ms a batch, 5 of them CPU, at one batch
    per 3.3 ms on 2 cores (0.76 of the cores busy). More workers queued for the cores."""
    m = {"read_ms": 19.0, "decode_ms": 0.0, "transform_ms": 0.2, "step_ms": 2.0}
    busy = {**m, "stall_ms": 1.3, "cpu_ms": 5.2, "read_cpu_ms": 5.0}
    assert name_bottleneck(busy, cpu_count=2) == "cpu"
    # The same reads from slow storage: few batches a second, cores mostly idle.
    idle = {**busy, "stall_ms": 40.0}
    assert name_bottleneck(idle, cpu_count=2) == "storage"
    # Busy cores, but decode is what computes (Pillow).
    decode = {**busy, "decode_ms": 30.0, "read_cpu_ms": 0.5}
    assert name_bottleneck(decode, cpu_count=2) == "decode"
    # No CPU measured (a simulation, an older loader): the longest stage.
    assert name_bottleneck({**m, "stall_ms": 1.3}, cpu_count=2) == "storage"


def test_infeasible_storage_bound_within_a_small_budget():
    small = 3 * TOKENS.memory_factor * TOKENS.batch_bytes  # at most depth 3
    slow = SimWorkload(**{**TOKENS.__dict__, "storage_latency_ms": 50.0})
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=small)
    trace = run_tuner(tuner, slow, 60)
    last = tuner.history[-1][1]
    assert not last.feasible and last.bottleneck == "storage"
    assert trace["bound_bytes"].max() <= small


def test_oracle_picks_least_memory_meeting_the_target():
    sweep = pd.DataFrame(
        [measure(TOKENS, w, d, n_batches=60) for w in (1, 2, 4, 8) for d in (1, 2, 4, 8)]
    )
    oracle = OracleTuner(sweep, target_utilization=0.85)
    d = oracle.decide(_state())
    ok = sweep[sweep["utilization"] >= 0.85]
    assert d.feasible and d.predicted["memory_bytes"] == ok["memory_bytes"].min()
    with pytest.raises(TunerConfigError, match="budget"):
        OracleTuner(sweep, memory_budget_bytes=1.0)


def test_hill_climber_respects_the_budget():
    budget = 4 * TOKENS.memory_factor * TOKENS.batch_bytes
    trace = run_tuner(HillClimbTuner(memory_budget_bytes=budget), TOKENS, 150)
    assert trace["bound_bytes"].max() <= budget
    assert trace["depth"].max() <= 4


def _hidden_cost_run(tuner: LearnedTuner, batches: int, budget_batches: int) -> list[tuple]:
    """Closed loop on a storage whose real cost the stage times do not show (retries and
    faults, as in the soak): telemetry reports 2 ms of read per batch, each batch really
    takes 70 ms of a worker, the step is 10 ms. Utilization at `active` busy workers is
    min(1, active * 10 / 70), so 7 workers are needed for 0.9. Returns per batch
    (workers, depth, utilization)."""
    workers, depth, out = 1, 1, []
    for k in range(batches):
        active = min(workers, depth)
        util = min(1.0, active * 10.0 / 70.0)
        state = _state(
            batch_index=k,
            workers=workers,
            depth=depth,
            step_ms=10.0,
            stall_ms=10.0 / util - 10.0,
            read_ms=2.0,
            decode_ms=0.0,
            bytes_per_batch=1e6,
            batch_memory_bytes=1e6,
            rows_per_read=64,
        )
        out.append((workers, depth, util))
        decision = tuner.decide(state)
        assert decision.depth * 1e6 <= budget_batches * 1e6  # never over the budget
        workers, depth = decision.workers, decision.depth
    return out


def test_low_utilization_with_hidden_service_cost_escalates():
    """Regression (soak): observed 0.14 vs predicted 1.00 held 1 worker / depth 1 for the
    whole run, because the correction was capped at 2x per step and reset by every
    detected shift. Now the shortfall itself sizes the correction and the tuner climbs."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _hidden_cost_run(tuner, 80, 64)
    assert trace[10][2] < 0.5  # it starts far below the target
    reached = next((k for k, (_, _, u) in enumerate(trace) if u >= 0.9), None)
    assert reached is not None and reached <= 40, trace
    # One step-down trial may dip below (and is reverted); then it stays at the target.
    assert all(u >= 0.9 for _, _, u in trace[-10:])
    assert max(d for _, d, _ in trace) <= 16  # without running to the budget


def test_low_utilization_within_a_tight_budget_climbs_to_it_and_says_so():
    budget = 4  # batches: 4 workers at most are useful, 0.57 at best
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=budget * 1e6)
    trace = _hidden_cost_run(tuner, 80, budget)
    assert trace[-1][:2] == (4, 4)
    last = tuner.history[-1][1]
    assert not last.feasible and last.bottleneck == "storage"
    assert "out of reach" in last.reason


def test_a_small_shortfall_is_measured_twice_before_memory_is_bought():
    """0.885 against a 0.90 target is within one window's noise: the tuner measures a
    second window before escalating (one such window used to buy 5x the memory the
    target needed), and escalates when the shortfall persists."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    workers, depth, changes = 1, 1, []
    for k in range(60):
        state = _state(
            batch_index=k,
            workers=workers,
            depth=depth,
            stall_ms=10.0 / 0.885 - 10.0,
            read_ms=2.0,
            decode_ms=0.0,
            batch_memory_bytes=1e6,
            rows_per_read=64,
        )
        decision = tuner.decide(state)
        if (decision.workers, decision.depth) != (workers, depth):
            changes.append(k)
        workers, depth = decision.workers, decision.depth
    planned = tuner.warmup_batches  # the first plan keeps 1 worker, depth 1 here
    assert changes, "a persistent shortfall must still be acted on"
    assert changes[0] >= planned + 2 * tuner.check_batches, changes


def _closed_loop(
    tuner: LearnedTuner, utilization, batches: int, read_ms=2.0, **state
) -> list[tuple]:
    """Drive `tuner` where `utilization(workers, depth, k, since)` is what batch k measures
    (`since`: batches since the configuration last changed) and `read_ms` the read time it
    reports (a number, or `read_ms(workers, depth, k)`). Returns (workers, depth, util)
    per batch."""
    workers, depth = tuner.start
    changed, out = 0, []
    for k in range(batches):
        util = utilization(workers, depth, k, k - changed)
        s = _state(
            batch_index=k,
            workers=workers,
            depth=depth,
            stall_ms=state.get("step_ms", 10.0) * (1 / util - 1),
            read_ms=read_ms(workers, depth, k) if callable(read_ms) else read_ms,
            **{"decode_ms": 0.0, "batch_memory_bytes": 1e6, **state},
        )
        out.append((workers, depth, util))
        decision = tuner.decide(s)
        if (decision.workers, decision.depth) != (workers, depth):
            workers, depth, changed = decision.workers, decision.depth, k + 1
    return out


def test_a_safe_start_that_measures_the_target_is_kept():
    """The model sees 30 ms of service against a 10 ms step and would buy 3+ workers,
    but the safe start already measures 0.97: memory is bought for a measured shortfall,
    never for a predicted one (images: the oracle's 1 worker / depth 1, where the tuner
    used to plan 2 / 2 and then chase CPU contention up to 6 / 6)."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, lambda w, d, k, since: 0.97, 60, read_ms=30.0)
    assert {(w, d) for w, d, _ in trace} == {(1, 1)}, trace
    assert "no memory to buy" in tuner.history[-1][1].reason


def _epochs_run(
    tuner: LearnedTuner, batches: int, epoch: int, in_epoch, start_stall: float, step_ms: float
) -> set[tuple[int, int]]:
    """Batches in epochs of `epoch`; each epoch's first waits `start_stall` ms (an empty
    pipeline), the others measure `in_epoch(workers, depth)`. The configurations used."""
    workers, depth, seen = 1, 1, set()
    for k in range(batches):
        first = k % epoch == 0
        util = in_epoch(workers, depth)
        state = _state(
            batch_index=k,
            workers=workers,
            depth=depth,
            step_ms=step_ms,
            stall_ms=start_stall if first else step_ms * (1 / util - 1),
            read_ms=2.0,
            decode_ms=0.0,
            batch_memory_bytes=1e6,
            epoch_start=first,
        )
        decision = tuner.decide(state)
        workers, depth = decision.workers, decision.depth
        seen.add((workers, depth))
    return seen


def test_first_batch_of_each_epoch_is_not_judged():
    """Every 6th batch starts an epoch and waits 9 ms for an empty pipeline (no
    configuration shortens that wait); the rest measure 0.99, above what the goal
    between epoch starts asks (0.98, its cap). Judged with the epoch starts, windows
    read about 0.81 and the tuner bought memory that could not help; left out, it holds."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    seen = _epochs_run(tuner, 96, 6, lambda w, d: 0.99, start_stall=9.0, step_ms=10.0)
    assert seen == {(1, 1)}, seen


def test_epoch_start_waits_are_charged_to_the_goal():
    """12-batch epochs whose first batch waits 130 ms at a 150 ms step (Pillow decode in
    the tuner experiment): 0.95 between epoch starts makes 0.87 over the epoch. The
    tuner aims higher between starts (0.96) and buys the second worker that gets there."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)

    def in_epoch(w: int, d: int) -> float:
        return 0.99 if min(w, d) >= 2 else 0.95

    seen = _epochs_run(tuner, 120, 12, in_epoch, start_stall=130.0, step_ms=150.0)
    assert any(min(w, d) >= 2 for w, d in seen), seen
    assert 0.95 < tuner.goal < 0.97


def test_a_failed_step_down_returns_to_the_cheapest_proven_configuration():
    """4 workers / depth 8 meets the target; depth 6 holds for one window, then falls
    to 0.6. The tuner goes back to 4 / 8, which it measured, instead of re-planning from
    the model (which bought 2x that memory on object-store), and never goes deeper."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return 0.99 if d >= 8 or since < 16 else 0.6

    tuner = LearnedTuner(
        QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6, start=(4, 8)
    )
    trace = _closed_loop(tuner, util, 120, read_ms=60.0, step_ms=20.0)
    configs = [(w, d) for w, d, _ in trace]
    assert (4, 6) in configs, "the tuner should try one step less memory"
    assert configs[-1] == (4, 8), configs
    assert max(d for _, d in configs) == 8
    assert any("stepping back up" in d.reason for _, d in tuner.history)


def test_workers_that_lower_utilization_are_given_back():
    """On 2 cores, decode workers take CPU from the step: each added worker lowers
    utilization (0.80, 0.70, 0.60...) while the reported service time stays flat. The tuner
    stops climbing, says the target is out of reach and keeps the better configuration."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return max(0.3, 0.9 - 0.1 * min(w, d))

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, util, 120, read_ms=30.0, cpu_count=2)
    most = max(min(w, d) for w, d, _ in trace)
    assert most <= 4, trace  # one climb, found worse, given back (it used to keep climbing)
    assert any("did not help" in d.reason for _, d in tuner.history)
    last = tuner.history[-1][1]
    assert not last.feasible and min(last.workers, last.depth) < most, last
    assert trace[-1][:2] == (last.workers, last.depth)


def test_a_short_dip_at_a_configuration_with_a_good_record_is_held():
    """A configuration measures 0.92 for 100 batches, then 0.86 for 16 (two windows):
    its record (the last 64 settled batches) still meets the target, so nothing is bought.
    Two short windows alone used to buy workers, which on 2 cores then slowed every read."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return 0.86 if 100 <= k < 116 else 0.92

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, util, 160)
    assert [b for b, d in tuner.history if b >= 100] == [], tuner.history[-1][1].reason
    assert trace[-1][:2] == trace[99][:2]


def test_a_deep_dip_at_a_configuration_with_a_good_record_is_held():
    """Two windows at 0.75 after 100 batches at 0.97 (object-store: lognormal reads, an
    8-batch window is 160 ms): the record, these windows included, meets the target and
    no slowdown shows in the service times, so nothing is bought. Judged window by
    window (short by more than `recheck_margin`) it bought 1.5x the memory."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return 0.75 if 100 <= k < 116 else 0.97

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, util, 160, read_ms=8.0)
    assert max(d for _, d, _ in trace[100:]) <= trace[99][1], tuner.history[-1][1].reason


def test_a_speed_up_while_still_short_does_not_plan_back_down():
    """Under CPU contention the service time per batch moves with the workers. After a
    climb it may read 2x faster while utilization is still short of the goal: that is no
    reason to re-plan for less (it used to go back down to what had measured short)."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return min(0.85, 0.3 + 0.1 * min(w, d))

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    configs = _closed_loop(tuner, util, 160, read_ms=lambda w, d, k: 30.0 if k < 60 else 12.0)
    trace = [min(w, d) for w, d, _ in configs]
    assert max(trace) > 1, "it climbed (the shortfall is real)"
    faster = [d.reason for b, d in tuner.history if "regime shift" in d.reason]
    assert faster == [], faster


def test_workers_that_lower_utilization_are_given_back_even_when_reads_slow_down():
    """CPU contention on 2 cores: each added worker makes every read slower (here the
    reported read time grows as workers^2.5, so the service rate falls by a third or
    more) and utilization falls. A falling rate used to be read as a storage slowdown
    under way, and the tuner kept climbing (16 -> 24 -> 28 workers on nas at 2 ms);
    now the climb is given back."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return max(0.3, 0.85 - 0.08 * max(0, min(w, d) - 2))

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(
        tuner, util, 160, read_ms=lambda w, d, k: 10.0 * min(w, d) ** 2.5, cpu_count=2
    )
    active = [min(w, d) for w, d, _ in trace]
    given_back = ("did not help", "stopped paying")  # one climb / every measured config
    assert any(w in d.reason for _, d in tuner.history for w in given_back), tuner.history
    assert active[-1] < max(active), active


def test_after_a_speed_up_a_cheaper_plan_that_falls_short_steps_back_to_the_proven_one():
    """4 workers meet the target and fewer do not. Reads then get 2.4x faster (on
    object-store, jitter alone read so): the re-plan tries fewer workers, which fall
    short. What met the target before the speed-up still does, so the tuner goes back
    to it, not to the model's escalation (4/8 -> 2/3 -> 10/24 was that run's peak)."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return 0.99 if min(w, d) >= 4 else 0.3

    tuner = LearnedTuner(
        QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6, start=(4, 8)
    )
    trace = _closed_loop(
        tuner, util, 200, read_ms=lambda w, d, k: 60.0 if k < 100 else 25.0, step_ms=20.0
    )
    replans = [b for b, d in tuner.history if "regime shift" in d.reason]
    assert replans, "the speed-up should re-plan for less"
    after = trace[replans[0] + 1 :]
    assert min(min(w, d) for w, d, _ in after) < 4, "the re-plan tried fewer workers"
    proven = trace[replans[0]][1]  # the depth it held (and had measured) at the shift
    assert max(d for _, d, _ in after) <= proven, after
    assert any("stepping back up" in d.reason for b, d in tuner.history if b > replans[0])
    assert min(trace[-1][:2]) >= 4


def test_a_short_first_window_whose_workers_keep_up_is_measured_again():
    """Reads take 60 ms against a 20 ms step; 3 workers keep up (their measured service
    allows 1.0) but the first window after the plan reads 0.6 while the buffer fills.
    The tuner measures another window instead of buying more workers for it (on
    object-store such a window took 4 / 8, the oracle's, to 7 / 16)."""

    def util(w: int, d: int, k: int, since: int) -> float:
        keeps_up = min(w, d) * 20.0 / 60.0 >= 0.9
        return 0.6 if since < 12 or not keeps_up else 0.99

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, util, 80, read_ms=60.0, step_ms=20.0)
    plan = trace[5][:2]
    assert min(plan) >= 3, plan
    # Nothing bought beyond the plan (a step-down trial, reverted, may come later).
    assert max(d for _, d, _ in trace) == plan[1], sorted({(w, d) for w, d, _ in trace})
    assert trace[-1][2] >= 0.9


def test_an_escalation_plans_from_the_service_its_workers_measured():
    """One worker reads a batch in 30 ms (read-ahead serves it the next row group);
    two or more take 60 ms each (striding through row groups, nothing read ahead is
    theirs). The first plan, from one worker, falls short; the next plans from what the
    2 workers measured: 3 workers at 20 ms steps, not a correction on top of it."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return min(0.99, min(w, d) * 20.0 / 60.0)

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(
        tuner, util, 80, read_ms=lambda w, d, k: 30.0 if w == 1 else 60.0, step_ms=20.0
    )
    assert trace[-1][2] >= 0.9, trace[-1]
    assert max(w for w, _, _ in trace) == 3, sorted({(w, d) for w, d, _ in trace})
    assert any("planning from that service" in d.reason for _, d in tuner.history)


def _shifts_after_reads_slow_to(slow_ms: float, step_ms: float, batches: int) -> list:
    """Regime-shift decisions when reads go from 60 ms to `slow_ms` at batch 80, with
    utilization what the busy workers' reads allow (asserted non-empty)."""

    def read(w: int, d: int, k: int) -> float:
        return 60.0 if k < 80 else slow_ms

    def util(w: int, d: int, k: int, since: int) -> float:
        return min(0.99, min(w, d) * step_ms / read(w, d, k))

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    _closed_loop(tuner, util, batches, read_ms=read, step_ms=step_ms)
    shifts = [d for b, d in tuner.history if "regime shift" in d.reason]
    assert shifts, [d.reason for _, d in tuner.history]
    return shifts


def test_a_moderate_slowdown_is_planned_for_what_was_measured():
    """Reads slow from 60 to 108 ms (1.8x, a moderate change: lognormal object-store
    reads show such runs by chance). The re-plan keeps up with 108 ms, not with twice
    that: the surge that refills the buffer after a tenfold slowdown bought 12 / 24 and
    13 / 32 here where 4 / 8 held."""

    shifts = _shifts_after_reads_slow_to(108.0, step_ms=20.0, batches=140)
    assert "planning for" not in shifts[0].reason
    assert 6 <= shifts[0].workers <= 7, shifts[0]  # 0.95 * 108 / 20 = 5.1, plus slack


def test_a_step_down_to_more_workers_than_fell_short_is_tried():
    """2/4 falls short, 3/6 meets the target with room (three busy workers are enough).
    A step down to 3/4 holds as much memory as 2/4 but has more workers: it is tried,
    not ruled out by 2/4's shortfall (on nas at 4 ms the tuner held 3/6 for good,
    where 4/4, the oracle's, reads 0.97)."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(
        tuner,
        lambda w, d, k, since: 0.97 if min(w, d) >= 3 else 0.80,
        120,
        # Every other read 16 ms late: depth beyond the workers. (Reads 6, 22, 6, 22, 6
        # at the first plan: the median is 6 and 22 reads late; the other way round the
        # median batch is a slow one and nothing reads late, `service_spread`.)
        read_ms=lambda w, d, k: 22.0 if k % 2 else 6.0,
    )
    configs = [(w, d) for w, d, _ in trace]
    assert (2, 4) in configs and (3, 6) in configs, sorted(set(configs))
    assert configs[-1][0] >= 3 and configs[-1][1] <= 4, tuner.history


@pytest.mark.parametrize("start", [60, 61])
def test_a_slowdown_at_one_worker_with_read_ahead_is_read_as_a_shift(start):
    """One worker, every other batch served from read-ahead (40 / 4 ms). The storage
    slows tenfold: slow batches still alternate with cheap ones, and the one read while
    it slowed is only part slow, so the second slow batch comes 4 after the first.
    Deferring the escalation two batches, the tuner escalated first (1/1 -> 1/2) and
    read the shift 11 batches later at the new baseline (object-store: 25 batches to
    recover, against 10-11). It waits while a slow batch is in the window."""

    def read(w: int, d: int, k: int) -> float:
        if k < start:
            return 40.0 if k % 2 == 0 else 4.0
        if k == start + 2:
            return 90.0  # in flight when the storage slowed
        return 400.0 if (k - start) % 2 == 0 else 4.0

    def util(w: int, d: int, k: int, since: int) -> float:
        if k < start or min(w, d) >= 4:
            return 0.97
        return {4.0: 1.0, 90.0: 0.6}.get(read(w, d, k), 0.17)

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    _closed_loop(tuner, util, start + 40, read_ms=read, step_ms=100.0)
    after = [d for b, d in tuner.history if b >= start]
    assert after and "regime shift" in after[0].reason, [d.reason for d in after]
    assert "planning for 3x" in after[0].reason and after[0].workers >= 4, after[0]


def test_depth_that_stopped_paying_is_no_plateau_while_workers_can_grow():
    """Three workers read 0.99 for a while (lucky reads), then 0.82 at any depth; four
    read 0.96. The step-downs measure 3/4 and 3/6 alike: depth stopped paying, which
    says nothing of workers. The tuner climbs to 4 workers; it used to say the target
    was out of reach and hold 3/4 (object-store: 0.73 where 4/8 reads 0.95)."""

    def util(w: int, d: int, k: int, since: int) -> float:
        if min(w, d) <= 2:
            return 0.80
        if min(w, d) == 3:
            return 0.99 if k < 75 else 0.82
        return 0.96

    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, util, 200, read_ms=lambda w, d, k: 22.0 if k % 2 else 6.0)
    assert (3, 4) in {(w, d) for w, d, _ in trace}  # the shallower depth was measured
    assert not any("out of reach" in d.reason for _, d in tuner.history), tuner.history
    assert trace[-1][0] >= 4 and trace[-1][2] >= 0.9, trace[-1]


def test_a_tenfold_slowdown_is_planned_for_three_times_what_was_measured():
    """Reads slow from 60 to 600 ms. The re-plan keeps up with 3x that (`surge`): the
    consumer is already waiting and the buffer refills only at the surplus rate, and
    the reading is a mean of a few batches (object-store runs read 290-830 ms for the
    same slowdown; planned for 2x, the low readings took 19-25 batches to recover)."""

    shifts = _shifts_after_reads_slow_to(600.0, step_ms=200.0, batches=100)
    assert "planning for 3x" in shifts[0].reason, shifts[0]
    assert shifts[0].workers >= 9, shifts[0]  # 3 x 0.95 x 600 / 200 = 8.6


@pytest.mark.parametrize("slower_from", [13, 28, 30])
def test_a_slowdown_under_way_still_buys_a_bounded_memory_step(slower_from):
    """Reads go from 30 to 51 ms (1.7x) at `slower_from` while utilization stays short:
    an escalation that sees four slower batches plans from them, but buys at most 3x
    the memory (four lognormal reads pass that check by chance; uncapped, it bought 8x:
    6 -> 32 here, 2/4 -> 10/24 on object-store). A large slowdown is answered by the
    regime-shift re-plan, which is not capped."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    _closed_loop(
        tuner,
        lambda w, d, k, since: 0.3,
        60,
        read_ms=lambda w, d, k: 30.0 if k < slower_from else 51.0,
        step_ms=20.0,
    )
    steps = [
        (before.depth, after.depth)
        for (_, before), (_, after) in itertools.pairwise(tuner.history)
        if "observed utilization" in after.reason
    ]
    assert steps and all(after <= 3 * before for before, after in steps), steps


def test_when_more_workers_stop_paying_it_keeps_the_cheapest_as_good_as_the_best():
    """CPU-bound reads on 2 cores (nas at 2 ms): each added worker slows every read,
    so utilization saturates near 0.76 (0.48 at 4 workers, 0.70 at 10, 0.74 at 16).
    Each climb still gains a little; judged on every configuration measured, 1.5x the
    workers bought under 10 %: it stops, says the target is out of reach, and holds the
    cheapest configuration within 5 % of the best (the climbs went on to 30 / 48)."""

    def util(w: int, d: int, k: int, since: int) -> float:
        return 0.76 * (1 - math.exp(-min(w, d) / 4))

    # The rule alone, on 8-batch windows: windows scaled to this 2 ms step's service
    # times (`test_windows_span_service_times_not_batches`) measure each climb 2.5x
    # longer, which in this noiseless loop buys nothing and climbs one step further.
    tuner = LearnedTuner(
        QueueingModel(),
        target_utilization=0.9,
        memory_budget_bytes=64e6,
        max_workers=32,
        window_services=0,
    )
    trace = _closed_loop(
        tuner, util, 300, read_ms=lambda w, d, k: 10.0 * max(1.0, min(w, d) / 4), step_ms=2.0
    )
    assert any("stopped paying" in d.reason for _, d in tuner.history), tuner.history[-1]
    last = tuner.history[-1][1]
    assert not last.feasible and "out of reach" in last.reason
    # Said once, then held: not a new decision every window in stats().
    assert sum("out of reach" in d.reason for _, d in tuner.history) == 1, tuner.history
    assert max(d for _, d, _ in trace) <= 12, sorted({(w, d) for w, d, _ in trace})
    assert trace[-1][2] >= 0.95 * max(u for _, _, u in trace)


def test_when_the_cores_are_the_limit_it_stops_and_names_them():
    """Reads that cost 5 ms of worker CPU a batch, on 2 cores, against a 2 ms step: the
    cores allow at most 2 x 0.8 x 2 / 5 = 0.64 whatever the workers (measured here, 0.62).
    Each read's time grows with the workers, which the queueing model reads as room for
    more of them. The tuner stops once a configuration measures about what the cores
    allow, says so and names the CPU (nas at 2 ms: climbs went on to 30 workers)."""
    tuner = LearnedTuner(
        QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6, max_workers=32
    )
    trace = _closed_loop(
        tuner,
        lambda w, d, k, since: min(0.62, 0.15 * min(w, d)),
        300,
        read_ms=lambda w, d, k: 10.0 * max(1.0, min(w, d) / 4),
        step_ms=2.0,
        cpu_ms=5.0,
        read_cpu_ms=4.8,
        cpu_count=2,
    )
    last = tuner.history[-1][1]
    assert not last.feasible and last.bottleneck == "cpu", last
    limit = "workers' CPU (5.0 ms a batch) on 80% of 2 cores allows at most 0.64"
    assert any(limit in d.reason for _, d in tuner.history), tuner.history
    assert max(w for w, _, _ in trace) <= 6, sorted({(w, d) for w, d, _ in trace})
    assert trace[-1][2] >= 0.6


def _slower_reads_out_of_reach(after: float) -> LearnedTuner:
    """Out of reach at 0.5 (8-batch windows); from batch 150 reads take 40 ms, not 20,
    and utilization reads `after`."""
    tuner = LearnedTuner(
        QueueingModel(),
        target_utilization=0.9,
        memory_budget_bytes=64e6,
        max_workers=32,
        window_services=0,
    )
    _closed_loop(
        tuner,
        lambda w, d, k, since: 0.5 if k < 150 else after,
        250,
        read_ms=lambda w, d, k: 20.0 if k < 150 else 40.0,
        step_ms=2.0,
    )
    return tuner


def test_slower_reads_that_cost_no_utilization_are_no_regime_shift():
    """Out of reach at 0.5, reads go from 20 to 40 ms while utilization stays put: the
    workers' own contention (a shared link whose queue grows), not the storage. No
    re-plan (at nas 2 ms, one for 18 workers' 27 -> 80 ms reads took the most workers
    there are). The same slowdown with utilization falling to 0.3 is one."""

    def shifts(after: float) -> list[Decision]:
        tuner = _slower_reads_out_of_reach(after)
        return [d for b, d in tuner.history if b >= 150 and "regime shift" in d.reason]

    assert shifts(after=0.5) == []
    assert shifts(after=0.3)


def test_a_moderate_slowdown_out_of_reach_buys_a_bounded_memory_step():
    """Out of reach, a moderate slowdown re-plans from what it measured, but as an
    escalation: at most 3x the memory (the plan's "best" out of reach is the most
    workers; at nas 2 ms that took 15/24 to 24/48 in one step)."""
    tuner = _slower_reads_out_of_reach(after=0.3)
    pairs = list(itertools.pairwise(tuner.history))
    shifts = [(b.depth, a.depth) for (_, b), (_, a) in pairs if "regime shift" in a.reason]
    assert shifts and all(after <= 3 * before for before, after in shifts), shifts


@pytest.mark.parametrize(("step_ms", "read_ms", "check"), [(2.0, 20.0, 32), (20.0, 20.0, 8)])
def test_windows_span_service_times_not_batches(step_ms, read_ms, check):
    """A judged window spans at least 4 of the warm-up's service times: 8 batches of a
    2 ms step span one 20 ms read, and windows of one service time read a fixed
    configuration at 0.5 to 0.9 (nas at 2 ms). Long steps keep 8 batches."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    _closed_loop(tuner, lambda w, d, k, since: 0.95, 10, read_ms=read_ms, step_ms=step_ms)
    assert tuner.check_batches == check
    assert tuner.shift_window == check and tuner.shift_batches == check // 2


class _MoreWorkersModel:
    """A model that sees gains up to the most workers (`per_worker` of utilization each),
    as the learned model and first principles did at nas 2 ms, where the cores were
    already busy."""

    utilization_error = 0.05

    def __init__(self, per_worker: float) -> None:
        self.per_worker = per_worker

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        active = frame[["workers", "depth"]].min(axis=1).to_numpy(dtype=float)
        util = np.minimum(1.0, self.per_worker * active)
        return pd.DataFrame(
            {
                "utilization": util,
                "stall_fraction": 1.0 - util,
                "throughput_sps": 1e3 * util,
                "memory_bytes": frame["depth"].to_numpy(dtype=float) * 1e6,
            },
            index=frame.index,
        )


def test_a_speed_up_never_buys_memory():
    """4/8 meets the target; reads get 3x faster, and no configuration reaches it by the
    model's reckoning (nor by first principles'). A re-plan from a model that sees gains
    up to the most workers would buy more (at nas 2 ms, 8/16 -> 29/48 after reads sped
    up as a queue emptied): a faster service needs no more than what kept up."""
    tuner = LearnedTuner(
        _MoreWorkersModel(0.02), target_utilization=0.9, memory_budget_bytes=64e6, start=(4, 8)
    )
    trace = _closed_loop(
        tuner, lambda w, d, k, since: 0.92, 160, read_ms=lambda w, d, k: 600.0 if k < 80 else 200.0
    )
    kept = [d for b, d in tuner.history if "faster service needs no more" in d.reason]
    assert kept and (kept[0].workers, kept[0].depth) == (4, 8), tuner.history
    assert max(d for _, d, _ in trace) == 8


def test_out_of_reach_each_escalation_is_one_measured_step():
    """2/2 met the target, then falls to 0.3 with no slower reads: out of reach by the
    model's reckoning (and first principles', with the implied slower service), an
    escalation climbs one measured step (about 1.5x the workers), not to the model's
    "best", the most workers its memory step allows (6/6 here): that extrapolates from
    a service time that grows with the workers."""
    tuner = LearnedTuner(
        _MoreWorkersModel(0.02), target_utilization=0.9, memory_budget_bytes=64e6, start=(2, 2)
    )
    _closed_loop(tuner, lambda w, d, k, since: 0.95 if k < 40 else 0.3, 120, read_ms=100.0)
    climbs = [
        (before.workers, after.workers)
        for (_, before), (_, after) in itertools.pairwise(tuner.history)
        if "observed utilization" in after.reason and not after.feasible
    ]
    assert climbs, tuner.history
    assert all(after <= math.ceil(1.5 * before) for before, after in climbs), climbs


def test_an_epoch_start_does_not_set_the_cores_bound():
    """An iteration's first batch opens the files: 40 ms of CPU against 4 for the others.
    Counted, it made the cores bound 0.49 (2 x 0.8 x 4 / 13); the warm batches allow
    1.6, so the first plan is not held back by the CPU."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    for k in range(5):
        tuner.decide(
            _state(
                batch_index=k,
                workers=1,
                depth=1,
                step_ms=4.0,
                stall_ms=8.0,
                read_ms=12.0,
                decode_ms=0.0,
                cpu_count=2,
                cpu_ms=40.0 if k == 0 else 4.0,
                read_cpu_ms=40.0 if k == 0 else 4.0,
                epoch_start=k == 0,
                batch_memory_bytes=1e6,
            )
        )
    first = tuner.history[-1][1]
    assert first.feasible and "workers' CPU" not in first.reason, first


def test_a_recovery_during_a_step_down_is_read_at_its_baseline():
    """Reads go from 1000 ms back to 30 just as a step-down from 8 to 6 workers begins:
    the new configuration's baseline is taken in the fast regime. A baseline 5x faster
    with at least 1/1.5 of the workers is no contention effect: a speed-up, re-planned
    at once (unseen, memory came down one step-down at a time: 6.1 MiB at the end of
    the regime-shift run, where 21 workers stepped down to 16 as the slowdown ended)."""
    tuner = LearnedTuner(
        QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6, start=(8, 8)
    )
    _closed_loop(
        tuner,
        lambda w, d, k, since: 0.99,
        200,
        read_ms=lambda w, d, k: 1000.0 if k < 73 else 30.0,
        step_ms=100.0,
    )
    steps = [b for b, d in tuner.history if "step less" in d.reason]
    assert steps and steps[0] == 71, tuner.history  # the step-down the recovery follows
    shifts = [d for b, d in tuner.history if "regime shift" in d.reason]
    assert shifts and shifts[0].workers < 6, tuner.history


def test_a_plateau_waits_for_a_second_window_of_the_new_configuration():
    """2/4 measured 0.61 over two windows; 3/6 reads 0.62 in its first, its buffer
    still filling. That is no proof that more workers stopped paying: one more window
    first (on object-store the verdict held 2/4 at 0.61 for a whole run, where 3/6 and
    4/8 reach 0.9)."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    for k in range(5):  # the warm-up and a first decision, for the stage times
        tuner.decide(_state(batch_index=k, step_ms=20.0, stall_ms=12.0, read_ms=60.0))
    tuner._current = Decision(3, 6, "escalated", {"utilization": 0.95})
    tuner._move = "plan"
    n = tuner.check_batches  # one window (more than 8 here: windows span service times)
    tuner._measured = {(2, 4): Measured(), (3, 6): Measured()}
    for _ in range(2 * n):  # steady batches: no noise to discount
        tuner._measured[(2, 4)].add(_state(workers=2, depth=4, step_ms=20.0, stall_ms=12.8))
    for _ in range(n):
        tuner._measured[(3, 6)].add(_state(workers=3, depth=6, step_ms=20.0, stall_ms=12.3))
    state = _state(batch_index=40, workers=3, depth=6, step_ms=20.0, stall_ms=12.0, read_ms=60.0)
    decision = tuner._escalate(state, 0.62)
    assert (decision.workers, decision.depth) == (3, 6), decision
    assert "stopped paying" not in decision.reason
    for _ in range(n):  # a second window, still short
        tuner._measured[(3, 6)].add(_state(workers=3, depth=6, step_ms=20.0, stall_ms=12.3))
    decision = tuner._escalate(state, 0.62)
    assert "stopped paying" in decision.reason and (decision.workers, decision.depth) == (2, 4)


def _plateau_after(swinging: bool) -> Decision:
    """3/6 measured 0.70 over two steady windows, 2/4 0.67 over one (20 ms steps), its
    batches waiting 10 ms each or, `swinging`, 20 ms and none by turns: the escalation's
    decision."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    for k in range(5):  # the warm-up and a first decision, for the stage times
        tuner.decide(_state(batch_index=k, step_ms=20.0, stall_ms=12.0, read_ms=60.0))
    tuner._current = Decision(3, 6, "escalated", {"utilization": 0.95})
    tuner._move = "plan"
    tuner._measured = {(2, 4): Measured(), (3, 6): Measured()}
    n = tuner.check_batches  # one window (more than 8 here: windows span service times)
    for stall in [20.0, 0.0] * ((n + 1) // 2) if swinging else [10.0] * n:
        tuner._measured[(2, 4)].add(_state(workers=2, depth=4, step_ms=20.0, stall_ms=stall))
    for _ in range(2 * n):
        tuner._measured[(3, 6)].add(_state(workers=3, depth=6, step_ms=20.0, stall_ms=8.57))
    state = _state(batch_index=40, workers=3, depth=6, step_ms=20.0, stall_ms=8.57, read_ms=60.0)
    return tuner._escalate(state, 0.70)


def test_one_lucky_window_of_fewer_workers_is_no_plateau():
    """2/4 read 0.67 in one window, 3/6 0.70 over two: within 10 %, so more workers look
    as if they stopped paying. When 2/4's batches were steady that holds; when they
    swung between waiting 20 ms and not at all, 0.67 is within chance of far less, and
    the tuner climbs (on object-store such a window held 3/6 at 0.80 for a whole run,
    where 4/8 reads 0.95)."""
    steady = _plateau_after(swinging=False)
    assert "stopped paying" in steady.reason, steady
    swinging = _plateau_after(swinging=True)
    assert "stopped paying" not in swinging.reason, swinging
    assert swinging.depth > 6 or swinging.workers > 3, swinging


def test_a_speed_up_kept_at_a_ceiling_is_judged_afresh():
    """At a ceiling (out of reach, holding), reads get 3x faster and the re-plan would
    buy more: the configuration is kept, but under the new regime the old ceiling no
    longer holds, so a later shortfall escalates instead of holding for good."""
    tuner = LearnedTuner(_MoreWorkersModel(0.02), target_utilization=0.9, memory_budget_bytes=64e6)
    for k in range(5):
        tuner.decide(_state(batch_index=k, step_ms=10.0, stall_ms=10.0, read_ms=600.0))
    tuner._current = Decision(4, 8, "target 0.90 is out of reach", {"utilization": 0.5})
    tuner._move = "ceiling"
    state = _state(batch_index=40, workers=4, depth=8, step_ms=10.0, stall_ms=1.0, read_ms=200)
    kept = tuner._replan_for_shift(state, before=600.0, now=200.0, fresh=4, large=False)
    assert (kept.workers, kept.depth) == (4, 8) and "no more than this" in kept.reason
    later = tuner._escalate(state, 0.5)
    assert later.workers > 4 and not later.reason.startswith("holding"), later


def _jittered_read(w: int, d: int, k: int) -> float:
    """60 ms reads, every other one 20 ms late (40, 80, 40, ...): depth pays."""
    return 80.0 if k % 2 else 40.0


def _deep_enough(w: int, d: int, k: int, since: int) -> float:
    """Workers keep up from 3 (60 ms against 20 ms steps); 0.97 at depth 8, 0.85 below."""
    return min(0.97, min(w, d) * 20.0 / 60.0) * (1.0 if d >= 8 else 0.85)


def test_a_speed_up_back_to_where_a_configuration_fell_short_keeps_it_short():
    """A shift clears what was measured under the old regime, but a configuration that
    fell short at a service no faster than the new one still falls short. On
    object-store a "speed-up" (104 -> 58 ms, lognormal reads) cleared 4 / 6 and 4 / 4,
    short at about 58 ms, and the step-downs tried both again (0.89 over the last
    third, where 4 / 8 reads 0.95). Clearly faster than where it fell short, it is
    tried again."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    _closed_loop(tuner, _deep_enough, 110, read_ms=_jittered_read, step_ms=20.0)
    assert tuner.history[-1][1].depth == 8 and (4, 6) in tuner._short  # stepped down, back
    short_at = tuner._short[(4, 6)]
    state = _state(batch_index=110, workers=4, depth=8, step_ms=20.0, batch_memory_bytes=1e6)
    tuner._replan_for_shift(state, before=1.8 * short_at, now=short_at, fresh=4, large=False)
    assert (4, 6) in tuner._short
    tuner._replan_for_shift(state, before=short_at, now=short_at / 2, fresh=4, large=False)
    assert (4, 6) not in tuner._short


def _nas_tokens(
    k: int, config: tuple[int, int], read_ms: float, stall_ms: float, **over
) -> TunerState:
    """Batch `k` of token rows on nas at a 3.1 ms step, 2 cores: the first batch starts
    the pipeline (no step, an epoch start)."""
    return _state(
        batch_index=k,
        workers=config[0],
        depth=config[1],
        step_ms=0.0 if k == 0 else 3.1,
        stall_ms=stall_ms,
        read_ms=read_ms,
        decode_ms=0.0,
        cpu_count=2,
        epoch_start=k == 0,
        **over,
    )


def test_the_pipelines_first_batch_buys_no_depth():
    """nas at 3 ms: the first batch starts the pipeline (10-21 ms against 7-8 ms after).
    Counted as a late batch it made the first plan 3 workers at depth 6, where 3 / 3
    holds 0.92-0.94; left out, the plan covers the batches being built."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=GiB)
    reads = [17.2, 7.6, 7.2, 7.6, 7.2]
    for k, read in enumerate(reads):
        decision = tuner.decide(_nas_tokens(k, (1, 1), read, stall_ms=read))
    assert decision.workers == 3 and decision.depth <= 4, decision


def test_settling_counts_from_when_a_change_takes_effect():
    """On the tuner's own thread a plan lands batches after it was decided (5 at nas
    3 ms), and new workers' first batches are slow (26-29 ms against 7-8). Counted from
    the decision, the settle was spent before the new workers began: their first batches
    were judged, the window read 0.5, and the tuner bought 4 / 8 where 3 / 3 holds 0.95.
    Counted from the first batch at the new configuration, it holds what it planned."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=GiB)
    lag, config, pending, seen_at = 5, (1, 1), None, None
    decisions = []
    for k in range(90):
        if pending is not None and k >= pending[0]:
            config, pending, seen_at = pending[1], None, k
        fresh = seen_at is not None and k - seen_at in (1, 2)  # new workers' first batches
        if config == (1, 1):
            read, stall = (17.2, 17.2) if k == 0 else (7.4, 4.3)
        else:
            read, stall = (28.0, 24.0 if k - seen_at == 1 else 0.1) if fresh else (7.4, 0.05)
        decision = tuner.decide(_nas_tokens(k, config, read, stall, batch_memory_bytes=1e6))
        wanted = (decision.workers, decision.depth)
        if wanted != config and (pending is None or pending[1] != wanted):
            pending = (k + 1 + (lag if k > 0 else 0), wanted)
            decisions.append((k, wanted))
    first = decisions[0][1]
    assert first[0] >= 2 and first[1] <= 4, decisions
    # Later changes may step down; none buys more than the first plan's memory.
    assert all(d <= first[1] and w <= first[0] for _, (w, d) in decisions), decisions
