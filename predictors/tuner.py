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
   (a change of `LARGE_SLOWDOWN` times or more either way is always a new regime);
3. decide, when the current record's confidence interval excludes the goal or a
   window of `window_services` service times is full: predict every candidate
   (`predictors.planning`; measured ones by their record), and take the least memory
   whose lower bound meets the goal, moving memory by at most `max_step` times a step
   (after a slowdown, `max_step` times as much more as the service slowed).
   The current configuration is kept while its measured mean meets the goal and no
   cheaper one is predicted to (measuring longer narrows the bound). After a large
   slowdown the first plan assumes `shift_headroom` times the storage wait measured:
   how the new regime's service grows with more workers (a shared link, throttling)
   is not measured yet, and a few batches of extra memory cost less than a second
   step. A slowdown over within `burst_batches`, back to about the service before
   it, was a burst: its batches rejoin the regime before it, so the plan keeps the
   depth that rides out the next one instead of chasing each.

Parameters: `target_utilization`, `memory_budget_bytes`, `max_workers`, `confidence`
(z of the lower bound), `max_step` (memory factor per step), `settle_services`,
`window_services`, the detector's `shift_threshold`, `shift_headroom` and
`burst_batches`.

Example:
    >>> tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=2**31)
    >>> decision = tuner.decide(state)            # state: a TunerState from telemetry
    >>> engine.set_workers(decision.workers); engine.set_depth(decision.depth)
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np

from predictors.errors import TunerConfigError
from predictors.measure import ChangeDetector, Measured, Service, summarize
from predictors.planning import Planner
from predictors.state import (
    Decision,
    PerformanceModel,
    Tuner,
    TunerState,
    check_budget,
    check_target,
    state_features,
)

if TYPE_CHECKING:
    import pandas as pd

# A slowdown this large (the service this many times slower) is a new regime whose
# scaling with workers is unknown; smaller alarms come with the tuner's own changes.
LARGE_SLOWDOWN = 4.0
# A slowdown that ends back within this factor of the service before it was a burst.
TRANSIENT_LEVEL = 1.5

__all__ = ["Decision", "LearnedTuner", "PerformanceModel", "Tuner", "TunerState"]


class LearnedTuner:
    """Least memory whose lower confidence bound meets the target; see the module doc."""

    def __init__(
        self,
        model: PerformanceModel | None = None,
        *,
        target_utilization: float = 0.9,
        memory_budget_bytes: float | None = None,
        max_workers: int | None = None,
        max_depth: int = 64,
        start: tuple[int, int] = (1, 1),
        confidence: float = 0.5,
        max_step: float = 8.0,
        settle_services: float = 1.0,
        window_services: float = 3.0,
        shift_threshold: float = 8.0,
        shift_headroom: float = 1.5,
        burst_batches: int = 40,
        warmup_batches: int = 3,
    ) -> None:
        if model is None:
            from predictors.model import load_default

            model = load_default()
        self.model = model
        self.target = check_target(target_utilization)
        self.budget = memory_budget_bytes
        self.start = start
        self.max_step = max_step
        self.settle_services = settle_services
        self.window_services = window_services
        self.warmup_batches = warmup_batches
        if not shift_headroom >= 1.0:
            raise TunerConfigError(
                f"`shift_headroom` must be at least 1. Found: {shift_headroom!r}. "
                "Fix: 1 plans for the service as measured; 1.5 is the default."
            )
        self.shift_headroom = shift_headroom
        if not burst_batches >= 0:
            raise TunerConfigError(
                f"`burst_batches` must be at least 0. Found: {burst_batches!r}. "
                "Fix: 0 reads every slowdown as a new regime; 40 is the default."
            )
        self.burst_batches = burst_batches
        self.confidence = confidence
        self.planner = Planner(
            model,
            target=self.target,
            budget=memory_budget_bytes,
            max_workers=max_workers,
            max_depth=max_depth,
            confidence=confidence,
            prior_error=_prior_error(model),
        )
        self.detector = ChangeDetector(threshold=shift_threshold, large=LARGE_SLOWDOWN)
        self.history: list[tuple[int, Decision]] = []  # every change, with its batch
        self._current = Decision(*start, f"safe start: {start[0]} worker(s), depth {start[1]}")
        self._records: dict[tuple[int, int], Measured] = defaultdict(Measured)
        self._samples: list[TunerState] = []  # settled batches of the current configuration
        self._regime: list[TunerState] = []  # settled batches since the last shift
        # At a slower alarm: its batch, the regime and records before it, their service.
        self._episode: tuple[int, list[TunerState], dict, float] | None = None
        self._in_effect = True
        self._settle_ms = 0.0
        self._contention: dict[tuple[int, int], float] = {}
        self._since_plan = 0
        self._calibration = (1.0, 1.0)
        self._last: dict[str, Any] | None = None  # the last plan's table, for reports
        # How far a prediction may be off in utilization: the model's measured error.
        self._prior_spread = float(getattr(model, "utilization_error", 0.1))

    def decide(self, state: TunerState) -> Decision:
        check_budget(self.budget, state.one_batch_bytes)
        if not self.history:
            self.history.append((state.batch_index, self._current))
        config = (self._current.workers, self._current.depth)
        if (state.workers, state.depth) != config:
            return self._current  # the change has not taken effect yet
        if not self._in_effect:
            self._in_effect = True
            estimate = self._last["service"] if self._last else state.service_ms
            self._settle_ms = self.settle_services * estimate
            self._samples, self._since_plan = [], 0
            self.detector.rebase(self._contention.get(config, 1.0))
        if state.batch_index == 0 or state.epoch_start:
            return self._current  # waited for an empty pipeline: no sample
        if self._settle_ms > 0:
            self._settle_ms -= state.step_ms + state.stall_ms
            return self._current
        self._samples.append(state)
        self._regime = [*self._regime[-255:], state]
        self._since_plan += 1
        self._records[config].add(state)
        shift = self.detector.update(state.service_ms)
        if shift is not None:
            fresh = max(self.detector.run, 2)
            before = self._last["service"] if self._last else float("nan")
            after = summarize(self._samples[-fresh:]).service_ms
            if shift == "faster" and self._transient(state, after):
                why = f"burst over (service back to {after:.1f} ms; its batches kept)"
                return self._plan(state, why)
            if shift == "slower" and self._regime:
                level = summarize(self._regime).service_ms
                self._episode = (state.batch_index, self._regime, dict(self._records), level)
            self._samples = self._regime = self._samples[-fresh:]
            self._records.clear()
            self._records[config] = _record(self._samples)
            self._calibration = (1.0, 1.0)
            headroom = self.shift_headroom if after >= LARGE_SLOWDOWN * before else 1.0
            why = f"regime shift ({shift}: service {before:.1f} -> {after:.1f} ms"
            why += f"; reads taken {headroom:g}x slower until measured)" if headroom > 1 else ")"
            jump = after / before if after > before else 1.0  # nan compares False
            return self._plan(state, why, shifted=True, headroom=headroom, jump=jump)
        if self._due():
            return self._plan(state, "measured")
        return self._current

    def _transient(self, state: TunerState, after: float) -> bool:
        """A faster alarm soon after a slower one, back to about the service before it
        (at most 1.5x above, less than `LARGE_SLOWDOWN` x below), ends a burst, not a
        regime: the burst's batches join the regime before it, so the lateness they
        caused is planned for (a burst dropped with its regime comes back, and the
        depth it needs was given up)."""
        episode, self._episode = self._episode, None
        if episode is None or state.batch_index - episode[0] > self.burst_batches:
            return False
        _, regime, records, level = episode
        if not level / LARGE_SLOWDOWN < after <= TRANSIENT_LEVEL * level:
            return False  # not back: still slower, or a large change (a regime)
        self._regime = [*regime, *self._regime][-256:]
        for key, record in records.items():
            self._records.setdefault(key, record)
        return True

    def _due(self) -> bool:
        """A decision is due when the record's interval excludes the goal, or a window
        of `window_services` service times (at least the warm-up) is full."""
        n = self._since_plan
        if n < self.warmup_batches:
            return False
        if n >= self._window():
            return True
        record = self._records[(self._current.workers, self._current.depth)]
        margin = self.confidence * record.standard_error
        return n >= 4 and abs(record.utilization - self.target) > max(margin, 0.02)

    def _window(self) -> int:
        """Batches in `window_services` service times at the current pace (4 to 64)."""
        recent = self._samples[-8:]
        service = median(s.service_ms for s in recent)
        pace = max(median(s.step_ms for s in recent), 1e-3)
        return max(self.warmup_batches, min(64, math.ceil(self.window_services * service / pace)))

    def _plan(
        self,
        state: TunerState,
        why: str,
        shifted: bool = False,
        headroom: float = 1.0,
        jump: float = 1.0,
    ) -> Decision:
        self._since_plan = 0
        est = summarize(self._regime, self.planner.cores_share)
        sized = est if headroom == 1.0 else _slower(est, headroom)
        config = (self._current.workers, self._current.depth)
        grid = self.planner.grid(state.one_batch_bytes, state.cpu_count)
        if config not in grid:
            grid.append(config)
        self._calibrate(config, est, state.cpu_count)
        record = self._records[config]
        # The learned correction stands in for measurement until there is some: once a
        # configuration of this regime holds two blocks of batches, measurement decides.
        measured = any(len(r.blocks) >= 2 for r in self._records.values())
        features = state_features(state) if self.planner.weight > 0 and not measured else None
        point, lower = self.planner.predict(
            grid, sized, state.cpu_count, self._calibration, features
        )
        self._blend(grid, point, lower)
        memory = np.array([d for _, d in grid], dtype=float) * state.one_batch_bytes
        here = config[1] * state.one_batch_bytes
        # Little's law: the workers (and depth) a slowdown needs grow with its size.
        allowed = (memory <= here * self.max_step * jump) & (memory >= here / self.max_step)
        choice = self.planner.choose(
            grid,
            point,
            lower,
            goal=self.target,
            batch_bytes=state.one_batch_bytes,
            est=sized,
            cpu_count=state.cpu_count,
            allowed=allowed,
        )
        self._last = {"grid": grid, "point": point, "lower": lower, "service": est.service_ms}
        self._last.update(memory=memory, est=est)
        new = (choice.workers, choice.depth)
        keep = record.batches >= 4 and record.utilization >= self.target
        mem_new = choice.depth * state.one_batch_bytes
        if new == config or (keep and mem_new >= here and not shifted):
            self._samples = self._samples[-64:]
            self._current = Decision(
                *config,
                f"{why}: holding ({choice.note})",
                choice.predicted,
                choice.feasible,
                choice.bottleneck,
            )
            return self._current
        self._current = Decision(
            *new, f"{why}: {choice.note}", choice.predicted, choice.feasible, choice.bottleneck
        )
        self._contention = {new: self.planner.service_ratio(est, min(config), min(new))}
        self._in_effect = False
        self.history.append((state.batch_index, self._current))
        return self._current

    def _calibrate(self, config: tuple[int, int], est: Service, cpu_count: int) -> None:
        """A measured shortfall against the prediction, read as the model term it
        identifies: with workers to spare (rate headroom >= 1) the depth was short
        (bursts, tails: the depth factor grows), else the service was slower than its
        stage times show (retries, hidden costs: the rate factor shrinks)."""
        record = self._records[config]
        if len(record.blocks) < 2 or record.utilization >= 0.97:
            return  # saturated or barely measured: says nothing of the model
        rate, depth = self._calibration
        point, _ = self.planner.predict([config], est, cpu_count, (1.0, depth))
        active = min(config)
        cores = max(self.planner.cores_share * cpu_count, 1.0)
        cpu = min(est.cpu_ms or 0.0, est.service_ms)
        headroom = active * est.step_ms / (est.wait_ms + cpu * max(1.0, active / cores))
        ratio = record.utilization / max(float(point[0]), 1e-3)
        if ratio >= 1.0:
            return
        if headroom * rate >= 1.0:
            self._calibration = (rate, float(np.clip(depth / ratio, 1.0, 8.0)))
        else:
            self._calibration = (float(np.clip(ratio, 0.2, 1.0)), depth)

    def _blend(self, grid: list[tuple[int, int]], point: np.ndarray, lower: np.ndarray) -> None:
        """Measured and predicted utilization combined by their variances (in place):
        a long record outweighs the prior, a short one only nudges it."""
        z = max(self.confidence, 1e-6)
        for i, key in enumerate(grid):
            record = self._records.get(key)
            if record is None or record.batches < 2:
                continue
            prior_var = max((point[i] - lower[i]) / z, self._prior_spread) ** 2
            measured_var = max(record.standard_error, 0.01) ** 2
            weight = prior_var / (prior_var + measured_var)
            point[i] = (1 - weight) * point[i] + weight * record.utilization
            lower[i] = point[i] - z * math.sqrt(
                prior_var * measured_var / (prior_var + measured_var)
            )

    def candidate_table(self) -> pd.DataFrame:
        """The last plan's candidates: predicted utilization, its lower bound, memory."""
        import pandas as pd

        if self._last is None:
            return pd.DataFrame(
                columns=["workers", "depth", "predicted_utilization", "lower_bound"]
            )
        grid = self._last["grid"]
        return pd.DataFrame(
            {
                "workers": [w for w, _ in grid],
                "depth": [d for _, d in grid],
                "predicted_utilization": self._last["point"],
                "lower_bound": self._last["lower"],
                "predicted_memory_bytes": self._last["memory"],
            }
        )

    def service(self) -> Service | None:
        """The last plan's service estimate (None before the first plan)."""
        return None if self._last is None else self._last["est"]


def _slower(est: Service, factor: float) -> Service:
    """The estimate with its storage wait `factor` times longer (the CPU as measured)."""
    return dataclasses.replace(
        est,
        service_ms=est.service_ms + (factor - 1.0) * est.wait_ms,
        wait_ms=est.wait_ms * factor,
        read_ms=est.read_ms * factor,
    )


def _record(states: list[TunerState]) -> Measured:
    record = Measured()
    for s in states:
        record.add(s)
    return record


def _prior_error(model: Any) -> float:
    """The prior's typical log error on throughput: 1.48 x its median absolute
    percentage error on unseen groups (a normal's sd), at least 0.03."""
    metrics = getattr(model, "metrics", {}) or {}
    mdape = metrics.get("queueing_mdape_throughput", 0.04)
    return max(0.03, 1.4826 * float(mdape))
