"""Candidate planning: which (workers, depth) to try next, from the model's predictions.

The learned tuner (`predictors.tuner`) decides *when* to re-plan and what it measured;
the planner decides *what* to try: every candidate within the memory cap gets a
predicted utilization (the model's, clipped by first principles and by what the cores
allow), and the one with the least memory that meets `goal + margin` is chosen, else the
cheapest near the best, said to be out of reach with its bottleneck named.

The planner keeps what the tuner learned about the workload between plans: `slowness`,
the ratio of the effective service time to the measured one (raised by shortfalls the
stage times do not explain), and `ceiling`, the memory above which more workers and
depth were measured not to help.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import fmean, median
from typing import TYPE_CHECKING, Any

import numpy as np

from predictors.baselines import QueueingModel
from predictors.state import (
    CORES_USABLE,
    PerformanceModel,
    TunerState,
    cpu_bound_utilization,
    name_bottleneck,
    nominal_service_ms,
    stage_text,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DEPTH_GRID", "CandidatePlanner", "Choice", "Pace", "depth_needed", "service_spread"]

DEPTH_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class Choice:
    """A planned configuration: what to apply, in words why, and what is expected of it."""

    workers: int
    depth: int
    note: str
    predicted: dict[str, float]
    feasible: bool = True
    bottleneck: str | None = None
    cores_limit: str | None = None  # when the cores are what limits, in words
    cores: float | None = None  # the utilization they allow (None: CPU not measured)

    def climbed(self, workers: int, depth: int, note: str) -> Choice:
        """The same plan, applied at another configuration (a measured climb)."""
        return dataclasses.replace(self, workers=workers, depth=depth, note=note)


@dataclass(frozen=True)
class Pace:
    """The consumer's step and how late batches come (`service_spread`): what the depth
    a configuration needs depends on (`depth_needed`)."""

    step_ms: float
    spread: float = 0.0


def service_spread(services: list[float]) -> float:
    """How late recent batches come, as a fraction of the mean service time (a cv).

    Only lateness counts: the spread is read from the upper half of `services` (recent
    batches' stage times), as the median of the deviations above the median over
    0.6745 (a normal's median deviation). An early batch never stalls the consumer, yet
    its deviation raised the standard deviation as much: on nas a worker that got two
    neighbouring row groups read the second in 2-4 ms from its read-ahead block, against
    10-15 ms for the rest, and one worker's first batch (opening the file) took 26-30
    ms; those two samples in eight made the standard deviation 0.35-0.45 of the mean,
    and the plan 3 workers at depth 6 where 3 / 4 and 3 / 3 measured 0.97-0.99. For a
    lognormal tail the two agree (sigma 0.5: 0.54 and 0.52 of the mean, 20,000 draws).

    >>> round(service_spread([11.0, 2.5, 12.0, 11.5, 29.0, 12.5, 11.0, 12.0]), 2)
    0.06

    (Their standard deviation is 0.52 of the mean.)
    """
    if len(services) < 4 or (mean := fmean(services)) <= 0:
        return 0.0
    middle = median(services)
    late = [s - middle for s in services if s > middle]
    return min((median(late) / 0.6745 if late else 0.0) / mean, 1.0)


def depth_needed(active: int, service_ms: float, step_ms: float, spread: float) -> float:
    """Batches of depth that keep the consumer fed by `active` busy workers through late
    batches: the least of two conditions that each suffice.

    In time: a batch requested `depth` steps before the consumer needs it is on time if
    it is built within depth * step, i.e. the service time, two spreads for a late
    batch, and the wait behind the worker's previous batch when late ones come in a row
    (Kingman's, for requests at a fixed rate: rho / (1 - rho) * cv^2 / 2 * service,
    rho = service / (active * step)). With workers to spare that asks less than one
    batch beyond the service: 3 workers at nas 4 ms (11.5 ms a batch) need depth 4.
    In batches: depth beyond the busy workers covering a batch two spreads late, at
    most as many again (the rule before; it holds whether or not the workers keep up,
    which Kingman's wait does not: it grows without bound near saturation).

    >>> round(depth_needed(3, service_ms=11.5, step_ms=4.0, spread=0.1), 1)
    3.6
    >>> round(depth_needed(4, service_ms=65.0, step_ms=20.0, spread=0.4), 1)
    6.6
    >>> round(depth_needed(32, service_ms=450.0, step_ms=10.0, spread=0.3), 1)
    59.0
    """
    step = max(step_ms, 1e-3)
    beyond = active + min(2 * spread * service_ms / step, active)
    rho = service_ms / (max(active, 1) * step)
    if spread > 0 and rho >= 1:
        return beyond
    wait = rho / (1 - rho) * spread**2 / 2 * service_ms if spread > 0 else 0.0
    return min((service_ms * (1 + 2 * spread) + wait) / step, beyond)


class CandidatePlanner:
    """Predicts every candidate within the memory cap and chooses the least memory that
    meets the goal with the model's margin (`choose`)."""

    def __init__(
        self,
        model: PerformanceModel,
        *,
        target: float,
        margin: float,
        budget: float | None,
        max_workers: int | None,
        max_depth: int,
    ) -> None:
        self.model = model
        self.target = target
        self.margin = margin
        self.budget = budget
        self.max_workers = max_workers
        self.max_depth = max_depth
        self.slowness = 1.0  # effective / measured service time, learned from observation
        self.ceiling = math.inf  # memory above which more workers and depth did not help

    def workers_cap(self, state: TunerState) -> int:
        return self.max_workers or max(2 * state.cpu_count, 4)

    def memory_cap(self, state: TunerState) -> float:
        cap = self.ceiling
        if self.budget is not None:
            cap = min(cap, self.budget)
        return max(cap, state.one_batch_bytes)  # one batch always fits (check_budget)

    def depths(self, state: TunerState, step_cap: float | None = None) -> list[int]:
        cap = self.memory_cap(state)
        if step_cap is not None:
            cap = max(min(cap, step_cap), state.one_batch_bytes)
        return [d for d in DEPTH_GRID if d <= self.max_depth and d * state.one_batch_bytes <= cap]

    def service_ms(self, features: dict[str, Any]) -> float:
        """The service time planned for: the measured one, times `slowness`."""
        return nominal_service_ms(features) * self.slowness

    def out_of_reach_opening(self) -> str:
        budget = "" if self.budget is None else f" within {self.budget / 2**20:.0f} MiB"
        return f"target {self.target:.2f} is out of reach{budget}"

    def candidates(
        self,
        state: TunerState,
        features: dict[str, Any],
        pace: Pace,
        step_cap: float | None = None,
    ) -> pd.DataFrame:
        """Every (workers, depth) within the caps, with the features the model reads."""
        import pandas as pd

        depths = self.depths(state, step_cap)
        # No more workers than depth: the engine keeps at most `depth` batches in flight,
        # so the others would idle. The learned model does not know that, and ranked
        # 22 workers at depth 4 above 4 / 4 for Pillow images on 2 cores (same memory).
        cap = self.workers_cap(state)
        rows = [(w, d) for d in depths for w in range(1, min(cap, d) + 1)]
        # Depth is what absorbs late batches; the model cannot see it (jitter is none of
        # its inputs), so candidates with too little are left out, when any remain. A
        # tenth of a batch short counts as enough: the stage times are not that exact.
        service = self.service_ms(features)
        fed = [
            (w, d)
            for w, d in rows
            if d >= depth_needed(min(w, d), service, pace.step_ms, pace.spread) - 0.1
        ]
        frame = pd.DataFrame(fed or rows, columns=["workers", "depth"])
        # The correction acts on the service time, not on the prediction: a prediction
        # capped at utilization 1 would otherwise hide how far off the model is.
        slow = self.slowness
        features = {
            **features,
            "storage_latency_ms": features["storage_latency_ms"] * slow,
            "storage_bandwidth_mbps": features["storage_bandwidth_mbps"] / slow,
            "decode_ms_per_sample": features["decode_ms_per_sample"] * slow,
        }
        for name, value in features.items():
            frame[name] = value
        return frame

    def predict(
        self, frame: pd.DataFrame, cores: float | None = None
    ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
        """The model's predictions, its utilization clipped by first principles (a
        learned model can predict 0.9 for one worker that the service time allows 0.2),
        and the first-principles utilization alone; both at most `cores`, what the
        measured worker CPU allows (`cpu_bound_utilization`)."""
        pred = self.model.predict(frame)
        util = pred["utilization"].to_numpy()
        if isinstance(self.model, QueueingModel):
            physics = util
        else:
            physics = QueueingModel().predict(frame)["utilization"].to_numpy()
            util = np.minimum(util, physics)
        if cores is not None:
            util, physics = np.minimum(util, cores), np.minimum(physics, cores)
        return pred, util, physics

    def choose(
        self,
        state: TunerState,
        features: dict[str, Any],
        *,
        goal: float,
        stages: dict[str, float],
        pace: Pace,
        step_cap: float | None = None,
    ) -> Choice:
        """The least-memory candidate predicted to meet goal + margin (else the best);
        `stages`: the recent stage times (`LearnedTuner._smoothed`), for the cores bound
        and the bottleneck; `step_cap` bounds the memory of this one step (escalations)."""
        m = stages
        frame = self.candidates(state, features, pace, step_cap)
        cores = cpu_bound_utilization(m, state.cpu_count)
        pred, util, physics = self.predict(frame, cores)
        memory = frame["depth"].to_numpy() * state.one_batch_bytes
        required = min(goal + self.margin, 0.99)
        order = np.lexsort((frame["depth"], frame["workers"], memory))  # least memory first
        meets = [i for i in order if util[i] >= required]
        feasible, bottleneck, cores_limit = True, None, None
        if meets:
            i = meets[0]
            note = (
                f"least memory predicted to reach {required:.2f} "
                f"(target {self.target:.2f} + margin {self.margin:.2f})"
            )
        elif any(physics[j] >= required for j in order):
            # The model finds nothing, first principles do: try their cheapest and let the
            # measurement decide (escalation follows if it falls short). Cheaper than
            # jumping to the largest candidate on a prediction the model is unsure of.
            i = next(j for j in order if physics[j] >= required)
            note = (
                f"the model predicts no candidate reaching {required:.2f}, first principles "
                "do: trying their least memory and measuring"
            )
        else:
            # Highest utilization; among near-equals (within 2 %) the least memory. Out of
            # reach, within 10 %: the model's ranking near its best is within its error,
            # and measured climbs follow (`LearnedTuner._escalate`); at nas 2 ms "the
            # best" was 11/24, where 6/12 reads as much.
            best = util.max()
            near = 0.98 if best >= goal else 0.9
            i = next(j for j in order if util[j] >= best * near)
            feasible = bool(util[i] >= goal)  # a numpy bool is written as 0.0
            capped = step_cap is not None and step_cap < self.memory_cap(state)
            # The cores allow no more, whatever the workers: a larger step would not help.
            cpu_bound = cores is not None and bool(best >= 0.98 * cores)
            if cpu_bound:
                capped = False
            if capped:
                # Within the whole budget, does anything reach the target?
                full = self.predict(self.candidates(state, features, pace), cores)[1].max()
                feasible = bool(full >= goal)
                note = "climbing toward it, a bounded memory step at a time"
            if capped and feasible:
                pass
            elif feasible:
                note = f"reaches the target {self.target:.2f} but not the margin {self.margin:.2f}"
            else:
                bottleneck = name_bottleneck(m, state.cpu_count, cpu_bound)
                best_note = (
                    "climbing toward the best, a bounded memory step at a time"
                    if capped
                    else "taking the best"
                )
                if cpu_bound and cores is not None:
                    cores_limit = (
                        f"the workers' CPU ({m['cpu_ms']:.1f} ms a batch) on {CORES_USABLE:.0%} "
                        f"of {state.cpu_count} cores allows at most {cores:.2f}"
                    )
                limit = cores_limit or f"best predicted {full if capped else util[i]:.2f}"
                note = (
                    f"{self.out_of_reach_opening()}: {limit}. Bottleneck: "
                    f"{bottleneck} ({stage_text(m, state.cpu_count)}); {best_note}"
                )
        predicted = {
            "utilization": float(util[i]),
            "throughput_sps": float(pred["throughput_sps"].iloc[i]),
            "memory_bytes": float(memory[i]),
            "model_memory_bytes": float(pred["memory_bytes"].iloc[i]),
            "margin": self.margin,
            "service_scale": self.slowness,
        }
        return Choice(
            workers=int(frame["workers"].iloc[i]),
            depth=int(frame["depth"].iloc[i]),
            note=note,
            predicted=predicted,
            feasible=feasible,
            bottleneck=bottleneck,
            cores_limit=cores_limit,
            cores=cores,
        )

    def table(self, state: TunerState, features: dict[str, Any], pace: Pace) -> pd.DataFrame:
        """Every candidate within the budget with its predicted utilization, throughput
        and memory (for reports)."""
        import pandas as pd

        frame = self.candidates(state, features, pace)
        pred = self.model.predict(frame)
        return pd.DataFrame(
            {
                "workers": frame["workers"],
                "depth": frame["depth"],
                "predicted_utilization": pred["utilization"],
                "predicted_throughput_sps": pred["throughput_sps"],
                "memory_bytes": frame["depth"] * state.one_batch_bytes,
            }
        )
