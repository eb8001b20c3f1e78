"""The online controller behind `prefetch="auto"`: one model and one objective.

Objective: the least memory (depth x one batch's bytes) whose lower confidence bound
on utilization meets the target, within the memory budget. Every decision comes from
that objective applied to the current estimates; there are no per-workload rules.

Loop, per batch (`decide`):

1. measure: settled batches of the current configuration (not the pipeline's first,
   not an epoch's first, not before a change took effect and `settle_services`
   service times of consumer time passed) feed the configuration's utilization record
   and the service estimate (`predictors.measure`);
2. detect: a CUSUM on log service time (`ChangeDetector`) reads a regime shift; the
   records of the old regime are dropped and the plan is made from the new batches
   (a change of `large_slowdown` times or more either way is always a new regime);
3. decide, when the current record's confidence interval excludes the goal or a
   window of `window_services` service times is full: predict every candidate
   (`predictors.forecast`; measured ones by their record), and take the least memory
   whose lower bound meets the goal, moving memory by at most `max_step` times a step
   (after a slowdown, `max_step` times as much more as the service slowed).
   The current configuration is kept while its measured mean meets the goal and no
   cheaper one is predicted to (measuring longer narrows the bound). After a large
   slowdown the first plan assumes `shift_headroom` times the storage wait measured:
   how the new regime's service grows with more workers (a shared link, throttling)
   is not measured yet, and a few batches of extra memory cost less than a second
   step. A slowdown over within `burst_batches`, back to about the service before
   it, was a burst: its batches rejoin the regime before it, so the plan keeps the
   depth that rides out the next one instead of chasing each. A plan that judged
   the target out of reach is remade from the current configuration's batches alone
   once they serve `recheck_factor` times faster than it expected (a tail in the
   first batches inflated the mean it was judged from).

Parameters: `target_utilization`, `memory_budget_bytes`, `max_workers`, and the user
settings of `predictors.config.TunerConfig` (`confidence`: z of the lower bound,
`max_step`: memory factor per step, `settle_services`, `window_services`, the
detector's `shift_threshold`, `shift_headroom`, `burst_batches`, `warmup_batches`), as
keyword arguments or one `config=`. Every other number is a `TunerConstants` field
(`constants=`, for the lab).

Example:
    >>> tuner = QueueingTuner(target_utilization=0.9, memory_budget_bytes=2**31)
    >>> decision = tuner.decide(state)            # state: a TunerState from telemetry
    >>> engine.set_workers(decision.workers); engine.set_depth(decision.depth)
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
from collections import defaultdict
from dataclasses import dataclass
from statistics import fmean, median
from typing import TYPE_CHECKING, Any

import numpy as np

from predictors.config import CONSTANTS, TunerConfig, TunerConstants
from predictors.forecast import Forecaster
from predictors.measure import (
    ChangeDetector,
    Measured,
    Service,
    fit_cores_share,
    service_spread,
    summarize,
)
from predictors.state import (
    Decision,
    PerformanceModel,
    Tuner,
    TunerState,
    check_budget,
    check_target,
)

if TYPE_CHECKING:
    from predictors.explore import Proposal
    from predictors.history import WarmStart

log = logging.getLogger(__name__)
# How long the first decision waits for the history's model (importing scikit-learn
# took 6-8 s on a loaded 2-core machine); a plan later than this is not taken.
MODEL_WAIT_S = 60.0

__all__ = [
    "Decision",
    "LearnedTuner",
    "PerformanceModel",
    "QueueingTuner",
    "Tuner",
    "TunerConfig",
    "TunerConstants",
    "TunerState",
]


@dataclass(frozen=True)
class Calibration:
    """Factors a measured shortfall taught the prior: `rate` scales the workers'
    headroom (a service slower than its stage times show), `depth` the depth needed
    (bursts and tails the lateness term missed)."""

    rate: float = 1.0
    depth: float = 1.0


@dataclass(frozen=True)
class Episode:
    """At a slower alarm: its batch, the regime and the records before it, and the
    service level (ms) of that regime; if the slowdown ends soon, they come back."""

    batch: int
    regime: list[TunerState]
    records: dict[tuple[int, int], Measured]
    level: float
    history: dict[tuple[int, int], tuple[float, float]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Candidates:
    """The last plan's candidates and what was predicted of them, for reports: the
    prior's point, a model's change and its standard deviation (0 without one), the
    final point and lower bound after measurements, and memory."""

    grid: list[tuple[int, int]]
    prior: np.ndarray
    model_shift: np.ndarray
    model_sd: np.ndarray
    point: np.ndarray
    lower: np.ndarray
    memory: np.ndarray
    est: Service

    @property
    def service_ms(self) -> float:
        return self.est.service_ms


class QueueingTuner:
    """Least memory whose lower confidence bound meets the target, planned with the
    queueing prior and corrected by measurement; see the module doc.

    `model`: the prior (None: `QueueingModel` with the errors measured on the real
    sweeps); its `utilization_error` and `metrics["queueing_mdape_throughput"]` set how
    far its predictions may be off. The user settings are `config` (`TunerConfig`);
    keyword arguments named like its fields (`confidence=0.8`) replace them. Every other
    number is in `constants` (`TunerConstants`).
    `warm`: the run history's start (`predictors.history.WarmStart`); `explore`: let the
    history's model (`predictors.explore`) probe one depth step cheaper (False: report
    its plan only; None: fit nothing); `fallback`: where a probing start goes back to on
    a measured miss.
    """

    def __init__(
        self,
        model: PerformanceModel | None = None,
        *,
        target_utilization: float = 0.9,
        memory_budget_bytes: float | None = None,
        max_workers: int | None = None,
        max_depth: int = 64,
        start: tuple[int, int] = (1, 1),
        fallback: tuple[int, int] | None = None,
        config: TunerConfig | None = None,
        constants: TunerConstants = CONSTANTS,
        warm: WarmStart | None = None,
        explore: bool | None = True,
        **overrides: Any,
    ) -> None:
        cfg = TunerConfig.with_overrides(config, **overrides)
        if model is None:
            model = _default_model(constants)
        self.model = model
        self.config = cfg
        self.constants = constants
        self.target = check_target(target_utilization)
        self.budget = memory_budget_bytes
        self.start = start
        # A warm start that probes something cheaper than what its history measured
        # meeting: the configuration to go back to at once if this run measures a miss.
        self.fallback = fallback if fallback != start else None
        self.fell_back = False  # a probe measured a miss and the run went back
        self.forecaster = Forecaster(
            target=self.target,
            budget=memory_budget_bytes,
            max_workers=max_workers,
            max_depth=max_depth,
            config=cfg,
            constants=constants,
            prior_error=_prior_error(model, constants),
        )
        self.detector = ChangeDetector(cfg, constants)
        self.history: list[tuple[int, Decision]] = []  # every change, with its batch
        self._current = Decision(*start, f"safe start: {start[0]} worker(s), depth {start[1]}")
        # A warm run (predictors.history): it starts where earlier runs met the target and
        # plans with their pooled service, until this run measures another regime.
        self.warm = warm
        self.warm_set_aside: str | None = None  # why this run stopped using the history
        self.proposal: Proposal | None = None  # the learned model's plan for this run
        self._fitting: threading.Thread | None = None
        if warm is not None and warm.met and warm.records and explore is not None:
            # Fitted on a thread from the start (importing scikit-learn takes seconds):
            # the run begins at the history's start; a probe is taken at the first
            # decision.
            self._fitting = threading.Thread(
                target=self._explore,
                args=(warm, max_workers, explore),
                name="iolib-history-model",
                daemon=True,
            )
            self._fitting.start()
        self._warm_batches = 0  # settled batches seen while the history stood
        # What the history measured per configuration (pooled over its runs): evidence
        # the plans weigh beside this run's records while the history stands, so a
        # configuration measured meeting over earlier runs is not left on a few slow
        # batches of this one.
        self._history_measured = _history_evidence(warm, constants)
        # Where the history has seen bursts (slow batches in runs), a warm run plans no
        # fewer workers and no less depth than where it started (what the history
        # measured meeting, or a probe this run measured) while the history stands: its
        # calm stretches do not say the bursts to come spare a cheaper configuration
        # (a probe, guarded, tries one). Without bursts it plans down as a cold run does.
        self._floor: tuple[int, int] | None = None
        if warm is not None:
            self.start = warm.start
            self._current = Decision(*warm.start, warm.describe())
            if warm.met and _bursts_seen(warm, constants):
                self._floor = warm.start
        self._records: dict[tuple[int, int], Measured] = defaultdict(self._new_record)
        self._samples: list[TunerState] = []  # settled batches of the current configuration
        self._regime: list[TunerState] = []  # settled batches since the last shift
        self._evidence: list[TunerState] = []  # settled batches, shifts or not: the cores' share
        self._episode: Episode | None = None
        self._known_until: int | None = None  # a known burst's end is expected before
        # A burst the history's check took as known: (its alarm's batch, its end expected
        # before); one that does not end was another workload after all.
        self._unended: tuple[int, int] | None = None
        self._in_effect = True
        self._settle_ms = 0.0
        self._contention: dict[tuple[int, int], float] = {}
        self._since_plan = 0
        self._calibration = Calibration()
        self._last: Candidates | None = None
        self._unreachable_ms: float | None = None  # what an unreachable plan expected here
        # How far a prediction may be off in utilization: the prior's measured error.
        self._prior_spread = float(getattr(model, "utilization_error", constants.prior_spread))
        if warm is not None and warm.reference_ms:
            # The detector's reference is what the history measured at the start, so a
            # run whose service differs from it alarms as a regime shift would: spread
            # over every sample measured there (the last few may be one burst's, and the
            # run's usual service then alarms "faster").
            ordered = sorted(warm.reference_ms)
            n = constants.detector_reference
            for i in range(n):
                self.detector.update(ordered[(2 * i + 1) * len(ordered) // (2 * n)])
            self._settle_ms = cfg.settle_services * median(warm.reference_ms)

    def _explore(self, warm: WarmStart, max_workers: int | None, explore: bool) -> None:
        """The learned model's plan for this run (`predictors.explore.plan_warm`):
        perhaps one grid step cheaper than the history's start, with that start to fall
        back to. A model that fails leaves the history's start."""
        try:
            from predictors.explore import plan_warm

            _, _, proposal = plan_warm(
                warm,
                self.target,
                budget=self.budget,
                max_workers=max_workers,
                confidence=self.config.confidence,
                cores_share=self.constants.cores_share,
                explore=explore,
            )
        except Exception as exc:  # the model degrades tuning, never the run
            log.warning("predictors: the history's model failed (%s: %s)", type(exc).__name__, exc)
            return
        self.proposal = proposal

    def wait_for_model(self, timeout: float | None = None) -> Proposal | None:
        """The model's plan once fitted (None: no history, a failed fit, or `timeout`
        seconds passed); the run does not wait for it, a caller may."""
        if self._fitting is not None:
            self._fitting.join(timeout)
        return self.proposal

    def _take_probe(self, state: TunerState) -> Decision | None:
        """The model's probe, at the first decision: the fit started with the run is
        waited for here (decisions run off the batches' path, and the same history
        always gives the same plan), and a probe moves the run there, with the
        history's start to fall back to."""
        fitting, self._fitting = self._fitting, None
        if fitting is None:
            return None
        fitting.join(MODEL_WAIT_S)
        p = self.proposal
        here = (self._current.workers, self._current.depth)
        if p is None or not p.probe or self._last is not None or len(self.history) > 1:
            return None
        if self.warm_set_aside is not None or here != p.start:
            return None
        if not self.history:
            self.history.append((state.batch_index, self._current))
        self.fallback = p.start
        self._floor = (p.workers, p.depth) if self._floor else None
        predicted = {"utilization": p.predicted, "lower_bound": p.lower}
        self._current = Decision(p.workers, p.depth, f"model's probe: {p.why}", predicted)
        self._contention = {(p.workers, p.depth): p.contention}
        self._in_effect = False
        self.history.append((state.batch_index, self._current))
        return self._current

    @property
    def history_model(self) -> dict[str, Any] | None:
        """What the learned model planned for this run (None: no history, or no model):
        its choice, prediction, weight and why, and what the run measured there."""
        if self.proposal is None:
            return None
        out = self.proposal.as_dict()
        record = self._records.get((self.proposal.workers, self.proposal.depth))
        out["measured_utilization"] = record.utilization if record and record.batches else None
        out["fell_back"] = self.fell_back
        return out

    def _new_record(self) -> Measured:
        k = self.constants
        return Measured(block=k.record_block, keep=k.record_keep, unknown=k.record_unknown_error)

    def decide(self, state: TunerState) -> Decision:
        c, k = self.config, self.constants
        check_budget(self.budget, state.one_batch_bytes)
        if not self.history:
            self.history.append((state.batch_index, self._current))
        if self._fitting is not None and (probe := self._take_probe(state)) is not None:
            return probe
        config = (self._current.workers, self._current.depth)
        if (state.workers, state.depth) != config:
            return self._current  # the change has not taken effect yet
        if not self._in_effect:
            self._in_effect = True
            estimate = self._last.service_ms if self._last else state.service_ms
            self._settle_ms = c.settle_services * estimate
            self._samples, self._since_plan = [], 0
            self.detector.rebase(self._contention.get(config, 1.0))
        if state.batch_index == 0 or state.epoch_start:
            return self._current  # waited for an empty pipeline: no sample
        if self._settle_ms > 0:
            self._settle_ms -= state.step_ms + state.stall_ms
            return self._current
        self._samples.append(state)
        self._regime = [*self._regime[-(k.regime_window - 1) :], state]
        self._evidence = [*self._evidence[-(k.regime_window - 1) :], state]
        self._since_plan += 1
        self._records[config].add(state)
        shift = self.detector.update(state.service_ms)
        if shift is not None and self._known_burst(state, shift):
            shift = None
        self._check_warm(shift)
        ended = shift is None and self._unended and state.batch_index > self._unended[1]
        if ended and (plan := self._burst_did_not_end(state)) is not None:
            return plan
        if shift is not None:
            fresh = max(self.detector.run, k.fresh_batches)
            before = self._last.service_ms if self._last else float("nan")
            after = summarize(self._samples[-fresh:]).service_ms
            if shift == "faster" and self._transient(state, after):
                why = f"burst over (service back to {after:.1f} ms; its batches kept)"
                return self._plan(state, why)
            if shift == "slower" and self._regime:
                level = summarize(self._regime).service_ms
                self._episode = Episode(
                    state.batch_index,
                    self._regime,
                    dict(self._records),
                    level,
                    self._history_measured,
                )
            self._samples = self._regime = self._samples[-fresh:]
            self._records.clear()
            self._history_measured = {}  # measured in the regime before this one
            self._records[config] = self._record(self._samples)
            self._calibration = Calibration()
            headroom = c.shift_headroom if after >= k.large_slowdown * before else 1.0
            why = f"regime shift ({shift}: service {before:.1f} -> {after:.1f} ms"
            why += f"; reads taken {headroom:g}x slower until measured)" if headroom > 1 else ")"
            jump = after / before if after > before else 1.0  # nan compares False
            return self._plan(state, why, shifted=True, headroom=headroom, jump=jump)
        if self.fallback is not None and self.warm_set_aside is None:
            # A probe is judged on two record blocks, not on its first few batches: a
            # stall or two among them is no measured miss (on real tokens a probe
            # judged after 4 batches measured 0.96 over the rest of its run).
            if self._records[config].batches < k.probe_blocks * k.record_block:
                return self._current
            return self._fall_back(state)
        if self._due():
            if self._faster_than_unreachable():
                return self._replan_unreachable(state)
            return self._plan(state, "measured")
        return self._current

    def _fall_back(self, state: TunerState) -> Decision:
        """The guard of a probing start, once it holds `probe_blocks` record blocks: a
        measured miss
        (the record's interval excludes the goal from below) goes back to `fallback`,
        where the history measured the target met; a measured meet drops the fallback
        and plans as usual."""
        config = (self._current.workers, self._current.depth)
        record = self._records[config]
        fallback, self.fallback = self.fallback, None
        self.fell_back = record.utilization < self.target
        if record.utilization >= self.target:
            return self._plan(state, "probe measured")
        est = summarize(self._regime, self._cores_share(), learned=True)
        why = (
            f"probe {config[0]}/{config[1]} measured {record.utilization:.2f} < "
            f"{self.target:.2f}: back to {fallback[0]}/{fallback[1]}, met in the history"
        )
        self._current = Decision(*fallback, why)
        self._floor = fallback if self._floor else None
        ratio = self.forecaster.service_ratio(est, min(config), min(fallback))
        self._contention = {fallback: ratio}
        self._in_effect = False
        self.history.append((state.batch_index, self._current))
        return self._current

    def _check_warm(self, shift: str | None) -> None:
        """Set the history aside for the rest of the run when this run is another
        workload: in its first twice `detector_reference` settled batches, the detector
        (its reference the history's service at the start) alarmed, or the step differs
        from the history's by more than its factor. A later shift is this run's own,
        which the plan answers."""
        warm = self.warm
        if warm is None or self.warm_set_aside is not None:
            return
        self._warm_batches += 1
        if self._warm_batches > 2 * self.constants.detector_reference:
            return
        why = None
        if shift is not None:
            why = f"regime shift ({shift}) against the history's service"
        elif warm.step_ms > 0 and self._warm_batches == self.config.warmup_batches:
            step = median(s.step_ms for s in self._evidence)
            if not warm.step_ms / warm.step_factor <= step <= warm.step_ms * warm.step_factor:
                why = f"step {step:.1f} ms against {warm.step_ms:.1f} ms in the history"
        if why is not None:
            self.warm_set_aside = why

    def _pooled(self, est: Service) -> Service:
        """`est` with the history's service samples pooled into its lateness (their
        bursts and tails count as this run's do), while the history stands."""
        warm = self.warm
        if warm is None or self.warm_set_aside is not None or not warm.relative:
            return est
        relative = (*est.relative, *warm.relative)
        return dataclasses.replace(est, relative=relative, spread=service_spread(list(relative)))

    def _faster_than_unreachable(self) -> bool:
        """The last plan judged the target out of reach, and the current
        configuration's settled batches serve `recheck_factor` times faster than that
        plan expected of them: what made it unreachable is no longer measured."""
        k = self.constants
        if self._unreachable_ms is None or len(self._samples) < k.recheck_batches:
            return False
        measured = fmean(s.service_ms for s in self._samples)
        return measured * k.recheck_factor < self._unreachable_ms

    def _replan_unreachable(self, state: TunerState) -> Decision:
        """The plan remade from the current configuration's batches alone (a tail in
        the older ones no longer sets the lateness of every candidate)."""
        expected = self._unreachable_ms
        self._regime = list(self._samples)
        self._records[(self._current.workers, self._current.depth)] = self._record(self._samples)
        self._calibration = Calibration()
        self._episode = None
        measured = fmean(s.service_ms for s in self._samples)
        why = f"unreachable plan remade (service {measured:.1f} ms, {expected:.1f} ms expected)"
        return self._plan(state, why)

    def _cores_share(self) -> float:
        """The share of the cores the workers' CPU is spread over, as this run's
        settled batches show it (`measure.fit_cores_share`, the prior's as its prior).
        Its evidence is kept across regime shifts: a storage shift leaves it be."""
        k = self.constants
        return fit_cores_share(
            self._evidence,
            self.forecaster.cores_share,
            k.share_sd,
            k.share_noise,
            k.record_block,
            k.share_batches,
            np.linspace(*k.share_bounds, k.share_grid),
        )

    def _transient(self, state: TunerState, after: float) -> bool:
        """A faster alarm soon after a slower one, back to about the service before it
        (at most `transient_level` x above, less than `large_slowdown` x below), ends a
        burst, not a regime: the burst's batches join the regime before it, so the
        lateness they caused is planned for (a burst dropped with its regime comes
        back, and the depth it needs was given up)."""
        c, k = self.config, self.constants
        episode, self._episode = self._episode, None
        if episode is None or state.batch_index - episode.batch > c.burst_batches:
            return False
        if not episode.level / k.large_slowdown < after <= k.transient_level * episode.level:
            return False  # not back: still slower, or a large change (a regime)
        self._regime = [*episode.regime, *self._regime][-k.regime_window :]
        for key, record in episode.records.items():
            self._records.setdefault(key, record)
        self._history_measured = episode.history  # the regime the history measured is back
        return True

    def _known_burst(self, state: TunerState, shift: str) -> bool:
        """An alarm this workload has shown before, after the history's check: a
        slowdown no larger than `known_burst_share` of the services this run's regime
        and the history pooled (bursts included) reached, or the end of such a
        slowdown within `burst_batches`. The plan already sizes the depth for those
        services, so the regime and its records stand: reset, the next plan would
        chase the burst with memory and then drop the batches that sized the depth."""
        c, k = self.config, self.constants
        if shift == "faster":
            known = self._known_until is not None and state.batch_index <= self._known_until
            self._known_until = self._unended = None
            return known
        fresh = max(self.detector.run, k.fresh_batches)
        after = summarize(self._samples[-fresh:]).service_ms
        if self._warm_batches and self._warm_batches <= 2 * k.detector_reference:
            # The history's check: against the service the history measured at the
            # start and its pooled services alone (a burst in this run's first batches
            # set half the bursty warm runs' history aside, tuner-history.md).
            warm = self.warm
            if warm is None or not warm.reference_ms or self.warm_set_aside is not None:
                return False
            ratio = after / median(warm.reference_ms)
            relative = np.asarray(warm.relative)
            alarm = state.batch_index - fresh + 1
        else:
            before = self._regime[:-fresh]  # the alarm's own batches are what is judged
            if self._last is None or not before:
                return False
            ratio = after / self._last.service_ms
            relative = np.asarray(self._pooled(summarize(before)).relative)
            alarm = None
        if relative.size < k.known_burst_samples:
            return False
        seen = float(np.mean(relative >= k.known_burst_level * ratio * np.median(relative)))
        if seen < k.known_burst_share:
            return False
        self._known_until = state.batch_index + c.burst_batches
        if alarm is not None:
            self._unended = (alarm, self._known_until)
        return True

    def _burst_did_not_end(self, state: TunerState) -> Decision | None:
        """`burst_batches` after a slowdown the history's check took for a burst it had
        seen: if the batches since serve `transient_level` x slower than the history
        measured at the start still (their median), this run is another workload (a
        persistent slowdown within the bursts' range): the history is set aside and
        the plan made from the batches since the alarm, as for a regime shift."""
        assert self._unended is not None and self.warm is not None
        alarm, _ = self._unended
        self._unended = self._known_until = None
        since = [x.service_ms for x in self._regime if x.batch_index >= alarm]
        level = median(self.warm.reference_ms)
        if not since or median(since) <= self.constants.transient_level * level:
            return None  # it ended, unannounced: the history stands
        config = (self._current.workers, self._current.depth)
        self.warm_set_aside = (
            "regime shift (slower) against the history's service: a burst that did not end"
        )
        self._samples = [x for x in self._samples if x.batch_index >= alarm]
        self._regime = [x for x in self._regime if x.batch_index >= alarm]
        self._records.clear()
        self._history_measured = {}
        self._records[config] = self._record(self._samples)
        self._calibration = Calibration()
        return self._plan(state, self.warm_set_aside, shifted=True)

    def _due(self) -> bool:
        """A decision is due when the record's interval excludes the goal, or a window
        of `window_services` service times (at least the warm-up) is full."""
        c, k = self.config, self.constants
        n = self._since_plan
        if n < c.warmup_batches:
            return False
        if n >= self._window():
            return True
        record = self._records[(self._current.workers, self._current.depth)]
        margin = c.confidence * record.standard_error
        return n >= k.early_batches and abs(record.utilization - self.target) > max(
            margin, k.margin_floor
        )

    def _window(self) -> int:
        """Batches in `window_services` service times at the current pace."""
        c, k = self.config, self.constants
        recent = self._samples[-k.pace_samples :]
        service = median(s.service_ms for s in recent)
        pace = max(median(s.step_ms for s in recent), k.min_pace_ms)
        return max(
            c.warmup_batches, min(k.max_window, math.ceil(c.window_services * service / pace))
        )

    def _plan(
        self,
        state: TunerState,
        why: str,
        shifted: bool = False,
        headroom: float = 1.0,
        jump: float = 1.0,
    ) -> Decision:
        c, k = self.config, self.constants
        self._since_plan = 0
        est = self._pooled(summarize(self._regime, self._cores_share(), learned=True))
        sized = est if headroom == 1.0 else _slower(est, headroom)
        config = (self._current.workers, self._current.depth)
        grid = self.forecaster.grid(state.one_batch_bytes, state.cpu_count)
        if config not in grid:
            grid.append(config)
        self._calibrate(config, est, state.cpu_count)
        record = self._records[config]
        point, lower = self.forecaster.predict(grid, sized, state.cpu_count, self._calibration)
        prior = point.copy()
        sd = np.zeros(len(grid))
        shift = point - prior
        self._blend(grid, point, lower)
        memory = np.array([d for _, d in grid], dtype=float) * state.one_batch_bytes
        here = config[1] * state.one_batch_bytes
        # Little's law: the workers (and depth) a slowdown needs grow with its size.
        allowed = (memory <= here * c.max_step * jump) & (memory >= here / c.max_step)
        if self._floor is not None and self.warm_set_aside is None:
            above = np.array([w >= self._floor[0] and d >= self._floor[1] for w, d in grid])
            if (allowed & above).any():
                allowed &= above
        choice = self.forecaster.choose(
            grid,
            point,
            lower,
            goal=self.target,
            batch_bytes=state.one_batch_bytes,
            est=sized,
            cpu_count=state.cpu_count,
            allowed=allowed,
        )
        self._last = Candidates(grid, prior, shift, sd, point, lower, memory, est)
        choice = self._with_model_part(choice, grid.index((choice.workers, choice.depth)))
        new = (choice.workers, choice.depth)
        i_here = grid.index(config)
        keep = record.batches >= k.keep_batches and (
            record.utilization >= self.target
            or (
                config in self._history_measured
                and self.warm_set_aside is None
                and lower[i_here] >= self.target
            )
        )
        mem_new = choice.depth * state.one_batch_bytes
        holding = new == config or (keep and mem_new >= here and not shifted)
        self._unreachable_ms = None
        if not choice.feasible:
            self._unreachable_ms = self.forecaster.service_at(
                sized, min(config if holding else new)
            )
        if holding:
            self._samples = self._samples[-k.keep_samples :]
            self._current = dataclasses.replace(
                choice,
                workers=config[0],
                depth=config[1],
                reason=f"{why}: holding ({choice.reason})",
            )
            return self._current
        self._current = dataclasses.replace(choice, reason=f"{why}: {choice.reason}")
        self._contention = {new: self.forecaster.service_ratio(est, min(config), min(new))}
        self._in_effect = False
        self.history.append((state.batch_index, self._current))
        return self._current

    @property
    def model_part(self) -> str:
        """Which model moves the prior's predictions, in words."""
        return "none: the queueing prior and the measurements alone"

    def _with_model_part(self, choice: Decision, i: int) -> Decision:
        """The decision with what the prior predicted of the chosen configuration, what
        the model changed and how sure it was (sd, in utilization), in `predicted`
        and in words."""
        plan = self._last
        assert plan is not None
        part = {
            "prior_utilization": float(plan.prior[i]),
            "model_change": float(plan.model_shift[i]),
            "model_sd": float(plan.model_sd[i]),
        }
        if part["model_change"] or part["model_sd"]:
            words = (
                f"; prior {part['prior_utilization']:.2f}, model {part['model_change']:+.3f} "
                f"(sd {part['model_sd']:.3f})"
            )
        else:
            words = f"; prior {part['prior_utilization']:.2f}, no model"
        return dataclasses.replace(
            choice, predicted={**choice.predicted, **part}, reason=choice.reason + words
        )

    def _calibrate(self, config: tuple[int, int], est: Service, cpu_count: int) -> None:
        """A measured shortfall against the prediction, read as the model term it
        identifies: with workers to spare (rate headroom >= 1) the depth was short
        (bursts, tails: the depth factor grows), else the service was slower than its
        stage times show (retries, hidden costs: the rate factor shrinks)."""
        k = self.constants
        record = self._records[config]
        if len(record.blocks) < k.measured_blocks or record.utilization >= k.saturated:
            return  # saturated or barely measured: says nothing of the model
        rate, depth = self._calibration.rate, self._calibration.depth
        point, _ = self.forecaster.predict([config], est, cpu_count, Calibration(1.0, depth))
        active = min(config)
        cores = self.forecaster.cores(est, cpu_count)
        cpu = min(est.cpu_ms or 0.0, est.service_ms)
        headroom = active * est.step_ms / (est.wait_ms + cpu * max(1.0, active / cores))
        ratio = record.utilization / max(float(point[0]), k.min_prediction)
        if ratio >= 1.0:
            return
        if headroom * rate >= 1.0:
            self._calibration = Calibration(
                rate, float(np.clip(depth / ratio, *k.calibration_depth))
            )
        else:
            self._calibration = Calibration(float(np.clip(ratio, *k.calibration_rate)), depth)

    def _blend(self, grid: list[tuple[int, int]], point: np.ndarray, lower: np.ndarray) -> None:
        """Measured and predicted utilization combined by their variances (in place):
        a long record outweighs the prior, a short one only nudges it."""
        c, k = self.config, self.constants
        z = max(c.confidence, k.min_confidence)
        history = self._history_measured if self.warm_set_aside is None else {}
        for i, key in enumerate(grid):
            evidence = []
            record = self._records.get(key)
            batches = 0 if record is None else record.batches
            # The history speaks for a configuration unless this run measured it on
            # two blocks or more and disagrees: then this run's measurement decides.
            if key in history and not (
                batches >= k.probe_blocks * k.record_block
                and _disagree(history[key], record.utilization, record.standard_error)
            ):
                evidence.append(history[key])
            if record is not None and batches >= k.blend_batches:
                evidence.append((record.utilization, record.standard_error))
            if not evidence:
                continue
            var = max((point[i] - lower[i]) / z, self._prior_spread) ** 2
            for utilization, se in evidence:
                measured_var = max(se, k.blend_error_floor) ** 2
                weight = var / (var + measured_var)
                point[i] = (1 - weight) * point[i] + weight * utilization
                var = var * measured_var / (var + measured_var)
            lower[i] = point[i] - z * math.sqrt(var)

    def _record(self, states: list[TunerState]) -> Measured:
        record = self._new_record()
        for s in states:
            record.add(s)
        return record

    def candidate_table(self) -> list[dict[str, float]]:
        """The last plan's candidates, one row each (`pandas.DataFrame(rows)` makes a
        table): what the prior predicted, a model's change and how sure it was, the
        final prediction, its lower bound, memory. Empty before the first plan."""
        if self._last is None:
            return []
        plan = self._last
        return [
            {
                "workers": w,
                "depth": d,
                "prior_utilization": float(plan.prior[i]),
                "model_change": float(plan.model_shift[i]),
                "model_sd": float(plan.model_sd[i]),
                "predicted_utilization": float(plan.point[i]),
                "lower_bound": float(plan.lower[i]),
                "predicted_memory_bytes": float(plan.memory[i]),
            }
            for i, (w, d) in enumerate(plan.grid)
        ]

    def service(self) -> Service | None:
        """The last plan's service estimate (None before the first plan)."""
        return None if self._last is None else self._last.est


def _history_evidence(
    warm: WarmStart | None, constants: TunerConstants
) -> dict[tuple[int, int], tuple[float, float]]:
    """Per configuration the history measured on `history_batches` or more batches: its
    utilization pooled over the runs and a standard error that counts the runs'
    spread (one run's blocks understate how another run of the same job differs)."""
    if warm is None:
        return {}
    by_config: dict[tuple[int, int], list[Any]] = {}
    for r in warm.records:
        if r.batches >= constants.history_batches and math.isfinite(r.utilization):
            by_config.setdefault((r.workers, r.depth), []).append(r)
    out = {}
    for key, records in by_config.items():
        utils = [float(r.utilization) for r in records]
        within = fmean(max(float(r.utilization_se), constants.blend_error_floor) for r in records)
        between = float(np.std(utils)) if len(utils) > 1 else constants.history_run_error
        se = max(within, between, constants.history_run_error) / math.sqrt(len(utils))
        out[key] = (fmean(utils), se)
    return out


def _bursts_seen(warm: WarmStart, constants: TunerConstants) -> bool:
    """The history's services came in bursts: of the batches slower than `burst_slow`
    x their record's median (`burst_batches_seen` at least), a share `burst_persistence`
    or more followed a slow one. Tails and jitter are slow one batch at a time (a share
    of 0 on every steady family of the simulator, 0.47-0.79 on bursty ones)."""
    slow = after_slow = 0
    for r in warm.records:
        if len(r.service_ms) < 2:
            continue
        level = constants.burst_slow * median(r.service_ms)
        flags = [v >= level for v in r.service_ms]
        slow += sum(flags[1:])
        after_slow += sum(a and b for a, b in itertools.pairwise(flags))
    return slow >= constants.burst_batches_seen and after_slow >= constants.burst_persistence * slow


def _disagree(history: tuple[float, float], utilization: float, se: float) -> bool:
    """This run's measurement differs from the history's by more than two standard
    errors of the difference."""
    mean, history_se = history
    return abs(utilization - mean) > 2.0 * math.hypot(se, history_se)


def _slower(est: Service, factor: float) -> Service:
    """The estimate with its storage wait `factor` times longer (the CPU as measured)."""
    return dataclasses.replace(
        est,
        service_ms=est.service_ms + (factor - 1.0) * est.wait_ms,
        wait_ms=est.wait_ms * factor,
        read_ms=est.read_ms * factor,
    )


def _default_model(constants: TunerConstants) -> PerformanceModel:
    """The queueing prior with the errors measured on the real sweeps. No learned model
    trained on other workloads beat it on a family it never saw
    (benchmarks/results/model-transfer.md), so none is loaded here."""
    from predictors.baselines import QueueingModel

    prior = QueueingModel()
    prior.utilization_error = constants.prior_spread
    prior.metrics = {"queueing_mdape_throughput": constants.prior_mdape}
    return prior


def _prior_error(model: Any, constants: TunerConstants) -> float:
    """The prior's typical log error on throughput (`TunerConstants.prior_error`), from
    the model's measured median error where it carries one."""
    metrics = getattr(model, "metrics", {}) or {}
    mdape = metrics.get("queueing_mdape_throughput")
    if mdape is None:
        return constants.prior_error
    return max(constants.prior_error_floor, constants.mdape_to_sigma * float(mdape))


# The name it had while a learned model was planned to move the prior: kept for callers.
LearnedTuner = QueueingTuner
