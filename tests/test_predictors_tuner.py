"""Tuners on the SYNTHETIC simulated loader (`benchmarks.tuner_lab.synthetic`), judged by outcomes:
utilization over the last third, memory against a measured oracle, reaction to a
tenfold slowdown. Scenarios are drawn at random from families
(`benchmarks/scenarios.py`) with test seeds (500 on) that are neither the development
nor the held-out range."""

from __future__ import annotations

import dataclasses
import doctest

import numpy as np
import pandas as pd
import pytest

from benchmarks.scenarios import draw, oracle, recovery_batches, time_weighted_utilization
from benchmarks.tuner_lab.synthetic import SimulatedLoader, SimWorkload, run_tuner, tuner_state
from benchmarks.tuner_lab.synthetic import measure as measure_static
from predictors import measure
from predictors.baselines import HillClimbTuner, OracleTuner, QueueingModel, StaticDefaultTuner
from predictors.errors import TunerConfigError
from predictors.measure import ChangeDetector
from predictors.state import TunerState, name_bottleneck
from predictors.tuner import LearnedTuner, QueueingTuner

pytestmark = pytest.mark.lab  # the lab's simulator (benchmarks/tuner_lab)

GiB = 2**30
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


def _learned(scenario, model=None, **options) -> LearnedTuner:
    return LearnedTuner(
        model or QueueingModel(),
        target_utilization=scenario.target,
        memory_budget_bytes=scenario.budget,
        max_workers=16,
        **options,
    )


@pytest.mark.parametrize("target", [0.0, 1.0, 1.5, -0.1, True])
def test_target_outside_open_unit_interval_is_refused(target):
    with pytest.raises(TunerConfigError, match=r"between 0 and 1.*0\.9"):
        LearnedTuner(QueueingModel(), target_utilization=target)


@pytest.mark.parametrize("headroom", [0.5, float("nan")])
def test_shift_headroom_below_one_is_refused(headroom):
    with pytest.raises(TunerConfigError, match="shift_headroom"):
        LearnedTuner(QueueingModel(), shift_headroom=headroom)


@pytest.mark.parametrize("batches", [-1, float("nan")])
def test_negative_burst_batches_are_refused(batches):
    with pytest.raises(TunerConfigError, match="burst_batches"):
        LearnedTuner(QueueingModel(), burst_batches=batches)


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


def test_oracle_picks_least_memory_meeting_the_target():
    sweep = pd.DataFrame(
        [measure_static(TOKENS, w, d, n_batches=60) for w in (1, 2, 4, 8) for d in (1, 2, 4, 8)]
    )
    oracle_tuner = OracleTuner(sweep, target_utilization=0.85)
    d = oracle_tuner.decide(_state())
    ok = sweep[sweep["utilization"] >= 0.85]
    assert d.feasible and d.predicted["memory_bytes"] == ok["memory_bytes"].min()
    with pytest.raises(TunerConfigError, match="budget"):
        OracleTuner(sweep, memory_budget_bytes=1.0)


def test_hill_climber_respects_the_budget():
    budget = 4 * TOKENS.memory_factor * TOKENS.batch_bytes
    trace = run_tuner(HillClimbTuner(memory_budget_bytes=budget), TOKENS, 150)
    assert trace["bound_bytes"].max() <= budget
    assert trace["depth"].max() <= 4


def test_worked_examples_in_the_docstrings_hold() -> None:
    assert doctest.testmod(measure).failed == 0


# Randomized scenarios: one draw per family, fixed test seeds, judged as a whole.
STEADY = ["storage-threads", "storage-processes", "cpu-decode", "heavy-tail", "tight-budget"]


@pytest.fixture(scope="module")
def steady_outcomes() -> list[dict]:
    rows = []
    for family in STEADY:
        for seed in (500, 501):
            s = draw(family, seed)
            trace = run_tuner(_learned(s), s.workload, s.batches, seed=7)
            torch = run_tuner(StaticDefaultTuner(), s.workload, s.batches, seed=7)
            hill = run_tuner(
                HillClimbTuner(memory_budget_bytes=s.budget, max_workers=16),
                s.workload,
                s.batches,
                seed=7,
            )
            last = slice(2 * s.batches // 3, None)
            rows.append(
                {
                    "scenario": (family, seed),
                    "target": s.target,
                    "budget": s.budget,
                    "learned": time_weighted_utilization(trace.iloc[last]),
                    "torch": time_weighted_utilization(torch.iloc[last]),
                    "hill": time_weighted_utilization(hill.iloc[last]),
                    "memory": trace["bound_bytes"].iloc[last].max(),
                    "peak": trace["bound_bytes"].max(),
                    "oracle": oracle(s),
                }
            )
    return rows


def test_on_random_scenarios_it_meets_the_target_where_the_oracle_can(steady_outcomes):
    feasible = [r for r in steady_outcomes if r["oracle"]["feasible"]]
    assert len(feasible) >= 6
    met = [r for r in feasible if r["learned"] >= r["target"] - 0.01]
    assert len(met) >= len(feasible) - 1, [(r["scenario"], r["learned"]) for r in feasible]


def test_on_random_scenarios_its_memory_is_near_the_oracles(steady_outcomes):
    feasible = [r for r in steady_outcomes if r["oracle"]["feasible"]]
    ratios = [r["memory"] / r["oracle"]["memory"] for r in feasible]
    assert np.median(ratios) <= 1.1, ratios
    assert all(r["peak"] <= r["budget"] for r in steady_outcomes)


def test_on_random_scenarios_it_is_rarely_worse_than_torchs_default(steady_outcomes):
    """Up to the target: above it, less memory is the point. The goal is never more
    than 0.02 below; it is missed where each worker's service grows with the workers
    (CPU-bound decode on a shared link: the prior takes the wait as fixed), one of
    these ten (benchmarks/results/scenarios-*.md counts it on more)."""
    worse = [
        (r["scenario"], round(r["learned"], 3), round(r["torch"], 3))
        for r in steady_outcomes
        if min(r["learned"], r["target"]) < min(r["torch"], r["target"]) - 0.02
    ]
    assert len(worse) <= 1, worse


# 504 and 505 need more workers than the slowdown alone says (the link is shared):
# planned for the service as measured they took two steps, 21-24 batches. 521, 545
# and 646 start at depth 1-2 and need 16 or more: bounded to 8x a step, 24.
@pytest.mark.parametrize("seed", [500, 501, 504, 505, 521, 545, 646])
def test_after_a_tenfold_slowdown_it_recovers_and_then_releases_memory(seed):
    s = draw("shift", seed)
    tuner = _learned(s)
    trace = run_tuner(tuner, s.workload, s.batches, slowdown=s.slowdown, seed=7)
    begin, end, _ = s.slowdown
    busy = (trace["step_ms"] + trace["stall_ms"]).rolling(8).sum()
    rolling = (trace["step_ms"].rolling(8).sum() / busy).loc[begin:end]
    dipped = rolling[rolling < s.target]
    if len(dipped):
        back = rolling.loc[dipped.index[0] :]
        back = back[back >= s.target]
        assert len(back) and back.index[0] - dipped.index[0] <= 20, rolling.round(2).tolist()
    during = trace.loc[begin:end, "bound_bytes"].max()
    assert trace.loc[end + 60 :, "bound_bytes"].max() < during
    assert any("regime shift" in d.reason for _, d in tuner.history)


def test_headroom_after_a_slowdown_of_any_size_never_delays_recovery():
    # The family, not the tenfold case alone: 3x (no headroom: below LARGE_SLOWDOWN),
    # 5x and 20x slowdowns, each run with and without the headroom.
    faster = 0
    for factor in (3.0, 5.0, 20.0):
        for seed in range(510, 520):
            s = dataclasses.replace(draw("shift", seed), slowdown=(110, 220, factor))
            took = []
            for headroom in (1.0, 1.5):
                tuner = _learned(s, shift_headroom=headroom)
                trace = run_tuner(tuner, s.workload, s.batches, slowdown=s.slowdown, seed=7)
                took.append(recovery_batches(trace, s))
            without, with_headroom = (999 if t is None else t for t in took)
            assert with_headroom <= without, (factor, seed, took)
            faster += with_headroom < without
    assert faster >= 3


def test_a_burst_that_ends_is_ridden_out_not_chased():
    """Bursty reads (a slow state a few batches long): once a burst ends, its batches
    join the regime before it, so the depth that rides the next one out is kept.
    Judged on the family (twenty bursty draws), against the same tuner that reads
    every burst's end as a new regime (`burst_batches=0`)."""
    met = {0: 0, 40: 0}
    total = {0: 0.0, 40: 0.0}
    for seed in range(520, 540):
        s = draw("bursty", seed)
        for burst_batches in met:
            tuner = _learned(s, burst_batches=burst_batches)
            trace = run_tuner(tuner, s.workload, s.batches, seed=7)
            util = time_weighted_utilization(trace.iloc[2 * s.batches // 3 :])
            met[burst_batches] += util >= s.target
            total[burst_batches] += util
            assert trace["bound_bytes"].max() <= s.budget
    assert met[40] >= met[0] + 3, met
    assert total[40] > total[0], total


class _MoreWorkersDoNotHelp:
    """A learned model that extrapolates that more workers do not help (what the
    shipped model said of a storage-bound Dataset), trusted fully (weight 1)."""

    utilization_error = 0.1
    correction_weight = 1.0

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        util = np.full(len(frame), 0.5)
        return pd.DataFrame(
            {
                "throughput_sps": util,
                "stall_fraction": 1 - util,
                "utilization": util,
                "memory_bytes": frame["depth"] * 1e6,
            },
            index=frame.index,
        )


def test_a_pessimistic_model_is_a_bounded_correction_never_a_veto():
    """Storage-latency-bound reads, a step several times shorter than the service,
    process workers: Little's law says enough workers reach the target; a model that
    says otherwise moves the prediction by at most its error, and what is measured
    decides."""
    s = draw("storage-processes", 502)
    trace = run_tuner(_learned(s, _MoreWorkersDoNotHelp()), s.workload, s.batches, seed=7)
    assert time_weighted_utilization(trace.iloc[2 * s.batches // 3 :]) >= s.target - 0.01
    assert trace["workers"].iloc[-1] >= 2


def test_infeasible_target_names_the_bottleneck():
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=GiB)
    trace = run_tuner(tuner, HEAVY_DECODE, 60)
    last = tuner.history[-1][1]
    assert not last.feasible and last.bottleneck == "decode"
    assert "out of reach" in last.reason and "decode" in last.reason
    assert time_weighted_utilization(trace.iloc[30:]) > 0.15  # still does the best it can


def test_a_target_judged_unreachable_from_a_tail_is_planned_again_once_it_is_not():
    """On run seed 9 the first batches of every heavy-tail scenario carry a Pareto read
    tens of times the mean (the family shares one noise path): heavy-tail 503 judged
    the target out of reach from one worker's inflated mean and, with that read in
    every later plan's lateness, never planned for it again (0.78 at three quarters of
    its budget before `near_best` 0.02, 0.47 at depth 3 after; torch's default: 0.37).
    The service measured since is a fifth of what the verdict assumed, so the plan is
    remade (`recheck_factor`) and the target is met within half the budget."""
    s = draw("heavy-tail", 503)
    tuner = _learned(s)
    trace = run_tuner(tuner, s.workload, s.batches, seed=9)
    last = trace.iloc[2 * s.batches // 3 :]
    assert not tuner.history[1][1].feasible  # the verdict the tail caused
    assert tuner.history[-1][1].feasible
    assert time_weighted_utilization(last) >= s.target - 0.01
    assert last["bound_bytes"].max() <= s.budget / 2


def test_infeasible_storage_bound_within_a_small_budget():
    small = 3 * TOKENS.memory_factor * TOKENS.batch_bytes  # at most depth 3
    slow = SimWorkload(**{**TOKENS.__dict__, "storage_latency_ms": 50.0})
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=small)
    trace = run_tuner(tuner, slow, 60)
    last = tuner.history[-1][1]
    assert not last.feasible and last.bottleneck == "storage"
    assert trace["bound_bytes"].max() <= small


def test_reads_that_keep_the_cores_busy_are_named_cpu_not_storage():
    m = {"read_ms": 19.0, "decode_ms": 0.0, "transform_ms": 0.2, "step_ms": 2.0}
    busy = {**m, "stall_ms": 1.3, "cpu_ms": 5.2, "read_cpu_ms": 5.0}
    assert name_bottleneck(busy, cpu_count=2) == "cpu"
    assert name_bottleneck({**busy, "stall_ms": 40.0}, cpu_count=2) == "storage"
    assert name_bottleneck({**busy, "decode_ms": 30.0, "read_cpu_ms": 0.5}, cpu_count=2) == "decode"
    assert name_bottleneck({**m, "stall_ms": 1.3}, cpu_count=2) == "storage"


def _closed_loop(tuner: LearnedTuner, utilization, batches: int, **state) -> list[tuple]:
    """Drive `tuner` where `utilization(workers, depth, k)` is what batch k measures.
    Returns (workers, depth, utilization) per batch."""
    workers, depth = tuner.start
    out = []
    for k in range(batches):
        util = utilization(workers, depth, k)
        s = _state(
            batch_index=k,
            workers=workers,
            depth=depth,
            stall_ms=10.0 * (1 / util - 1),
            **{"decode_ms": 0.0, "batch_memory_bytes": 1e6, "read_ms": 2.0, **state},
        )
        out.append((workers, depth, util))
        decision = tuner.decide(s)
        workers, depth = decision.workers, decision.depth
    return out


def test_a_service_cost_the_stage_times_do_not_show_is_learned_from_the_shortfall():
    """Stage times say 2 ms a batch; each batch really takes 70 ms of a worker (retries,
    faults): 7 busy workers are needed for 0.9. The measured shortfall calibrates the
    rate, and the tuner climbs there, without running to the budget."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, lambda w, d, k: min(1.0, min(w, d) * 10.0 / 70.0), 120)
    assert all(u >= 0.9 for _, _, u in trace[-30:]), trace[-30:]
    assert max(d for _, d, _ in trace) <= 24


def test_a_start_that_measures_the_target_is_kept():
    """The stage times say 30 ms against a 10 ms step, but the start measures 0.97:
    memory is bought for a measured shortfall, not for a predicted one."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    trace = _closed_loop(tuner, lambda w, d, k: 0.97, 60, read_ms=30.0)
    assert {(w, d) for w, d, _ in trace} == {(1, 1)}, trace


def test_epoch_starts_are_no_sample():
    """Every 6th batch waits 200 ms for an empty pipeline, whatever the configuration;
    the others measure 0.99. The waits must not buy memory."""
    tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=64e6)
    workers, depth, seen = 1, 1, set()
    for k in range(90):
        first = k % 6 == 0
        state = _state(
            batch_index=k,
            workers=workers,
            depth=depth,
            stall_ms=200.0 if first else 0.1,
            read_ms=2.0,
            decode_ms=0.0,
            batch_memory_bytes=1e6,
            epoch_start=first,
        )
        decision = tuner.decide(state)
        workers, depth = decision.workers, decision.depth
        seen.add((workers, depth))
    assert seen == {(1, 1)}, seen


def test_the_change_detector_reads_a_tenfold_shift_fast_and_jitter_rarely():
    rng = np.random.default_rng(0)
    detector = ChangeDetector()
    steady = 20 * rng.lognormal(0, 0.3, 2000)
    alarms = sum(detector.update(x) is not None for x in steady)
    assert alarms <= 2
    detector.reset()
    for x in 20 * rng.lognormal(0, 0.3, 8):
        detector.update(x)
    slow = [detector.update(x) for x in 200 * rng.lognormal(0, 0.3, 6)]
    assert "slower" in slow[:4], slow


def _alarms(detector: ChangeDetector, services) -> list[tuple[int, str]]:
    return [(i, a) for i, x in enumerate(services) if (a := detector.update(x)) is not None]


def test_a_slowdown_that_ends_while_its_alarm_is_answered_is_read():
    # The alarm's batches were slow; the reference set after it is back where it began
    # (the slow batches in flight ran out while the tuner answered): a second shift.
    rng = np.random.default_rng(1)
    detector = ChangeDetector()
    before = 20 * rng.lognormal(0, 0.2, 8)
    slow = 200 * rng.lognormal(0, 0.2, 6)
    back = 20 * rng.lognormal(0, 0.2, 8)
    alarms = _alarms(detector, [*before, *slow, *back])
    assert [a for _, a in alarms] == ["slower", "faster"], alarms
    # A slowdown that grows while it is answered (more readers on a shared link) is
    # the new regime settling, not a second shift.
    detector = ChangeDetector()
    worse = 300 * rng.lognormal(0, 0.2, 8)
    alarms = _alarms(detector, [*before, *slow, *worse])
    assert [a for _, a in alarms] == ["slower"], alarms
    # A recovery whose alarm came on the last slow batches draining: the reference,
    # far faster still, is the regime the plans must start from.
    detector = ChangeDetector()
    draining = 120 * rng.lognormal(0, 0.2, 8)
    alarms = _alarms(detector, [*slow, *slow, *draining, *before])
    assert [a for _, a in alarms] == ["faster", "faster"], alarms


# Deep pipelines: the slowdown's batches in flight ran out while its end's alarm (or
# a late slower one) was answered, and the memory bought for it stayed.
@pytest.mark.parametrize("seed", [726, 841, 863])
def test_memory_is_released_after_a_slowdown_whose_end_came_late(seed):
    s = draw("shift", seed)
    trace = run_tuner(_learned(s), s.workload, s.batches, slowdown=s.slowdown, seed=7)
    begin, end, _ = s.slowdown
    during = trace.loc[begin:end, "bound_bytes"].max()
    assert trace.loc[end + 60 :, "bound_bytes"].max() < during


def test_a_static_choice_with_hindsight_takes_the_least_memory_that_meets_the_goal():
    from benchmarks.scenario_limits import clairvoyant

    def row(memory, workers, long_run, first):
        return {"memory": memory, "workers": workers, "runs": [first] + [long_run] * 9, "run": 0}

    rows = [
        row(1, 1, 0.85, 0.85),
        row(2, 1, 0.92, 0.92),
        row(2, 2, 0.95, 0.93),
        row(4, 2, 0.99, 0.99),
    ]
    picked = clairvoyant(rows, 0.9, known=10)
    assert (picked["memory"], picked["workers"]) == (2, 2)  # the best of the least memory
    assert clairvoyant(rows, 0.96, known=10)["memory"] == 4
    assert clairvoyant(rows, 0.94, known=1)["memory"] == 4  # one run known: 2 read 0.93
    assert clairvoyant(rows, 1.5, known=10)["memory"] == 4  # nothing meets: the best


@pytest.mark.parametrize("family", ["heavy-tail", "storage-threads"])
def test_each_decision_says_what_the_prior_predicted_and_what_the_model_changed(family):
    """Per decision: the prior's utilization for the chosen configuration, the model's
    change to it and its sd, in numbers (`predicted`) and in words (`reason`). Without
    a model the change is 0."""
    scenario = draw(family, 3)
    tuner = _learned(scenario, QueueingModel())
    run_tuner(tuner, scenario.workload, scenario.batches, seed=7)
    decisions = [d for _, d in tuner.history[1:]]
    assert decisions, "the tuner never changed the configuration"
    for d in decisions:
        part = d.predicted
        assert 0.0 <= part["prior_utilization"] <= 1.0
        assert part["model_change"] == 0.0 and part["model_sd"] == 0.0
        assert f"prior {part['prior_utilization']:.2f}" in d.reason
        assert "no model" in d.reason
    assert tuner.model_part.startswith("none")
    table = tuner.candidate_table()  # the last plan, every candidate: plain rows
    assert table and all(row["model_change"] == 0 and row["model_sd"] == 0 for row in table)
    assert {(row["workers"], row["depth"]) for row in table} >= {
        (d.workers, d.depth) for d in decisions
    }


def test_user_settings_are_few_and_constants_are_no_keyword():
    from predictors.config import CONSTANTS, TunerConfig, TunerConstants

    tuner = LearnedTuner(QueueingModel(), confidence=0.8, max_step=4.0)
    assert tuner.config == dataclasses.replace(TunerConfig(), confidence=0.8, max_step=4.0)
    assert tuner.constants is CONSTANTS
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuner.config.confidence = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuner.constants.saturated = 0.9  # type: ignore[misc]
    with pytest.raises(TunerConfigError, match=r"Unknown tuner parameter.*confidense"):
        LearnedTuner(QueueingModel(), confidense=0.8)
    # A constant is no keyword; the lab replaces it with `constants=`.
    with pytest.raises(TunerConfigError, match=r"saturated.*are constants"):
        LearnedTuner(QueueingModel(), saturated=0.95)
    lab = QueueingTuner(constants=dataclasses.replace(CONSTANTS, saturated=0.95))
    assert lab.constants.saturated == 0.95
    with pytest.raises(TunerConfigError, match="recheck_factor"):
        TunerConstants(recheck_factor=0.5)
    assert len(dataclasses.fields(TunerConfig)) <= 8


def test_the_old_name_is_the_queueing_tuner():
    import predictors
    from predictors.tuner import LearnedTuner as Old
    from predictors.tuner import QueueingTuner as New

    assert Old is New and predictors.LearnedTuner is predictors.QueueingTuner is New


def test_forecaster_detector_and_summarize_take_their_numbers_from_the_config():
    """One source of each number: built without arguments, each holds the config's
    and the constants' values, not a second copy of its own."""
    from predictors.config import CONSTANTS, TunerConfig
    from predictors.forecast import Forecaster
    from predictors.measure import Measured, summarize

    config = TunerConfig()
    forecaster = Forecaster(target=0.9, budget=None, max_workers=None)
    assert forecaster.confidence == config.confidence
    assert forecaster.near_best == CONSTANTS.near_best
    assert forecaster.cores_share == CONSTANTS.cores_share
    assert forecaster.prior_error == CONSTANTS.prior_error
    detector = ChangeDetector()
    assert detector.threshold == config.shift_threshold
    assert (detector.drift, detector.clip) == (CONSTANTS.detector_drift, CONSTANTS.detector_clip)
    assert detector.reference_batches == CONSTANTS.detector_reference
    assert detector.min_sigma == CONSTANTS.detector_min_sigma
    assert detector.large == CONSTANTS.large_slowdown
    record = Measured()
    assert (record.block, record.keep, record.unknown) == (
        CONSTANTS.record_block,
        CONSTANTS.record_keep,
        CONSTANTS.record_unknown_error,
    )
    # summarize's default share of the cores is the constants' (a second copy moved it).
    states = [_state(batch_index=i, cpu_ms=4.0, workers=4, depth=4) for i in range(8)]
    assert summarize(states) == summarize(states, CONSTANTS.cores_share)
    assert summarize(states) != summarize(states, CONSTANTS.cores_share / 2)
    # The tuner hands its own settings on.
    tuner = QueueingTuner(confidence=1.5, shift_threshold=6.0)
    assert tuner.forecaster.confidence == 1.5 and tuner.detector.threshold == 6.0


def _settled(workload: SimWorkload, workers: int, batches: int = 40) -> list[TunerState]:
    """Settled batches of a static configuration on the simulator, as a tuner reads them."""
    loader = SimulatedLoader(workload, workers, workers, seed=3)
    records = [loader.next_batch() for _ in range(batches + 4)][4:]
    return [tuner_state(r, i, workload) for i, r in enumerate(records)]


@pytest.mark.parametrize(("cores", "bursty"), [(2.0, False), (1.6, False), (2.0, True)])
def test_the_cores_share_is_learned_from_decode_time_over_its_cpu(cores, bursty):
    # Decode-bound on 2 cores: process workers use both (share 1), threads held by
    # Python's lock 1.6 (share 0.8). Bursts slow the reads, not the share learned.
    extra = {"burst_prob": 0.2, "burst_factor": 5.0} if bursty else {}
    workload = dataclasses.replace(HEAVY_DECODE, cores=cores, **extra)
    grid = np.linspace(0.4, 1.0, 13)
    states = _settled(workload, 2) + _settled(workload, 8)
    learned = measure.fit_cores_share(states, 0.8, 0.15, 0.05, 8, 8, grid)
    assert abs(learned - cores / workload.cpu_count) <= 0.05
    # One worker count says nothing of it, and neither does a run without its CPU.
    assert measure.fit_cores_share(_settled(workload, 4), 0.8, 0.15, 0.05, 8, 8, grid) == 0.8
    blind = [dataclasses.replace(s, cpu_ms=None) for s in states]
    assert measure.fit_cores_share(blind, 0.8, 0.15, 0.05, 8, 8, grid) == 0.8


def test_a_warm_run_rides_out_the_bursts_its_history_has_seen():
    """Bursty reads, the third run of each of ten draws with the two before as its
    history: a slowdown the pooled services already reached is no regime shift, so the
    run neither chases it with depth nor drops the batches that sized the depth. Judged
    against the same tuner that reads every such burst as a regime
    (`known_burst_share` above 1)."""
    from benchmarks.tuner_history_study import drive, records_of
    from predictors.config import CONSTANTS
    from predictors.history import WarmStart

    chased = dataclasses.replace(CONSTANTS, known_burst_share=2.0)
    peak = {"known": 0, "chased": 0}
    util = {"known": 0.0, "chased": 0.0}
    for seed in range(520, 530):
        s = draw("bursty", seed)
        options = dict(target_utilization=s.target, memory_budget_bytes=s.budget, max_workers=16)
        records = []
        for k in (1, 2):
            warm = WarmStart.from_records(records, s.target, memory_budget=s.budget)
            _, states = drive(s, QueueingTuner(warm=warm, explore=None, **options), 100 + k)
            records += records_of(f"run{k}", states, s, k)
        warm = WarmStart.from_records(records, s.target, memory_budget=s.budget)
        for name, constants in (("known", CONSTANTS), ("chased", chased)):
            tuner = QueueingTuner(warm=warm, explore=None, constants=constants, **options)
            metrics, states = drive(s, tuner, 103)
            peak[name] += max(x.depth for x in states)
            util[name] += metrics["utilization"]
    assert peak["known"] < 0.9 * peak["chased"], peak
    assert util["known"] >= util["chased"], util


@pytest.mark.parametrize("burst, expected", [(None, 4), (3.25, 14), (6.0, 8)])
def test_workers_that_cost_no_memory_are_sized_for_the_bursts_measured(burst, expected):
    """Storage-bound reads at 40 ms, a 10 ms step, depth 16 within the budget: every
    worker count from 4 up meets the target alike. Steady services take the fewest; with
    one batch in ten four times slower, the fewest that keep up at that service (14:
    14 x 10 ms over 40.6 x 3.25 ms), so a burst is ridden out by the workers as well as
    by the depth; with bursts no count keeps up at, the most headroom up to one per
    core (8)."""
    from predictors.forecast import Forecaster
    from predictors.measure import Service

    relative = [1.0] * 100 if burst is None else ([0.75] * 9 + [burst]) * 10
    est = Service(
        service_ms=40.0, spread=0.3, cpu_ms=0.5, step_ms=10.0, active=4, samples=100,
        wait_ms=39.5, cpu_count=8, relative=tuple(relative),
    )  # fmt: skip
    forecaster = Forecaster(target=0.9, budget=16.0, max_workers=16)
    grid = [(w, 16) for w in range(4, 17)]
    ones = np.ones(len(grid))
    choice = forecaster.choose(
        grid, ones, ones, goal=0.9, batch_bytes=1.0, est=est, cpu_count=8, allowed=ones > 0
    )
    assert choice.workers == expected


def _warm_bursty(seed: int, runs: int = 2):
    """A bursty draw and the warm start its first `runs` runs give (cold, then warm)."""
    from benchmarks.tuner_history_study import drive, records_of
    from predictors.history import WarmStart

    s = draw("bursty", seed)
    options = dict(target_utilization=s.target, memory_budget_bytes=s.budget, max_workers=16)
    records: list = []
    for k in range(1, runs + 1):
        warm = WarmStart.from_records(records, s.target, memory_budget=s.budget)
        _, states = drive(s, QueueingTuner(warm=warm, explore=None, **options), 100 + k)
        records += records_of(f"run{k}", states, s, k)
    return s, options, WarmStart.from_records(records, s.target, memory_budget=s.budget)


def test_a_warm_run_keeps_a_bursty_history_through_a_burst_in_its_first_batches():
    """Bursty reads, the third run of ten draws on three run seeds each: a burst among a
    warm run's first batches (or a reference taken from one) is what its history
    measured, not another workload, so the history stands (before: set aside in about
    half the bursty warm runs of the dev seeds, and then the run planned as a cold one).
    A workload ten times slower than its bursty history is still another workload."""
    from benchmarks.tuner_history_study import drive

    kept = runs = 0
    for seed in range(520, 530):
        s, options, warm = _warm_bursty(seed)
        for run_seed in (103, 104, 105):
            tuner = QueueingTuner(warm=warm, explore=None, **options)
            drive(s, tuner, run_seed)
            kept += tuner.warm_set_aside is None
            runs += 1
        slower = dataclasses.replace(s, workload=_slower_storage(s.workload, 10.0))
        tuner = QueueingTuner(warm=warm, explore=None, **options)
        drive(slower, tuner, 103)
        assert (tuner.warm_set_aside or "").startswith("regime shift (slower)"), seed
    assert kept >= runs - 2, (kept, runs)


def _slower_storage(workload: SimWorkload, factor: float) -> SimWorkload:
    return dataclasses.replace(workload, storage_latency_ms=workload.storage_latency_ms * factor)


def test_a_warm_run_sets_its_history_aside_when_a_known_burst_does_not_end():
    """Bursty reads, ten draws: a run whose storage serves three times slower than its
    history throughout is slowed within the range of the bursts the history saw, so its
    first alarm reads as a known burst; once that burst outlasts `burst_batches` at
    that level, the run is another workload and sets the history aside (without that
    recheck, half of these runs planned on a history that was not theirs)."""
    from benchmarks.tuner_history_study import drive

    aside = []
    for seed in range(520, 530):
        s, options, warm = _warm_bursty(seed)
        slower = dataclasses.replace(s, workload=_slower_storage(s.workload, 3.0))
        tuner = QueueingTuner(warm=warm, explore=None, **options)
        drive(slower, tuner, 103)
        aside.append((tuner.warm_set_aside or "").startswith("regime shift (slower)"))
    assert all(aside), aside


def _probe_without_a_model(s, warm):
    """What the probing history (no model) proposes for a warm run of draw `s`."""
    from predictors.explore import PooledPrior, Weight, propose
    from predictors.forecast import Forecaster

    one = s.workload.memory_factor * s.workload.batch_bytes
    grid = Forecaster(target=s.target, budget=s.budget, max_workers=16).grid(
        one, s.workload.cpu_count
    )
    prior = PooledPrior(s.workload.cpu_count, target=s.target)
    no_model = Weight(0.0, 0, None, None, "no model")
    return propose(warm.records, prior, grid, s.target, weight=no_model, explore=True,
                   start=warm.start)  # fmt: skip


def _bursty_probes(seeds: range):
    """(scenario, options, warm start, proposal) of the bursty draws in `seeds` whose
    first run met the target and whose history alone proposes a probe."""
    for seed in seeds:
        s, options, warm = _warm_bursty(seed)
        if not warm.met:
            continue
        p = _probe_without_a_model(s, warm)
        if p.probe:
            yield seed, s, options, warm, p


def test_a_bursty_warm_run_that_fell_back_from_its_probe_holds_the_fallback():
    """Bursty reads: a warm run probing one grid step cheaper than where its history met
    the target, whose probe then measured a miss, goes back to that configuration and
    plans no lower than it while the history stands (its calm stretches do not undo
    the miss the run measured). Twenty-five draws, two run seeds each."""
    from benchmarks.tuner_history_study import _tuner, drive

    fell_back = 0
    for seed, s, _, warm, p in _bursty_probes(range(520, 545)):
        for run_seed in (103, 104):
            probing = dataclasses.replace(warm, start=(p.workers, p.depth), reference_ms=())
            tuner = _tuner(s, probing, warm.start)
            _, states = drive(s, tuner, run_seed)
            if not tuner.fell_back or tuner.warm_set_aside is not None:
                continue
            fell_back += 1
            back = next(i for i, x in enumerate(states) if (x.workers, x.depth) == warm.start)
            lowest = (min(x.workers for x in states[back:]), min(x.depth for x in states[back:]))
            assert lowest[0] >= warm.start[0] and lowest[1] >= warm.start[1], (seed, lowest)
    assert fell_back >= 3, fell_back


def test_a_bursty_warm_run_whose_probe_met_plans_on_from_the_probe(monkeypatch):
    """Bursty reads: the model proposes one grid step cheaper than where the history met
    the target (its proposal given here, as `plan_warm` returns it), and the probe
    measures meeting. The run then plans from the probe, not from the start it left:
    the configuration it measured meeting is no costlier floor to climb back to, so
    most such runs end cheaper than their start (7 of 10 when written; 4 with the
    start kept as the floor)."""
    import predictors.explore
    from benchmarks.tuner_history_study import drive

    cheaper = runs = 0
    for _, s, options, warm, p in _bursty_probes(range(530, 550)):
        monkeypatch.setattr(predictors.explore, "plan_warm", lambda *a, p=p, **k: (None, None, p))
        for run_seed in (103, 104):
            tuner = QueueingTuner(warm=warm, explore=True, **options)
            _, states = drive(s, tuner, run_seed)
            assert any(d.reason.startswith("model's probe") for _, d in tuner.history)
            if tuner.fell_back or tuner.warm_set_aside is not None:
                continue
            runs += 1
            end = (states[-1].depth, states[-1].workers)
            cheaper += end < (warm.start[1], warm.start[0])  # memory (depth) first
    assert runs >= 8 and cheaper >= 6, (cheaper, runs)


def test_a_warm_run_with_bursts_in_its_history_does_not_plan_below_its_start():
    """Bursty reads: a warm run's calm stretches do not say the bursts to come spare a
    configuration cheaper than the one its history measured meeting, so it holds at
    least its start (more only where its own batches need it; a start that never met
    is no floor). Forty draws, runs 2-5 each on its own history after one cold run,
    against the same tuner that never reads its history's bursts as such
    (`burst_persistence` above 1): more runs meet the target (138 of 160 runs against
    129 when written)."""
    from benchmarks.tuner_history_study import drive, records_of
    from predictors.config import CONSTANTS
    from predictors.history import WarmStart

    blind = dataclasses.replace(CONSTANTS, burst_persistence=2.0)
    met = {"floor": 0, "blind": 0}
    for seed in range(520, 560):
        s = draw("bursty", seed)
        options = dict(target_utilization=s.target, memory_budget_bytes=s.budget, max_workers=16)
        _, states = drive(s, QueueingTuner(**options), 101)
        first = records_of("run1", states, s, 1)
        for name, constants in (("floor", CONSTANTS), ("blind", blind)):
            records = list(first)
            for k in range(2, 6):
                warm = WarmStart.from_records(records, s.target, memory_budget=s.budget)
                tuner = QueueingTuner(warm=warm, explore=None, constants=constants, **options)
                metrics, states = drive(s, tuner, 100 + k)
                met[name] += metrics["utilization"] >= s.target
                records += records_of(f"run{k}", states, s, k)
    assert met["floor"] >= met["blind"] + 5, met


def test_a_warm_run_without_bursts_still_plans_down_from_a_costly_start():
    """Steady storage reads whose history met the target only at depth 16 (more than the
    workload needs): with no bursts in the history, the warm run plans down as a cold
    run would, so an expensive first run is not locked in."""
    from benchmarks.tuner_history_study import drive, records_of
    from predictors.history import WarmStart

    s = draw("storage-threads", 1)
    options = dict(target_utilization=s.target, memory_budget_bytes=s.budget, max_workers=16)
    _, states = drive(s, StaticDefaultTuner(8, 2), 101)  # 8 workers, depth 16
    first = records_of("run1", states, s, 1)
    warm = WarmStart.from_records(first, s.target, memory_budget=s.budget)
    assert warm.met and warm.start == (8, 16)
    metrics, states = drive(s, QueueingTuner(warm=warm, explore=None, **options), 102)
    assert states[-1].depth < 16 and metrics["utilization"] >= s.target
