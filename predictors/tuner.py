"""The tuner interface and the learned online tuner.

Every tuner (learned or baseline) has one method, `decide(state) -> Decision`: it
reads numbers measured by the loader's telemetry and *returns* a configuration with a
reason; the loader applies it (`engine.set_workers`, `engine.set_depth`). Tuners never
change which samples come in which order, only how many workers build batches and how
many batches may be in flight or ready.

The learned tuner (the model proposes, measurement decides; memory is bought only for a
measured shortfall):

1. starts at the least memory (1 worker, depth 1) and measures for `warmup_batches`;
   if that already meets the target it stays there;
2. otherwise turns the measured per-batch service times into the model's features,
   predicts utilization for every candidate (workers, depth) whose memory bound
   `depth * batch_memory_bytes` fits the budget and whose depth keeps the workers'
   batches on time through late ones (`depth_needed`), clipped by first principles,
   and takes the one with the least memory whose predicted utilization meets
   `target + margin` (the margin is the model's measured error on unseen workloads);
3. every `check_batches` settled batches (an iteration's first batch and new workers'
   first batches are not judged; windows grow to span `window_services` service times
   when steps are short) it compares utilization with the goal (the target, raised by
   what epoch starts cost):
   - below it by less than `recheck_margin`, right after a climb, or at a configuration
     that met it before: one more window, judged with this one (8 batches are noisy);
     held when the configuration's last `record_batches` settled batches meet it;
   - below it in the first window after a change while the workers' measured service
     keeps up: one more window, judged alone (the buffer is still filling);
   - below it: back to the cheapest configuration measured to meet it, if one holds
     more memory; else escalate (from the service measured at this configuration when
     it explains the shortfall, else the shortfall rescales the service time the model
     is given; one step buys 1.5x to 3x the memory, more for a larger shortfall; a measured
     climb when the re-plan asks for nothing larger; a stop, with the bottleneck named,
     when a climb did not raise utilization, or lowered it);
   - above it by `step_down_margin` twice in a row: the next cheaper depth, kept only
     if the goal holds (reverted at once if not);
4. a lasting service-time change (a storage slowdown or its recovery) re-plans at once,
   a large slowdown (5x) with `surge` times the measured service so the buffer refills
   quickly (a slowdown only while short of the goal and costing utilization, a speed-up
   only while meeting it, and never for more memory; after a speed-up, what met the
   target before is still known to);
5. when nothing within the budget reaches the target, says so, names the bottleneck
   stage (reads that keep the cores busy are "cpu", not storage) and takes the
   cheapest configuration near the highest predicted utilization, then climbs one
   measured step at a time; it stops when a configuration measures about what the
   cores allow (`cpu_bound_utilization`), or when more workers stopped paying as
   measured (`_plateau`), holding the cheapest configuration as good as the best.

Example:
    >>> tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=2**31)
    >>> decision = tuner.decide(state)            # state: a TunerState from telemetry
    >>> engine.set_workers(decision.workers); engine.set_depth(decision.depth)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import fmean, median
from typing import TYPE_CHECKING, Any

from predictors.baselines import QueueingModel
from predictors.errors import TunerConfigError
from predictors.planning import DEPTH_GRID, CandidatePlanner, Choice, Pace, service_spread
from predictors.shifts import ServiceBaseline, batch_service_ms
from predictors.signals import epoch_goal, memory_step, plateau, slowing

# The interface and the measurements' reading live in predictors.state; importable from
# here as before (scripts and docs name predictors.tuner.TunerState).
from predictors.state import (
    Decision,
    PerformanceModel,
    Tuner,
    TunerState,
    check_budget,
    check_target,
    name_bottleneck,
    stage_text,
    state_features,
    utilization,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "Decision",
    "LearnedTuner",
    "PerformanceModel",
    "Tuner",
    "TunerState",
    "check_budget",
    "check_target",
    "name_bottleneck",
    "state_features",
]


@dataclass
class Measured:
    """One configuration's settled batches under the current regime: enough to give
    its time-weighted utilization and how far that may be from its mean by chance."""

    step_ms: float = 0.0
    stall_ms: float = 0.0
    batches: int = 0
    per_batch: float = 0.0  # sum of per-batch utilizations
    per_batch_squares: float = 0.0

    def add(self, state: TunerState) -> None:
        self.step_ms += state.step_ms
        self.stall_ms += state.stall_ms
        self.batches += 1
        self.per_batch += state.utilization
        self.per_batch_squares += state.utilization**2

    @property
    def utilization(self) -> float:
        return self.step_ms / max(self.step_ms + self.stall_ms, 1e-9)

    @property
    def standard_error(self) -> float:
        """Of the mean per-batch utilization: sd / sqrt(batches)."""
        n = max(self.batches, 1)
        variance = max(self.per_batch_squares / n - (self.per_batch / n) ** 2, 0.0)
        return math.sqrt(variance / n)


class LearnedTuner:
    """Online controller: the least memory whose predicted utilization meets the target,
    corrected by what it then measures (escalate when short, step down when ahead)."""

    def __init__(
        self,
        model: PerformanceModel | None = None,
        *,
        target_utilization: float = 0.9,
        memory_budget_bytes: float | None = None,
        max_workers: int | None = None,
        max_depth: int = 64,
        start: tuple[int, int] = (1, 1),
        warmup_batches: int = 4,
        window: int = 16,
        shift_window: int = 8,
        settle_batches: int = 4,
        shift_ratio: float = 1.6,
        divergence: float = 0.04,
        margin: float | None = None,
        check_batches: int = 8,
        step_down_margin: float = 0.03,
        min_gain: float = 0.02,
        shift_batches: int = 4,
        recheck_margin: float = 0.1,
        surge: float = 3.0,
        record_batches: int = 64,
        window_services: float = 4.0,
    ) -> None:
        if model is None:
            from predictors.model import load_default

            model = load_default()
        self.target = check_target(target_utilization)
        self.budget = memory_budget_bytes
        self.max_workers = max_workers
        self.max_depth = max_depth
        self.start = start
        self.warmup_batches = warmup_batches
        self.settle_batches = settle_batches
        self.shift_window = shift_window
        self.shift_ratio = shift_ratio
        self.divergence = divergence
        self.check_batches = check_batches
        self.step_down_margin = step_down_margin
        self.min_gain = min_gain
        self.shift_batches = shift_batches
        self.recheck_margin = recheck_margin
        self.surge = surge
        self.window = window
        self.record_batches = record_batches
        self.window_services = window_services
        self._settle = settle_batches  # batches after a change that are not judged
        error = model.utilization_error if margin is None else margin
        self.margin = min(max(error, 0.0), (1.0 - self.target) / 2)  # keep target+margin < 1
        self.planner = CandidatePlanner(
            model,
            target=self.target,
            margin=self.margin,
            budget=memory_budget_bytes,
            max_workers=max_workers,
            max_depth=max_depth,
        )
        self._baseline = ServiceBaseline(shift_ratio)  # the service time shifts are read against
        self._recent: deque[TunerState] = deque(maxlen=max(window, check_batches + settle_batches))
        self._current: Decision | None = None
        self._planned_at = 0  # the batch a change took effect after (settling counts from it)
        self._in_effect = True  # the current configuration was measured at least once
        self._checked_at = 0
        self._ahead = 0  # checks in a row well above the target
        self._behind: float | None = None  # a first short window, judged with the next
        self._urgent = False  # the last escalation answered a slowdown under way
        self._deferred = 0  # batches a due escalation has waited on a suspect batch
        self._goal = self.target  # what windows between epoch starts must reach
        self._last_epoch_start: int | None = None
        self._epoch_length = 0
        self._epoch_stalls: deque[float] = deque(maxlen=4)
        self._divergences = 0  # large prediction errors of the learned model
        self._move = "plan"  # how the current configuration came about
        self._parent: tuple[Decision, float] | None = None  # the one before, and its utilization
        # Configurations measured short, with the service time (ms a batch) they fell
        # short at: a step down to one with no more workers and no more depth than one
        # of them is pointless while the service is no faster (`_replan_for_shift`).
        self._short: dict[tuple[int, int], float] = {}
        self._waited = False  # a flat climb was given one more window
        self._filled = False  # a short first window whose workers keep up was given another
        self._parent_rate = 0.0  # the service rate measured before the last escalation
        # Configurations measured to meet the target under this regime, by (workers, depth).
        self._good: dict[tuple[int, int], Decision] = {}
        # The current configuration's recent settled batches.
        self._record: deque[TunerState] = deque(maxlen=record_batches)
        # Every configuration's settled batches under this regime: step ms, stall ms, count.
        self._measured: dict[tuple[int, int], Measured] = {}
        self.history: list[tuple[int, Decision]] = []

    @property
    def model(self) -> PerformanceModel:
        """The model that predicts candidates (the queueing model after the learned one
        was twice far off)."""
        return self.planner.model

    # --- the protocol -----------------------------------------------------------
    def decide(self, state: TunerState) -> Decision:
        check_budget(self.budget, state.one_batch_bytes)
        if state.batch_index > 0:
            # The first batch is no sample of the workload: it starts the pipeline
            # (threads, the first request, the tuner's own start) and has no step. On
            # nas at 3 ms it read 8-21 ms against 7-8 after, and with it in the first
            # plan's 5 batches the lateness spread read 0.1-1.0 of the mean (0.03-0.2
            # without): depth 6 for 3 workers, where 3 / 3 holds 0.92-0.94.
            self._recent.append(state)
        self._charge_epoch_starts(state)
        self._keep_record(state)
        if state.batch_index < self.warmup_batches:
            w, d = self._safe_start(state)
            return self._emit(
                state,
                Decision(
                    w,
                    d,
                    f"measuring: batch {state.batch_index + 1} of "
                    f"{self.warmup_batches} at the safe start ({w} workers, depth {d})",
                ),
            )
        if self._current is None:
            return self._first_decision(state)
        shift = self._baseline.read(
            self._settled(), self._goal, self.shift_window, self.shift_batches
        )
        if shift is not None:
            return self._replan_for_shift(state, shift.before, shift.now, shift.fresh, shift.large)
        observed = self._observed()
        if observed is None:
            return self._hold()
        if observed < self._goal and self._baseline.suspect and self._deferred < self.shift_window:
            # One batch 5x slower than the baseline: the next few tell a slowdown
            # (planned for at once, above) from a straggler. Escalating now would size
            # the step from the old regime, and the new baseline would hide the shift.
            # At most a shift window (`ServiceBaseline.read`: at one worker the second
            # slow batch came 4 after the first; deferring two, the tuner escalated
            # first and saw the shift 11 batches late).
            self._deferred += 1
            return self._hold()
        self._deferred = 0
        if observed < self._goal and self._holds_on_record():
            # One short window of a configuration whose record meets the goal: at 4 ms
            # steps an 8-batch window spans two service times, and such dips (0.84 after
            # 270 batches at 0.9+) bought workers that then slowed everything down.
            self._checked_at = state.batch_index
            return self._hold()
        if self._goal / 2 <= observed < self._goal and self._filling():
            # The workers' measured service keeps up with the step, yet the first window
            # after the change fell short: the buffer is still filling (new workers,
            # lognormal reads). Judged on the next window alone; buying for this one took
            # object-store from 4/8 (the oracle's) to 7/16. Such windows read 0.5-0.6
            # there; below half the goal the stage times miss a cost (retries: 0.14 in the
            # soak), and that is escalated at once.
            self._filled, self._behind = True, None
            self._checked_at = state.batch_index
            return self._hold()
        if observed < self._goal and self._behind is not None:
            observed = (observed + self._behind) / 2  # judge both windows together
        elif observed < self._goal:
            # Measure another window before buying memory when the shortfall is within
            # `recheck_margin` (8 batches are noisy: one read 0.88 against 0.90 and bought
            # 5x the memory the target needed; on object-store a configuration read 0.76
            # in one window and 0.99 in the next), or when this configuration already met
            # the target and no slowdown shows in the service times. The first window
            # after a climb gets twice the margin: new workers pay for opening files.
            shortfall = self._goal - observed
            fresh = self._move == "escalate" and shortfall < 2 * self.recheck_margin
            proven = self._is_good(self._current) and not self._slowing()
            # A step-down trial that falls short goes back at once: returning to what was
            # measured needs no second proof, buying memory does.
            trial = self._move == "step-down" or self._urgent
            if (shortfall < self.recheck_margin or fresh or proven) and not trial:
                self._behind = observed
                self._checked_at = state.batch_index
                return self._hold()
        self._behind = None
        if observed < self._goal:
            return self._escalate(state, observed)
        self._urgent = False
        self._note_good()
        if self._move == "step-down":
            self._move = "kept-step-down"  # the cheaper configuration held the target
        elif self._move in ("plan", "escalate", "reverted"):
            self._move, self._parent = "settled", None
        if observed >= self._goal + self.step_down_margin:
            self._ahead += 1
            if self._ahead >= 2:  # two windows in a row: one lucky window is not enough
                return self._step_down(state, observed)
            self._checked_at = state.batch_index
            return self._hold()
        self._ahead = 0
        self._checked_at = state.batch_index
        return self._hold()

    # --- internals ----------------------------------------------------------------
    def _replan_for_shift(
        self, state: TunerState, before: float, now: float, fresh: int, large: bool
    ) -> Decision:
        """A lasting service-time change (`ServiceBaseline.read`): forget what was measured
        under the old regime and plan from the last `fresh` batches."""
        current = self._current
        assert current is not None  # decide() plans before it checks shifts
        # A configuration that fell short at a service no faster than now's still falls
        # short: keep it out of the step-downs unless the service is now clearly faster.
        # (A "speed-up" in object-store's lognormal reads, 104 -> 58 ms, cleared 4 / 6
        # and 4 / 4, which fell short at about that speed, and the step-downs tried
        # both again: 0.89 over the last third.)
        ratio = self._baseline.moderate_ratio()
        self._short = {c: ms for c, ms in self._short.items() if now * ratio > ms}
        self.planner.ceiling, self._parent = math.inf, None
        self._record.clear()  # measured under the old regime
        self._measured.clear()
        why = f"regime shift: service time per batch {before:.1f} ms -> {now:.1f} ms"
        if now < before:
            # Faster: what was learned under the slow regime (contention of many
            # workers included) would keep memory that is no longer needed. What met
            # the target then still does, faster: if the cheaper re-plan falls short,
            # the tuner steps back up to it, not to the model's escalation (a speed-up
            # read in object-store jitter went 4/8 -> 2/3 -> 10/24, the run's peak).
            self.planner.slowness = 1.0
            choice = self._choose(state, self._features(fresh))
            if choice.depth > current.depth or choice.workers > current.workers:
                # A faster service needs no more than what kept up with the slower
                # one. At nas 2 ms a configuration's reads speed up when its queue
                # empties, and the out-of-reach re-plan took 8/16 to 29/48.
                self._baseline.rebase()  # the new regime is the baseline from here
                self._move = "settled"  # kept under the new regime, judged afresh
                return self._apply(
                    state,
                    current.workers,
                    current.depth,
                    f"{why}; a faster service needs no more than this: keeping "
                    f"{current.workers} workers, depth {current.depth}",
                    current.predicted,
                    current.feasible,
                    current.bottleneck,
                )
            return self._apply_plan(state, why, choice)
        self._good.clear()  # slower: what met the target may no longer
        if not large:
            # A moderate slowdown (beyond `shift_ratio`, under 5x): planned for what
            # was measured, itself on the high side (the check reads the slow tail).
            # Lognormal object-store reads passed it in 3 of 14 runs of 480 batches,
            # and 2x that planned 12/24 and 13/32 where 4/8 held. Out of reach, a
            # bounded memory step, as an escalation: the plan's "best" is then the
            # most workers, and at nas 2 ms the workers' own contention passed this
            # check too (15/24 -> 24/48 in one step).
            features = self._features(fresh)
            choice = self._choose(state, features)
            if not choice.feasible:
                short = utilization(self._settled()[-fresh:])
                cap = memory_step(self._goal, short) * self._memory(current, state)
                choice = self._choose(state, features, step_cap=cap)
            return self._apply_plan(state, why, choice)
        # Large: plan for `surge` times the measured service. The consumer is already
        # waiting and the buffer refills only at the surplus rate, so the least that
        # keeps up would take tens of batches to recover; step-downs trim it later.
        # The measured service is a mean of 2-4 batches, half of them served from
        # read-ahead: on object-store, tenfold slowdowns read 290-830 ms. At 2x, the
        # low readings planned 7 / 16 or 8 / 16 and took 19-25 batches to recover (3 of
        # 9 runs); at 3x, 10-13 batches in 5 runs, for 7-15 MiB during the slowdown.
        # When that is out of reach within the budget, a smaller surge that is not: the
        # target is not out of reach, only the refill (else the tuner would hold the
        # ceiling and climb by single workers, each blind for the depth in flight).
        planner, features = self.planner, self._features(fresh)
        learned = planner.slowness
        try:
            for surge in (self.surge, (1 + self.surge) / 2, 1.0):
                planner.slowness = learned * surge
                choice = self._choose(state, features)
                if choice.feasible:
                    break
        finally:
            planner.slowness = learned
        return self._apply_plan(state, f"{why}; planning for {surge:g}x that", choice)

    def _safe_start(self, state: TunerState) -> tuple[int, int]:
        w, d = self.start
        w = min(w, state.cpu_count)
        if self.budget is not None:
            d = max(1, min(d, int(self.budget // state.one_batch_bytes)))
        return w, d

    def _first_decision(self, state: TunerState) -> Decision:
        """After the warm-up: keep the safe start when it already measured the target
        (memory is bought for a measured shortfall, never for a predicted one), else plan.
        The first batch waited for an empty pipeline and is left out (`decide`)."""
        measured = [s for s in self._recent if not s.epoch_start]
        observed = utilization(measured) if measured else 0.0
        self._scale_windows(measured or list(self._recent))
        if observed < self._goal:
            return self._plan(state, "first decision after measuring")
        w, d = self._safe_start(state)
        decision = self._apply(
            state,
            w,
            d,
            f"the safe start ({w} workers, depth {d}) measured {observed:.2f} >= "
            f"{self._target_text()}: keeping it, no memory to buy",
            {"utilization": observed, "memory_bytes": d * state.one_batch_bytes},
        )
        self._move = "settled"
        return decision

    def _scale_windows(self, states: list[TunerState]) -> None:
        """Windows in time, not batches: a judged window spans at least
        `window_services` of the warm-up's service times (one worker's), else the
        windows grow (at most 4x). Arrivals within one service time move together: at
        nas 2 ms steps an 8-batch window spans one, and a fixed configuration read
        0.5 to 0.9 from one short window to the next (60 batches: 0.63 to 0.74); each rule
        read that noise as a shortfall, a slowdown or a speed-up."""
        service = fmean(s.service_ms for s in states)
        step = fmean(s.step_ms for s in states)
        wanted = self.window_services * service / max(step, 1e-6)
        scale = min(max(wanted / self.check_batches, 1.0), 4.0)
        if scale == 1.0:
            return
        self.check_batches = round(self.check_batches * scale)
        self.shift_window = round(self.shift_window * scale)
        self.shift_batches = round(self.shift_batches * scale)
        self._record = deque(self._record, maxlen=round(self.record_batches * scale))
        size = max(round(self.window * scale), self.check_batches + self._settle)
        self._recent = deque(self._recent, maxlen=max(size, 2 * self.shift_window))

    def _charge_epoch_starts(self, state: TunerState) -> None:
        """Raise the goal between epoch starts so the whole epoch meets the target.

        An iteration's first batch waits for an empty pipeline whatever the
        configuration, so it is not judged as a shortfall of one (`_settled`); but the
        consumer does wait, once per epoch. With E batches an epoch and s ms of that wait,
        the other batches must reach step / (step / target - s / E) for the epoch as a
        whole to reach the target (12-batch epochs of Pillow decode: 0.90 -> 0.96).
        The first iteration's first batch is left out (it also opens the files)."""
        if not state.epoch_start:
            return  # the goal changes only when an epoch start is measured
        if self._last_epoch_start is not None:
            self._epoch_length = state.batch_index - self._last_epoch_start
            self._epoch_stalls.append(state.stall_ms)
            step = median(s.step_ms for s in self._recent)
            stall = median(self._epoch_stalls)
            self._goal = epoch_goal(self.target, step, stall, self._epoch_length)
        self._last_epoch_start = state.batch_index

    @property
    def goal(self) -> float:
        """The utilization that windows between epoch starts must reach: the target,
        raised by what the epoch starts cost (`_charge_epoch_starts`)."""
        return self._goal

    def _target_text(self) -> str:
        if self._goal <= self.target:
            return f"target {self.target:.2f}"
        return f"target {self.target:.2f} ({self._goal:.2f} between epoch starts)"

    def _is_good(self, decision: Decision | None) -> bool:
        return decision is not None and (decision.workers, decision.depth) in self._good

    def _note_good(self) -> None:
        """The current configuration met the target: remember it (a later shortfall at
        a cheaper configuration steps back up to the cheapest of these above it)."""
        current = self._current
        if current is not None:
            self._good[(current.workers, current.depth)] = current

    def _good_above(self, memory: float, state: TunerState) -> Decision | None:
        """The cheapest configuration measured to meet the target that holds more than
        `memory` (None: none did)."""
        above = [g for g in self._good.values() if self._memory(g, state) > memory]
        return min(above, key=lambda g: (g.depth, g.workers), default=None)

    def _slowing(self) -> bool:
        """The last few batches' service time is well above the recent mean: a slowdown
        under way (the shift check needs a few more batches to call it)."""
        # Settled batches only: the first batches of new workers pay for opening files,
        # which read as a slowdown and once bought 3x the memory uncapped.
        service = [batch_service_ms(s) for s in self._settled()]
        return slowing(service, self.shift_batches, self.shift_ratio)

    def _keep_record(self, state: TunerState) -> None:
        self._note_in_effect(state)
        if self._is_settled(state):
            self._record.append(state)
            self._measured.setdefault((state.workers, state.depth), Measured()).add(state)

    def _note_in_effect(self, state: TunerState) -> None:
        """Settling counts from when a change took effect, not from when it was decided:
        on the tuner's own thread a re-plan took 5 batches at nas 3 ms, the loader kept
        building batches the old way meanwhile, and the settle was spent before the new
        workers began. Their first batches (26-29 ms against 7-8) were judged, and the
        first window after the first plan read 0.5 and bought 4 / 8 where 3 / 3 holds."""
        current = self._current
        if self._in_effect or current is None:
            return
        if (state.workers, state.depth) == (current.workers, current.depth):
            self._in_effect = True
            self._planned_at = max(self._planned_at, state.batch_index - 1)

    def _measured_enough(self) -> dict[tuple[int, int], Measured]:
        """Every configuration measured under this regime for a window at least."""
        return {k: m for k, m in self._measured.items() if m.batches >= self.check_batches}

    def _plateau(self, state: TunerState) -> Decision | None:
        """When more workers stopped paying (`signals.plateau`, judged on every
        configuration measured under this regime), the cheapest configuration as good
        as the best measured, its reason the measurements; None while they still pay or
        too little is measured."""
        current = self._current
        assert current is not None
        measured = self._measured_enough()
        table = {key: m.utilization for key, m in measured.items()}
        noise = {key: m.standard_error for key, m in measured.items()}
        grow = current.workers < self.planner.workers_cap(state)
        found = plateau(table, (current.workers, current.depth), noise=noise, workers_can_grow=grow)
        if found is None:
            return None
        w, d = found
        each = ", ".join(f"{k[0]}/{k[1]} {u:.2f}" for k, u in sorted(table.items()))
        reason = f"more workers stopped paying (utilization measured per configuration: {each})"
        predicted = {"utilization": table[found], "memory_bytes": d * state.one_batch_bytes}
        return Decision(w, d, reason, predicted)

    def _holds_on_record(self) -> bool:
        """True when a shortfall in the last window is outweighed by the configuration's
        record: its last `record_batches` settled batches (at least three windows of them,
        this one included) meet the goal, and no slowdown shows. Whatever the shortfall:
        on object-store one window of lognormal reads read 0.69 at a configuration that
        had met the target for 80 batches, and bought 1.5x its memory."""
        if len(self._record) < 3 * self.check_batches:
            return False
        return utilization(list(self._record)) >= self._goal and not self._slowing()

    def _smoothed(self, last: int | None = None) -> dict[str, float]:
        """Medians over the recent batches of the stage times (for reasons and bottlenecks);
        means of the workers' CPU and of the batch interval (for the cores busy)."""
        states = list(self._recent)[-last:] if last else list(self._recent)
        m = {
            name: median(getattr(s, name) for s in states)
            for name in ("read_ms", "decode_ms", "transform_ms", "step_ms", "stall_ms")
        }
        # An iteration's first batch opens the files: twice a warm batch's CPU (nas: 10
        # ms against 4-5), which made the warm-up's cores bound (`cpu_bound_utilization`)
        # 0.84 where 0.88 was reached.
        warm = [s for s in states if not s.epoch_start] or states
        for name in ("cpu_ms", "read_cpu_ms"):  # means: with batch_ms, the cores busy
            values = [v for s in warm if (v := getattr(s, name)) is not None]
            if values:
                m[name] = fmean(values)
        m["batch_ms"] = fmean(s.step_ms + s.stall_ms for s in states)
        return m

    def _features(self, last: int | None = None) -> dict[str, Any]:
        """Means over the recent batches of the configuration-free features. Means, not
        medians: storage cost is bursty (one request can serve several batches through
        read-ahead), and what the workers must keep up with is its average."""
        states = list(self._recent)[-last:] if last else list(self._recent)
        # An iteration's first batch pays for opening files (footers, connections): a
        # cold service time that would size the first plan for a slower storage.
        warm = [s for s in states if not s.epoch_start]
        return self._mean_features(warm or states)

    def _is_settled(self, state: TunerState) -> bool:
        """Measured under the current configuration, after it settled, not an epoch start."""
        current = self._current
        return (
            current is not None
            and state.batch_index >= self._planned_at + self._settle
            and (state.workers, state.depth) == (current.workers, current.depth)
            and not state.epoch_start
        )

    def _settled(self) -> list[TunerState]:
        """Batches measured under the current configuration, after it settled."""
        return [s for s in self._recent if self._is_settled(s)]

    def _observed(self) -> float | None:
        """Utilization over the last `check_batches` settled batches (None: too few yet)."""
        settled = [s for s in self._settled() if s.batch_index > self._checked_at]
        settled = settled[-self.check_batches :]
        if len(settled) < self.check_batches:
            return None
        return utilization(settled)

    def _supply(self, states: list[TunerState]) -> float:
        """The utilization the busy workers' measured service allows: active workers x
        step / service time per batch (means: storage cost is bursty)."""
        active = max(1, min(states[-1].workers, states[-1].depth))
        service = fmean(s.service_ms for s in states)
        return min(1.0, active * fmean(s.step_ms for s in states) / max(service, 1e-6))

    def _filling(self) -> bool:
        """The first short window after a plan or an escalation, while the workers'
        measured service keeps up with the step (`_supply` >= goal)."""
        if self._filled or self._move not in ("plan", "escalate"):
            return False
        window = self._settled()[-self.check_batches :]
        return bool(window) and self._supply(window) >= self._goal

    def _last_window(self) -> list[TunerState]:
        """The last settled window, else the last 4 batches (right after a change)."""
        return self._settled()[-self.check_batches :] or list(self._recent)[-4:]

    def _service_rate(self) -> float:
        """Batches per second the busy workers could build, from the measured stage times
        of the last settled window (what more workers raise unless a stage is shared)."""
        settled = self._last_window()
        s = settled[-1]
        service = median(x.service_ms for x in settled)
        return max(1, min(s.workers, s.depth)) / max(service, 1e-6)

    @staticmethod
    def _mean_features(states: list[TunerState]) -> dict[str, Any]:
        rows = [state_features(s) for s in states]
        return {
            k: sum(r[k] for r in rows) / len(rows) if k not in ("shuffle", "cache") else rows[-1][k]
            for k in rows[-1]
        }

    def _memory(self, decision: Decision, state: TunerState) -> float:
        return decision.depth * state.one_batch_bytes

    def _escalate(self, state: TunerState, observed: float) -> Decision:
        """Observed utilization is below the target: more workers and depth, never less.

        The correction is the measured shortfall itself (predicted / observed), applied to
        the service time the model is given and not capped: a 7x shortfall (retries,
        faults, contention the stage times do not show) asks for 7x the concurrency at
        once; when this configuration's measured service explains the shortfall, it
        plans from that service instead. When the re-plan still asks for nothing larger,
        the tuner climbs one step by measurement; when a climb did not raise utilization,
        or the configurations measured show more workers stopped paying (`_plateau`),
        more of the same will not help, and it says so and holds the best for less."""
        current = self._current
        assert current is not None  # decide() plans before it checks
        here = self._memory(current, state)
        m = self._smoothed()
        self._urgent = False
        if self._is_good(current):
            # It met the target before, and now fell short twice: no longer proof.
            self._good.pop((current.workers, current.depth))
        # This configuration fell short: stepping down to it (or to one with no more
        # workers and no more depth) later is pointless.
        judged = self._last_window()
        self._short[(current.workers, current.depth)] = median(map(batch_service_ms, judged))
        good = self._good_above(here, state)
        if good is not None:
            # A configuration above this one met the target (a step-down that held for a
            # while, then fell short): go back to the cheapest such, not to the model,
            # whose re-plan bought 2x that memory on object-store (docs/tuning.md).
            self._move, self._parent = "reverted", None
            return self._apply(
                state,
                good.workers,
                good.depth,
                f"stepping back up: {current.workers} workers, depth {current.depth} measured "
                f"{observed:.2f} < {self._target_text()}; {good.workers} workers, depth "
                f"{good.depth} met it",
                good.predicted,
            )
        if self._move == "escalate" and self._parent is not None:
            parent, before = self._parent
            # More concurrency did not help when utilization did not rise AND the
            # measured service rate (busy workers / service time per batch) did not
            # either: a shared stage (cores, link) is saturated. If the rate rose, the
            # flat utilization is noise or a backlog still draining: keep climbing.
            rate_gain = self._service_rate() / max(self._parent_rate, 1e-9)
            # A rate that fell by a third or more is not saturation but a slower service
            # (a slowdown that began meanwhile): the comparison says nothing then.
            flat = observed < before + self.min_gain and 0.67 <= rate_gain < 1.1
            # Utilization fell, in two windows: the added workers took the CPU from the
            # others or from the step (Pillow decode on 2 cores), however the rate reads.
            # That includes a rate that fell: on nas at 2 ms, 16 -> 24 workers doubled each
            # read's time (the cores, not the storage) and the climbs went on to 28.
            flat = flat or observed < before - 2 * self.min_gain
            # A step that added no busy worker (depth only) says nothing about concurrency.
            flat = flat and min(current.workers, current.depth) > min(parent.workers, parent.depth)
            if flat and not self._waited:
                # New workers pay for their first batches (connections, file footers):
                # judge the climb on one more window before calling it useless.
                self._waited, self._checked_at = True, state.batch_index
                return self._hold()
            if flat:
                keep = observed >= before
                best = current if keep else parent
                self.planner.ceiling = here if keep else here - 1.0
                self._move, self._parent = "ceiling", None
                return self._out_of_reach(
                    state,
                    best,
                    f"more workers and depth did not help ({parent.workers}/{parent.depth}: "
                    f"{before:.2f}, {current.workers}/{current.depth}: {observed:.2f})",
                    max(observed, before),
                    m,
                )
        if self._move == "ceiling":
            # Already said, with the bottleneck: held without a new decision each window
            # (stats() listed the same out-of-reach decision every 8 to 32 batches).
            self._ahead, self._checked_at = 0, state.batch_index
            return self._hold()
        saturated = self._plateau(state)
        measured = self._measured.get((current.workers, current.depth), Measured()).batches
        if saturated is not None and measured < 2 * self.check_batches:
            # A new configuration's first window reads low while its buffer fills: judged
            # on one more before the verdict (object-store: 3/6 read 0.62 in its first
            # window against 2/4's 0.61, and 2/4 was held at 0.61 for the whole run).
            self._checked_at = state.batch_index
            return self._hold()
        if saturated is not None:
            # Measured: more workers stopped paying (whatever the model predicts: first
            # principles see no shared cores). The best it can is the cheapest
            # configuration as good as the best measured.
            self.planner.ceiling = self._memory(saturated, state)
            return self._out_of_reach(
                state, saturated, saturated.reason, saturated.predicted["utilization"], m
            )
        predicted = current.predicted.get("utilization", observed)
        note = ""
        if predicted - observed > self.divergence and not isinstance(self.model, QueueingModel):
            self._divergences += 1
            if self._divergences >= 2:
                # Twice off by more than the margin: this workload lies outside what the
                # model learned. First principles extrapolate where learned corrections do not.
                self.planner.model, self.planner.slowness = QueueingModel(), 1.0
                note = "; outside the model's training range, switching to the queueing model"
        # Plan from the last few batches when they show a slowdown under way (the shift
        # check needs a few more batches to call it); still a bounded memory step: four
        # batches of lognormal reads pass `slowing` by chance now and then (an uncapped
        # step from them took object-store from 2/4 to 10/24), and a real slowdown is
        # also answered by the shift check, uncapped.
        features, step_cap = self._features(), memory_step(self._goal, observed) * here
        self._urgent = self._slowing()
        if self._urgent:
            features = self._features(self.shift_batches)
        active = max(1, min(current.workers, current.depth))
        window = self._settled()[-self.check_batches :]
        supply = self._supply(window) if len(window) >= self.check_batches else 1.0
        if supply < self._goal and not self._urgent:
            # This configuration's measured service explains the shortfall (its workers
            # cannot keep up): plan from that service, with no new correction. One
            # worker's reads are not what several see: on object-store the warm-up's
            # single reader found every other row group already read ahead (service 37
            # ms a batch, 70 ms for 2+ workers striding through row groups), and the
            # utilization-implied correction on top bought 5/12 and 7/16 where 4/8 holds.
            features = self._mean_features(window)
            why = (
                f"observed utilization {observed:.2f} ({self._target_text()}): {active} "
                f"workers measured {fmean(s.service_ms for s in window):.0f} ms a batch, "
                f"enough for {supply:.2f}; planning from that service{note}"
            )
        else:
            # Two readings of the shortfall, the larger wins: the prediction's error, and
            # the service time the observation implies if the workers were the limit
            # (active * step / utilization), against the one the model was given.
            implied = active * m["step_ms"] / max(observed, 1e-2)
            given = self.planner.service_ms(features)
            ratio = max(
                predicted / max(observed, 1e-2),
                implied / max(given, 1e-6),
            )
            ratio = min(max(ratio, 1.05), 32.0)
            self.planner.slowness *= ratio
            why = (
                f"observed utilization {observed:.2f} vs predicted {predicted:.2f} "
                f"({self._target_text()}): treating the service as {self.planner.slowness:.2f}x as "
                f"slow as measured{note}"
            )
        parent = (current, observed)
        # A bounded memory step per escalation (`memory_step`): the shortfall may come
        # from a stage that concurrency does not help (shared cores), which the next
        # check then shows.
        choice = self._choose(state, features, step_cap=step_cap)
        w, d = choice.workers, choice.depth
        not_larger = d * state.one_batch_bytes <= here and w <= current.workers
        if choice.cores_limit and choice.cores is not None and observed >= 0.9 * choice.cores:
            # This configuration measured about what the cores allow: a climb would only
            # add workers contending for them (nas at 2 ms: 8 workers read 0.70-0.74,
            # 16-24 no more, and climbs went on to 30).
            self.planner.ceiling = here
            return self._out_of_reach(
                state, current, choice.cores_limit, observed, m, cpu_bound=True
            )
        # Out of reach: the model's "best" is the most workers, extrapolated from a service
        # time that grows with them (nas at 2 ms: 7 workers measured 0.63, the best was
        # predicted 0.62, and it was 19 workers). One measured step at a time instead,
        # until a step stops paying (`_plateau`, the flat-climb check).
        if not_larger or not choice.feasible:
            climbed = self._climb(state, current)
            if climbed is None:
                return self._out_of_reach(
                    state, current, "no larger configuration fits the budget", observed, m
                )
            step = "climbing one step by measurement"
            choice = choice.climbed(*climbed, step if choice.feasible else f"{choice.note}; {step}")
        self._move, self._parent = "escalate", parent
        self._parent_rate, self._waited = self._service_rate(), False
        return self._apply_choice(state, why, choice)

    def _climb(self, state: TunerState, current: Decision) -> tuple[int, int] | None:
        """One step up by measurement: the next depth of the grid with about 1.5x the
        workers, else one more worker at this depth (below 10); None when neither fits."""
        max_workers = self.planner.workers_cap(state)
        deeper = [d for d in self.planner.depths(state) if d > current.depth]
        if deeper:
            depth = deeper[0]
            more = max(current.workers + 1, math.ceil(current.workers * 1.5))
            return max(current.workers, min(max_workers, depth, more)), depth
        if current.workers < min(max_workers, current.depth, 10):
            return current.workers + 1, current.depth
        # One worker more among 10 or more is a step no window can judge (at most 10 %
        # more concurrency, within the measurement's noise): at 30 / 64 in a tenfold
        # slowdown such steps went on while the slow batches drained after the recovery,
        # and each change put off reading the recovery by a window.
        return None

    def _step_down(self, state: TunerState, observed: float) -> Decision:
        """Utilization holds above target + step_down_margin: try the next cheaper depth,
        kept if utilization still meets the target, reverted (and not tried again until the
        regime shifts) if it does not."""
        current = self._current
        assert current is not None
        lower = [d for d in DEPTH_GRID if d < current.depth]
        if not lower:
            return self._hold()
        depth = lower[-1]
        workers = min(current.workers, depth)
        if any(w >= workers and d >= depth for w, d in self._short):
            # As many workers and as deep fell short. Fewer workers at that memory do not
            # rule it out: on nas at 4 ms, 2/4 fell short and 3/6 held 0.97, and the
            # tuner kept 3/6 for good where 4/4 reads 0.97 (the oracle's).
            return self._hold()
        self._move, self._parent = "step-down", (current, observed)
        return self._apply(
            state,
            workers,
            depth,
            f"measured {observed:.2f} >= target {self.target:.2f} + "
            f"{self.step_down_margin:.2f}: trying one step less memory ({workers} workers, "
            f"depth {depth}); kept if utilization still meets the target",
            {**current.predicted, "memory_bytes": depth * state.one_batch_bytes},
        )

    def _out_of_reach(
        self,
        state: TunerState,
        best: Decision,
        why: str,
        observed: float,
        m: dict[str, float],
        cpu_bound: bool = False,
    ) -> Decision:
        bottleneck = name_bottleneck(m, state.cpu_count, cpu_bound)
        reason = (
            f"{self.planner.out_of_reach_opening()}: {why}; best measured "
            f"{observed:.2f}. Bottleneck: {bottleneck} ({stage_text(m, state.cpu_count)}); "
            f"taking the best: {best.workers} workers, depth {best.depth}"
        )
        self._move, self._parent = "ceiling", None
        return self._apply(
            state, best.workers, best.depth, reason, best.predicted, False, bottleneck
        )

    def _choose(
        self, state: TunerState, features: dict[str, Any], step_cap: float | None = None
    ) -> Choice:
        """The planner's choice for these features, at the current goal and stage times."""
        return self.planner.choose(
            state,
            features,
            goal=self._goal,
            stages=self._smoothed(),
            pace=self._pace(),
            step_cap=step_cap,
        )

    def _pace(self) -> Pace:
        """The recent step and how late batches came (`service_spread`) over the last
        shift window: at a regime shift, a longer window holds more batches of the old
        regime, and their difference from the new one reads as lateness."""
        services = [s.service_ms for s in list(self._recent)[-self.shift_window :]]
        step = median(s.step_ms for s in self._recent)
        return Pace(step_ms=step, spread=service_spread(services))

    def _plan(self, state: TunerState, why: str, last: int | None = None) -> Decision:
        return self._apply_plan(state, why, self._choose(state, self._features(last)))

    def _apply_plan(self, state: TunerState, why: str, choice: Choice) -> Decision:
        self._move, self._parent, self._urgent = "plan", None, False
        return self._apply_choice(state, why, choice)

    def _apply_choice(self, state: TunerState, why: str, choice: Choice) -> Decision:
        """Apply a candidate chosen by `_choose` (or a climb), saying why and what."""
        w, d = choice.workers, choice.depth
        return self._apply(
            state,
            w,
            d,
            f"{why}; {choice.note}: {w} workers, depth {d}",
            choice.predicted,
            choice.feasible,
            choice.bottleneck,
        )

    def _apply(
        self,
        state: TunerState,
        workers: int,
        depth: int,
        reason: str,
        predicted: dict[str, float],
        feasible: bool = True,
        bottleneck: str | None = None,
    ) -> Decision:
        decision = Decision(workers, depth, reason, dict(predicted), feasible, bottleneck)
        current, self._current = self._current, decision
        self._ahead, self._behind = 0, None
        self._checked_at = state.batch_index  # the next check reads batches after this one
        if current is None or (current.workers, current.depth) != (workers, depth):
            self._planned_at, self._in_effect = state.batch_index, False
            # New workers' first batches pay for opening files (footers, connections);
            # they come after the batches already in flight. Not judged, not a baseline.
            added = workers - current.workers if current else 0
            self._settle = self.settle_batches + (current.depth if added > 0 else 0) + max(0, added)
            self._baseline.rebase()  # re-measured under the new configuration
            self._filled = False
            self._record.clear()
        return self._emit(state, decision)

    def _hold(self) -> Decision:
        current = self._current
        if current is None:  # unreachable: decide() plans before it holds
            raise RuntimeError("LearnedTuner._hold called before any plan")
        reason = (
            current.reason if current.reason.startswith("holding") else f"holding: {current.reason}"
        )
        return Decision(
            current.workers,
            current.depth,
            reason,
            current.predicted,
            current.feasible,
            current.bottleneck,
        )

    def candidate_table(self) -> pd.DataFrame:
        """Every candidate (workers, depth) within the budget with its predicted
        utilization, throughput and memory, for the last measured state (for reports)."""
        if not self._recent:
            raise TunerConfigError("No batch measured yet: call decide() first.")
        features = self._features()
        return self.planner.table(self._recent[-1], features, self._pace())

    def _emit(self, state: TunerState, decision: Decision) -> Decision:
        self.history.append((state.batch_index, decision))
        return decision

    def stats(self) -> list[dict[str, Any]]:
        """Decisions taken so far (not the holds), for `loader.stats()`."""
        return [
            {
                "batch": b,
                "workers": d.workers,
                "depth": d.depth,
                "reason": d.reason,
                "feasible": d.feasible,
                "bottleneck": d.bottleneck,
                **d.predicted,
            }
            for b, d in self.history
            if not d.reason.startswith("measuring")
        ]
