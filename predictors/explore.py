"""What the next run of a workload tries: its history, a Gaussian process on the
prior's errors, and one safe step cheaper.

A workload's runs (records with `workers`, `depth`, `utilization`, `utilization_se`,
`service_ms`, `cpu_ms`, `step_ms` and `run_id`, as `predictors.history.RunRecord`
holds them) say what each configuration measured. Two predictors read them:

- the history alone (no model): a configuration measured before predicts its pooled
  measurement, any other the queueing prior fed with the pooled service times;
- the model: a scikit-learn `GaussianProcessRegressor` over (log2 workers, log2 depth)
  on the residuals (measured utilization less the prior's prediction), the prior as
  its mean, so a measurement moves its neighbours' predictions too.

The model's weight on a workload is earned: its leave-one-run-out error against the
history alone's, on that workload's own runs; 0 until it has measured better on at
least `min_runs` runs, by more than twice the spread of that difference. `propose`
starts where the history says the target was met with the least memory and tries one
grid step cheaper (a smaller depth) where the blended lower confidence bound still
meets the target; the tuner falls back to the start at once if the run's own
measurement disagrees (`QueueingTuner(fallback=...)`).

scikit-learn is imported here only, when a workload has history, between runs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import fmean, median
from typing import Any

import numpy as np

from predictors.config import CONSTANTS, TunerConfig
from predictors.forecast import Forecaster
from predictors.measure import Service, service_spread

__all__ = [
    "GPResiduals",
    "PooledPrior",
    "Proposal",
    "Weight",
    "earned_weight",
    "history_predict",
    "next_run",
    "plan_warm",
    "propose",
]

Grid = list[tuple[int, int]]
# prior(records, grid) -> (point, lower): the queueing prior from those records' services.
Prior = Callable[[Sequence[Any], Grid], tuple[np.ndarray, np.ndarray]]

# The GP's fixed hyperparameters: with a handful of runs a fitted kernel chases noise.
GP_SD = 0.1  # prior sd of a residual (the prior's measured utilization error is ~0.1)
GP_LENGTH = 1.0  # in log2 of workers and of depth: one doubling
SE_FLOOR = 0.01  # a record's standard error is at least this
MET_BATCHES = 16  # a meet counts from a record this long (two blocks), a miss from any
Z = 0.5  # the lower bound's z: the tuner's `confidence`
# Standard errors of its paired leave-one-out gain that the model's gain must exceed to
# earn a weight: a gain within the runs' spread let it act on noise and lose to the
# history alone on a real workload (tuner-history.md, "A tight S3 case").
WEIGHT_Z = 2.0
ERROR_FLOOR = 0.005  # leave-one-out errors are at least this (no division by ~0)


def _measured(records: Sequence[Any]) -> list[Any]:
    """Records that measured something (settled batches, a finite utilization)."""
    return [
        r
        for r in records
        if getattr(r, "settled", True) and math.isfinite(float(getattr(r, "utilization", "nan")))
    ]


class PooledPrior:
    """The queueing prior (`predictors.forecast`) fed with the pooled service times of
    `records`: each record's samples over its own mean give the lateness (bursts and
    tails of every run count), the storage wait is the records' mean less their CPU at
    the contention they ran under."""

    def __init__(
        self,
        cpu_count: int,
        *,
        target: float = 0.9,
        confidence: float = 0.5,
        prior_error: float = 0.06,
        cores_share: float = 0.8,
    ) -> None:
        self.cpu_count = cpu_count
        self.forecaster = Forecaster(
            target=target,
            budget=None,
            max_workers=None,
            config=TunerConfig(confidence=confidence),
            constants=dataclasses.replace(CONSTANTS, cores_share=cores_share),
            prior_error=prior_error,
        )

    def service(self, records: Sequence[Any]) -> Service:
        """One `Service` from every record's samples."""
        cores = max(self.forecaster.cores_share * self.cpu_count, 1.0)
        relative: list[float] = []
        waits, cpus, means, steps, weights = [], [], [], [], []
        for r in records:
            samples = [float(s) for s in (r.service_ms or []) if s > 0]
            if not samples:
                continue
            mean = fmean(samples)
            relative += [s / mean for s in samples]
            cpu = getattr(r, "cpu_ms", None)
            cpu = min(float(cpu), mean) if cpu is not None and math.isfinite(cpu) else 0.0
            active = min(r.workers, r.depth)
            waits.append(max(mean - cpu * max(1.0, active / cores), 0.0))
            cpus.append(cpu)
            means.append(mean)
            steps.append(float(r.step_ms))
            weights.append(len(samples))
        if not means:
            raise ValueError("no record holds service times: nothing to plan from")
        w = np.asarray(weights, dtype=float) / sum(weights)
        spread = service_spread([s * float(np.dot(w, means)) for s in relative])
        return Service(
            service_ms=float(np.dot(w, means)),
            spread=spread,
            cpu_ms=float(np.dot(w, cpus)),
            step_ms=float(median(steps)),
            active=1,
            samples=len(relative),
            wait_ms=float(np.dot(w, waits)),
            cpu_count=self.cpu_count,
            relative=tuple(relative),
        )

    def __call__(self, records: Sequence[Any], grid: Grid) -> tuple[np.ndarray, np.ndarray]:
        est = self.service(records)
        return self.forecaster.predict(grid, est, self.cpu_count)


def _pooled(records: Sequence[Any]) -> dict[tuple[int, int], tuple[float, float]]:
    """Per configuration: the mean utilization over its records and its standard
    error (records weighted by their inverse variance)."""
    out: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for r in records:
        se = max(float(getattr(r, "utilization_se", 0.0) or 0.0), SE_FLOOR)
        out.setdefault((r.workers, r.depth), []).append((float(r.utilization), se))
    pooled = {}
    for key, values in out.items():
        inv = np.array([1.0 / se**2 for _, se in values])
        mean = float(np.dot(inv, [u for u, _ in values]) / inv.sum())
        pooled[key] = (mean, float(1.0 / math.sqrt(inv.sum())))
    return pooled


def history_predict(
    records: Sequence[Any], prior: Prior, grid: Grid, z: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """The history alone: a measured configuration predicts its pooled measurement
    (lower bound: z standard errors below), any other the prior."""
    point, lower = (np.array(a, dtype=float) for a in prior(records, grid))
    for key, (mean, se) in _pooled(records).items():
        if key in grid:
            i = grid.index(key)
            point[i], lower[i] = mean, mean - z * se
    return point, lower


@dataclass
class GPResiduals:
    """A GP over (log2 workers, log2 depth) on measured utilization less the prior's
    prediction (zero mean: the prior is the model's mean). Fixed kernel: `sd` x RBF of
    `length`, each record's own standard error as its noise."""

    sd: float = GP_SD
    length: float = GP_LENGTH
    gp: Any = field(default=None, repr=False)

    def fit(self, records: Sequence[Any], prior_at: dict[tuple[int, int], float]) -> GPResiduals:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel

        x = np.log2(np.array([(r.workers, r.depth) for r in records], dtype=float))
        y = np.array([float(r.utilization) - prior_at[(r.workers, r.depth)] for r in records])
        noise = np.array(
            [max(float(getattr(r, "utilization_se", 0.0) or 0.0), SE_FLOOR) ** 2 for r in records]
        )
        kernel = ConstantKernel(self.sd**2, "fixed") * RBF(self.length, "fixed")
        self.gp = GaussianProcessRegressor(kernel, alpha=noise, optimizer=None)
        self.gp.fit(x, y)
        return self

    def predict(self, grid: Grid) -> tuple[np.ndarray, np.ndarray]:
        """Residual mean and sd at each configuration (0 and `sd` unfitted)."""
        if self.gp is None:
            return np.zeros(len(grid)), np.full(len(grid), self.sd)
        mean, sd = self.gp.predict(np.log2(np.array(grid, dtype=float)), return_std=True)
        return np.asarray(mean, dtype=float), np.asarray(sd, dtype=float)


def model_predict(
    records: Sequence[Any], prior: Prior, grid: Grid, z: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The model: prior + GP residual; lower bound z posterior sds below. Returns
    point, lower, the residual mean and its sd."""
    keys = sorted({(r.workers, r.depth) for r in records} | set(grid))
    at, _ = prior(records, keys)
    prior_at = dict(zip(keys, (float(a) for a in at), strict=True))
    gp = GPResiduals().fit(records, prior_at) if records else GPResiduals()
    mean, sd = gp.predict(grid)
    base = np.array([prior_at[k] for k in grid])
    point = np.clip(base + mean, 0.0, 1.0)
    return point, np.clip(point - z * sd, 0.0, 1.0), mean, sd


@dataclass(frozen=True)
class Weight:
    """The model's earned weight on one workload and why: its leave-one-run-out mean
    absolute error on utilization against the history alone's, over `runs` runs."""

    weight: float
    runs: int
    model_error: float | None
    history_error: float | None
    why: str


def earned_weight(records: Sequence[Any], prior: Prior, min_runs: int = 3) -> Weight:
    """Leave each run out, predict its configurations' measured utilization from the
    others (prior included: fed with the others' services) by the model and by the
    history alone; weight 1 - (model error / history error)^2, the model's error taken
    `WEIGHT_Z` standard errors of the paired difference above its mean, where that
    still errs less than the history, else 0. Fewer than `min_runs` runs: 0 (nothing
    measured yet)."""
    records = _measured(records)
    runs = list(dict.fromkeys(r.run_id for r in records))
    if len(runs) < min_runs:
        return Weight(0.0, len(runs), None, None, f"{len(runs)} run(s): needs {min_runs}")
    model_err, hist_err = [], []
    for run in runs:
        rest = [r for r in records if r.run_id != run]
        held = [r for r in records if r.run_id == run]
        grid = list(dict.fromkeys((r.workers, r.depth) for r in held))
        truth = np.array(
            [fmean(r.utilization for r in held if (r.workers, r.depth) == k) for k in grid]
        )
        h, _ = history_predict(rest, prior, grid)
        m, *_ = model_predict(rest, prior, grid)
        hist_err += list(np.abs(h - truth))
        model_err += list(np.abs(m - truth))
    em, eh = max(fmean(model_err), ERROR_FLOOR), max(fmean(hist_err), ERROR_FLOOR)
    words = (
        f"leave-one-run-out error {em:.3f} (model) against {eh:.3f} (history) on {len(runs)} runs"
    )
    if em >= eh:
        return Weight(0.0, len(runs), em, eh, words + ": not better, weight 0")
    gains = np.subtract(hist_err, model_err)
    spread = float(gains.std(ddof=1) / math.sqrt(gains.size)) if gains.size > 1 else eh
    cautious = em + WEIGHT_Z * spread
    if cautious >= eh:
        why = f": better by {eh - em:.3f}, within {WEIGHT_Z:g}x its spread {spread:.3f}, weight 0"
        return Weight(0.0, len(runs), em, eh, words + why)
    weight = 1.0 - (cautious / eh) ** 2
    return Weight(weight, len(runs), em, eh, words + f": weight {weight:.2f}")


@dataclass(frozen=True)
class Proposal:
    """The next run's configuration and what it rests on: `start` is where the
    history says the target was met with the least memory (or the prior's choice),
    `probe` whether this run tries one grid step cheaper than that (then `fallback`
    is the start, taken back at once if the run measures a miss); `predicted`/`lower`
    the blended prediction of the choice, `prior` the prior's, `model_change` and
    `model_sd` the GP's residual at the choice; `weight` the model's earned weight."""

    workers: int
    depth: int
    start: tuple[int, int]
    probe: bool
    predicted: float
    lower: float
    prior: float
    model_change: float
    model_sd: float
    weight: Weight
    why: str
    contention: float = 1.0  # the prior's service at the choice over at the start

    @property
    def fallback(self) -> tuple[int, int] | None:
        return self.start if self.probe else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "depth": self.depth,
            "start": list(self.start),
            "probe": self.probe,
            "predicted_utilization": self.predicted,
            "lower_bound": self.lower,
            "prior_utilization": self.prior,
            "model_change": self.model_change,
            "model_sd": self.model_sd,
            "weight": self.weight.weight,
            "weight_why": self.weight.why,
            "why": self.why,
        }


def propose(
    records: Sequence[Any],
    prior: Prior,
    grid: Grid,
    target: float,
    *,
    z: float = Z,
    weight: Weight | None = None,
    explore: bool = True,
    start: tuple[int, int] | None = None,
) -> Proposal:
    """The next run's configuration (see the module doc). `weight`: the model's, else
    earned here (`earned_weight`); `explore=False`: no probe (the start alone);
    `start`: where the run starts unless it probes (default: chosen here)."""
    records = _measured(records)
    if not records:
        raise ValueError("no measured run in the history: a cold run plans alone")
    grid = list(grid)
    if start is not None:
        start = (int(start[0]), int(start[1]))
        if start not in grid:
            grid.append(start)
    weight = weight if weight is not None else earned_weight(records, prior)
    hp, hl = history_predict(records, prior, grid, z)
    prior_point, _ = prior(records, grid)
    mean, sd = np.zeros(len(grid)), np.zeros(len(grid))
    point, lower = hp, hl
    if weight.weight > 0:
        mp, ml, mean, sd = model_predict(records, prior, grid, z)
        w = weight.weight
        point, lower = w * mp + (1 - w) * hp, w * ml + (1 - w) * hl
    pooled = _pooled(records)
    long = {(r.workers, r.depth) for r in records if getattr(r, "batches", 0) >= MET_BATCHES}
    met = [k for k in grid if k in pooled and k in long and pooled[k][0] >= target]
    if start is not None:
        why = "the history's start"
        met = [start] if start in met else []
    elif met:
        start = min(met, key=lambda k: (k[1], -pooled[k][0], k[0]))
        why = f"the least memory the history measured meeting {target:.2f}"
    else:
        order = sorted(range(len(grid)), key=lambda i: (grid[i][1], grid[i][0]))
        meets = [i for i in order if lower[i] >= target]
        i = meets[0] if meets else max(order, key=lambda i: (round(point[i], 3), -grid[i][1]))
        start = grid[i]
        why = (
            f"nothing measured met {target:.2f}: the least memory predicted to"
            if meets
            else f"nothing measured or predicted meets {target:.2f}: the best predicted"
        )
    choice, probe = start, False
    cheaper = [d for _, d in grid if d < start[1]]
    if explore and met and cheaper:
        step = max(cheaper)
        candidates = [
            i
            for i, k in enumerate(grid)
            if k[1] == step and lower[i] >= target and not (k in pooled and pooled[k][0] < target)
        ]
        if candidates:
            # The start's workers if they meet there (a change of one knob), else the best.
            same = [i for i in candidates if grid[i][0] == start[0]]
            i = (
                same[0]
                if same
                else max(candidates, key=lambda i: (round(lower[i], 3), -grid[i][0]))
            )
            choice, probe = grid[i], True
            why += f"; probing depth {step} (lower bound {lower[i]:.2f} meets {target:.2f})"
    i = grid.index(choice)
    return Proposal(
        workers=choice[0],
        depth=choice[1],
        start=start,
        probe=probe,
        predicted=float(point[i]),
        lower=float(lower[i]),
        prior=float(prior_point[i]),
        model_change=float(mean[i]),
        model_sd=float(sd[i]),
        weight=weight,
        why=why,
    )


def plan_warm(
    warm: Any,
    target: float,
    *,
    budget: float | None = None,
    max_workers: int | None = None,
    cpu_count: int | None = None,
    confidence: float = 0.5,
    cores_share: float = 0.8,
    explore: bool = True,
) -> tuple[Any, tuple[int, int] | None, Proposal]:
    """A `predictors.history.WarmStart` with the proposal's start (the model's choice,
    perhaps a probe), the configuration to fall back to (None: no probe) and the
    proposal. It probes only with an earned weight > 0. Fitted once, per run."""
    import os

    records = list(warm.records)
    cpu_count = cpu_count or os.cpu_count() or 1
    per_batch = [r.memory_bytes / r.depth for r in records if r.memory_bytes > 0 and r.depth > 0]
    forecaster = Forecaster(target=target, budget=budget, max_workers=max_workers)
    grid = forecaster.grid(median(per_batch) if per_batch else 1.0, cpu_count)
    if tuple(warm.start) not in grid:
        grid.append(tuple(warm.start))
    prior = PooledPrior(cpu_count, target=target, confidence=confidence, cores_share=cores_share)
    # The model chooses what to try only where it earned weight: on the simulator,
    # probing from the history alone met less often for no memory (tuner-history.md).
    weight = earned_weight(records, prior)
    proposal = propose(
        records,
        prior,
        grid,
        target,
        z=confidence,
        weight=weight,
        explore=explore and weight.weight > 0,
        start=warm.start,
    )
    choice = (proposal.workers, proposal.depth)
    if not proposal.probe:
        return warm, None, proposal
    ratio = prior.forecaster.service_ratio(prior.service(records), min(warm.start), min(choice))
    proposal = dataclasses.replace(proposal, contention=float(ratio))
    # The history's service at its start is no reference for another configuration:
    # this run's own batches set the detector's.
    moved = dataclasses.replace(warm, start=choice, reference_ms=())
    return moved, proposal.fallback, proposal


def next_run(
    records: Sequence[Any],
    target: float,
    *,
    budget: float | None = None,
    max_workers: int | None = None,
    cpu_count: int | None = None,
    weight: Weight | None = None,
) -> dict[str, Any]:
    """What the next run of a workload whose history holds `records` (this run's
    included) will try, and why: its start, or the probe one step cheaper with that
    start to fall back to. `weight`: the model's as this run earned it (None: the
    history alone; nothing is fitted here, so a report never imports scikit-learn)."""
    import os

    from predictors.history import WarmStart

    warm = WarmStart.from_records(records, target, memory_budget=budget, max_workers=max_workers)
    if warm is None:
        return {
            "workers": None,
            "depth": None,
            "probe": False,
            "why": "nothing measured long enough yet: the next run starts cold",
        }
    if not warm.met:
        return {
            "workers": warm.start[0],
            "depth": warm.start[1],
            "probe": False,
            "why": f"{warm.describe()}; nothing met {target:.2f}, so no probe",
        }
    cpu_count = cpu_count or os.cpu_count() or 1
    per_batch = [r.memory_bytes / r.depth for r in records if r.memory_bytes > 0 and r.depth > 0]
    grid = Forecaster(target=target, budget=budget, max_workers=max_workers).grid(
        median(per_batch) if per_batch else 1.0, cpu_count
    )
    prior = PooledPrior(cpu_count, target=target)
    if not _measured(warm.records):  # no settled configuration: nothing to probe from
        return {
            "workers": warm.start[0],
            "depth": warm.start[1],
            "probe": False,
            "why": f"start at {warm.start[0]} worker(s), depth {warm.start[1]}: {warm.describe()}",
        }
    weight = weight or Weight(0.0, 0, None, None, "no model fitted here")
    # As `plan_warm`: only a model with earned weight probes.
    p = propose(
        list(warm.records),
        prior,
        grid,
        target,
        weight=weight,
        explore=weight.weight > 0,
        start=warm.start,
    )
    start = f"{p.start[0]} worker(s), depth {p.start[1]}"
    if p.probe:
        why = (
            f"probe {p.workers} worker(s), depth {p.depth}, one step cheaper than {start} "
            f"(the least memory measured meeting {target:.2f}), falling back there on a "
            f"measured miss: {p.why}"
        )
    else:
        why = f"start at {start}: {p.why}"
    return {"workers": p.workers, "depth": p.depth, "probe": p.probe, "why": why}
