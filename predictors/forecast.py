"""Predicted utilization of every candidate (workers, depth), with a lower confidence
bound, and the choice: the least memory whose lower bound meets the goal.

The prediction is a physical prior from what was measured (Plumber's lesson: measured
rates under the machine's limits generalize):

- queueing: `a = min(workers, depth)` workers each take S(a) ms a batch, so they
  deliver a / S(a) batches per ms, and utilization is that times the step (Little's
  law: enough workers to cover the storage time reach 1, whatever a model says);
- CPU contention: of S, the measured worker CPU c is shared by the usable cores P,
  S(a) = W + c * max(1, a / P) with W the waiting (storage) part; so a / S(a) never
  exceeds P / c, however many workers;
- depth: a batch asked for `depth` batch intervals before it is needed stalls the
  consumer by what its service exceeds that, read from the measured services
  themselves (heavy tails and bursts count as often as they came);
- confidence: the headroom a * step / S(a) is uncertain by a log-normal factor of
  sigma = sqrt(prior_error^2 + spread^2 / samples); the lower bound uses
  exp(-confidence * sigma).

So utilization = step / (interval + lateness), interval = max(step, S(a) / a).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from predictors.config import CONSTANTS, TunerConfig, TunerConstants
from predictors.measure import Service
from predictors.state import Decision, name_bottleneck, stage_text

__all__ = ["DEPTH_GRID", "Forecaster"]

DEPTH_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class Forecaster:
    """Predicts candidates from a `Service` estimate and chooses among them.

    Its numbers come from `config` (`confidence`: z of the lower bound) and `constants`
    (`near_best`, `cores_share`: the share of the cores the workers can keep busy, and
    `prior_error`: the prior's typical log error on throughput, unless given).
    """

    def __init__(
        self,
        *,
        target: float,
        budget: float | None,
        max_workers: int | None,
        max_depth: int = 64,
        config: TunerConfig | None = None,
        constants: TunerConstants = CONSTANTS,
        prior_error: float | None = None,
    ) -> None:
        config = config or TunerConfig()
        self.target = target
        self.budget = budget
        self.max_workers = max_workers
        self.max_depth = max_depth
        self.confidence = config.confidence
        self.prior_error = constants.prior_error if prior_error is None else prior_error
        self.cores_share = constants.cores_share
        self.near_best = constants.near_best
        self.tail_quantile = constants.tail_quantile

    def grid(self, batch_bytes: float, cpu_count: int) -> list[tuple[int, int]]:
        """Every (workers, depth) within the budget, no more workers than depth (the
        engine keeps at most `depth` batches in flight: more workers would idle)."""
        cap = self.max_workers or max(2 * cpu_count, 4)
        room = self.max_depth
        if self.budget is not None:
            room = max(1, min(room, int(self.budget // max(batch_bytes, 1.0))))
        # The grid's steps, and the whole room: a budget of 7 batches allows depth 7.
        fits = sorted({d for d in DEPTH_GRID if d <= room} | {room})
        return [(w, d) for d in fits for w in range(1, min(cap, d) + 1)]

    def predict(
        self,
        grid: list[tuple[int, int]],
        est: Service,
        cpu_count: int,
        calibration: Any = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Point prediction and lower bound of utilization for each candidate.
        `calibration` (`tuner.Calibration`, None: none): factors learned from measured
        shortfalls; `rate` scales the workers' headroom, `depth` the depth needed."""
        rate = 1.0 if calibration is None else calibration.rate
        depth_scale = 1.0 if calibration is None else calibration.depth
        workers = np.array([w for w, _ in grid], dtype=float)
        depth = np.array([d for _, d in grid], dtype=float)
        active = np.minimum(workers, depth)
        service = self.service_at(est, active, cpu_count)
        headroom = active * est.step_ms / service * rate
        sigma = math.sqrt(self.prior_error**2 + est.spread**2 / max(est.samples, 1))
        point = self.utilization(headroom, depth, service, est, depth_scale)
        low = headroom * math.exp(-self.confidence * sigma)
        lower = self.utilization(low, depth, service, est, depth_scale)
        return point, lower

    def utilization(
        self,
        headroom: np.ndarray,
        depth: np.ndarray,
        service: np.ndarray,
        est: Service,
        scale: float = 1.0,
    ) -> np.ndarray:
        """step / (interval + lateness): the consumer asks for a batch every `interval`
        (the step, or what the workers deliver when they cannot keep up: Little's law),
        and a batch asked for `depth` intervals before it is needed stalls it by what
        its service exceeds that. Lateness is read from the measured services
        themselves (each over their mean, at the candidate's service), so a heavy tail
        or a burst counts as often as it came; `scale` multiplies it (a measured
        shortfall the workers' rate does not explain)."""
        step = est.step_ms
        interval = step / np.minimum(1.0, np.maximum(headroom, 1e-6))
        late = np.zeros_like(depth)
        if est.relative:
            relative = np.asarray(est.relative)[None, :]
            excess = service[:, None] * relative - (depth * interval)[:, None]
            late = np.maximum(excess, 0.0).mean(axis=1)
        return np.minimum(1.0, step / (interval + scale * late))

    def cores(self, est: Service, cpu_count: int) -> float:
        """Cores the workers' CPU is shared by: the share `est` learned, else the prior's."""
        share = self.cores_share if est.cores_share is None else est.cores_share
        return max(share * cpu_count, 1.0)

    def service_at(self, est: Service, active: Any, cpu_count: int | None = None) -> Any:
        """One batch's service (ms) the prior expects at `active` busy workers (a
        number or an array): the wait as measured, the CPU at the cores' contention
        (`cpu_count`, else the estimate's)."""
        cores = self.cores(est, est.cpu_count if cpu_count is None else cpu_count)
        cpu = min(est.cpu_ms or 0.0, est.service_ms)
        return est.wait_ms + cpu * np.maximum(1.0, np.asarray(active) / cores)

    def service_ratio(self, est: Service, active: int, new_active: int) -> float:
        """How much the prior expects one batch's service to change from `active` to
        `new_active` busy workers (the cores' contention)."""
        after, before = self.service_at(est, new_active), self.service_at(est, active)
        return float(after / max(float(before), 1e-6))

    def choose(
        self,
        grid: list[tuple[int, int]],
        point: np.ndarray,
        lower: np.ndarray,
        *,
        goal: float,
        batch_bytes: float,
        est: Service,
        cpu_count: int,
        allowed: np.ndarray,
    ) -> Decision:
        """The least memory (then fewest workers) whose lower bound meets `goal` among
        `allowed` candidates; else the best point prediction, least memory near it."""
        memory = np.array([d for _, d in grid], dtype=float) * batch_bytes
        workers = np.array([w for w, _ in grid])
        everything = list(np.lexsort((workers, memory)))
        order = [i for i in everything if allowed[i]]
        meets = [i for i in order if lower[i] >= goal]
        facts = self.facts(est, cpu_count)
        feasible, bottleneck = True, None

        tail = self.tail_headroom(grid, est, cpu_count)

        def best_workers(first: int, among: list[int], score: np.ndarray) -> int:
            # Workers cost no memory: at `first`'s memory, the workers that score best
            # buy margin for free; among equal scores, the fewest that keep up at the
            # tail's service (a burst is ridden out by workers, not only by depth),
            # else the most headroom there up to a worker per core (torch's default).
            same = [j for j in among if memory[j] == memory[first]]
            top = max(round(float(score[j]), 3) for j in same)
            best = [j for j in same if round(float(score[j]), 3) == top]
            keep_up = [j for j in best if tail[j] >= 1.0]
            if keep_up:
                return min(keep_up, key=lambda j: workers[j])
            few = min(workers[j] for j in best)
            within = [j for j in best if workers[j] <= max(few, cpu_count)]
            return max(within, key=lambda j: (round(float(tail[j]), 2), -workers[j]))

        if meets:
            i = best_workers(meets[0], meets, lower)
            note = f"least memory whose lower bound meets {goal:.2f}"
        else:
            best = max(point[j] for j in order)
            i = best_workers(
                next(j for j in order if point[j] >= best - self.near_best), order, point
            )
            if any(lower[j] >= goal for j in everything):
                note = f"a bounded memory step toward what meets {goal:.2f}"
            elif point[i] >= goal:
                note = f"the best; nothing meets {goal:.2f} with confidence"
            else:
                overall = max(point[j] for j in everything)
                feasible, bottleneck = False, self.bottleneck(est, cpu_count)
                note = f"{self.out_of_reach(overall)}. Bottleneck: {bottleneck}; taking the best"
        predicted = {
            "utilization": float(point[i]),
            "lower_bound": float(lower[i]),
            "memory_bytes": float(memory[i]),
            "throughput_sps": float(point[i]) / est.step_ms * 1e3,
        }
        return Decision(
            workers=int(grid[i][0]),
            depth=int(grid[i][1]),
            reason=f"{note}: predicted {point[i]:.2f} (lower bound {lower[i]:.2f}); {facts}",
            predicted=predicted,
            feasible=feasible,
            bottleneck=bottleneck,
        )

    def tail_headroom(
        self, grid: list[tuple[int, int]], est: Service, cpu_count: int
    ) -> np.ndarray:
        """Each candidate's workers' headroom at the `tail_quantile` of the measured
        services (pooled: bursts and tails of earlier runs included); inf without
        samples to read it from."""
        if len(est.relative) < 2:
            return np.full(len(grid), np.inf)
        slow = float(np.quantile(np.asarray(est.relative), self.tail_quantile))
        active = np.array([min(w, d) for w, d in grid], dtype=float)
        return active * est.step_ms / (self.service_at(est, active, cpu_count) * max(slow, 1.0))

    def out_of_reach(self, best: float) -> str:
        budget = "" if self.budget is None else f" within {self.budget / 2**20:.0f} MiB"
        return f"target {self.target:.2f} is out of reach{budget}: best predicted {best:.2f}"

    def bottleneck(self, est: Service, cpu_count: int) -> str:
        """The cores when the CPU bound is what limits, else the longest stage."""
        cores = max(self.cores_share * cpu_count, 1.0)
        cpu_bound = bool(est.cpu_ms) and cores * est.step_ms / est.cpu_ms < self.target
        return name_bottleneck({**est.stages(), "stall_ms": 0.0}, cpu_count, cpu_bound=cpu_bound)

    def facts(self, est: Service, cpu_count: int) -> str:
        return (
            f"service {est.service_ms:.1f} ms a batch at {est.active} busy worker(s) "
            f"(lateness {est.spread:.2f}), {stage_text(est.stages())}"
        )
