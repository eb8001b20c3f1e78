"""Baselines the learned model and tuner are measured against, in the same harness.

Predictors (same `fit` / `predict` as `benchmarks.tuner_lab.model.Predictor`):

- `QueueingModel`: first principles, no learning. A worker spends
  S = latency * ceil(batch_size / rows_per_read) + batch_bytes / bandwidth
  + batch_size * decode_ms per batch. At most a = min(workers, depth) workers are busy
  (a worker needs a free slot of the depth budget), so the loader delivers at most
  a / S batches per second, further capped by the cores (cpu_count / decode time),
  by the storage bandwidth (bandwidth / batch_bytes) and by the consumer (1 / step):

      rate = min(a / S, cpu_count / decode, bandwidth / batch_bytes, 1 / step)
      utilization = rate * step,  stall_fraction = 1 - utilization
      memory = depth * batch_bytes * k   (k: median ratio fitted on training rows, else 1)

  It ignores variability: with jittery service times a shallow buffer runs dry even
  when the mean rate suffices, which is what depth buys and what it cannot see.
- `ConstantModel`: the training means. Anything worth shipping must beat both.

Tuners (same `decide(state) -> Decision` as `predictors.tuner.QueueingTuner`):

- `StaticDefaultTuner`: PyTorch's default, 2 batches per worker, never changes.
- `HillClimbTuner`: tf.data-style autotuning: from 1 worker, try one more worker (or one
  more batch of depth), keep a step that measurably lowers the stall, revert one that
  does not, stop when neither helps; never exceeds the RAM budget, never shrinks.
- `OracleTuner`: the best static configuration in a measured sweep table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictors.errors import TunerConfigError
from predictors.observations import queueing_batches_per_s, validate_observations
from predictors.state import Decision, TunerState, check_budget, check_target

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "ConstantModel",
    "HillClimbTuner",
    "OracleTuner",
    "QueueingModel",
    "StaticDefaultTuner",
]


def _frame(columns: dict[str, np.ndarray], index: object) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(columns, index=index)


class QueueingModel:
    """The first-principles model above; `fit` only sets the memory factor."""

    name = "queueing"
    utilization_error = 0.1  # assumed until measured; the learned tuner's margin

    def __init__(self) -> None:
        self.memory_factor = 1.0

    def fit(self, frame: pd.DataFrame) -> QueueingModel:
        validate_observations(frame)
        bound = frame["depth"] * frame["batch_size"] * frame["bytes_per_sample"]
        self.memory_factor = float(np.median(frame["memory_bytes"] / bound))
        return self

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        validate_observations(frame, require_outcomes=False)
        rate = queueing_batches_per_s(frame)
        util = np.minimum(rate * frame["step_ms"].to_numpy(float) / 1e3, 1.0)
        batch_bytes = (frame["batch_size"] * frame["bytes_per_sample"]).to_numpy(float)
        return _frame(
            {
                "throughput_sps": rate * frame["batch_size"].to_numpy(float),
                "stall_fraction": 1.0 - util,
                "utilization": util,
                "memory_bytes": frame["depth"].to_numpy(float) * batch_bytes * self.memory_factor,
            },
            frame.index,
        )


class ConstantModel:
    """Predicts the training means whatever the input (the floor every model must beat)."""

    name = "constant"
    utilization_error = 0.5

    def fit(self, frame: pd.DataFrame) -> ConstantModel:
        validate_observations(frame)
        self.means = {
            c: float(frame[c].mean()) for c in ("throughput_sps", "stall_fraction", "memory_bytes")
        }
        return self

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame:
        n = len(frame)
        stall = np.full(n, self.means["stall_fraction"])
        return _frame(
            {
                "throughput_sps": np.full(n, self.means["throughput_sps"]),
                "stall_fraction": stall,
                "utilization": 1.0 - stall,
                "memory_bytes": np.full(n, self.means["memory_bytes"]),
            },
            frame.index,
        )


class StaticDefaultTuner:
    """PyTorch's static default: `workers` workers, 2 batches prefetched per worker."""

    def __init__(self, workers: int | None = None, prefetch_factor: int = 2) -> None:
        self.workers = workers
        self.prefetch_factor = prefetch_factor

    def decide(self, state: TunerState) -> Decision:
        w = self.workers or state.cpu_count
        d = self.prefetch_factor * w
        return Decision(w, d, f"static default: {w} workers x {self.prefetch_factor} batches each")


class HillClimbTuner:
    """tf.data-style hill climbing on the measured stall, under a RAM budget."""

    def __init__(
        self,
        *,
        memory_budget_bytes: float | None = None,
        max_workers: int | None = None,
        max_depth: int = 64,
        period: int = 5,
        min_gain: float = 0.01,
    ) -> None:
        self.budget = memory_budget_bytes
        self.max_workers = max_workers
        self.max_depth = max_depth
        self.period = period
        self.min_gain = min_gain
        self.config = (1, 2)
        self._trial: tuple[int, int] | None = None  # the config being tried
        self._base_util = 0.0
        self._moves_failed: set[str] = set()
        self._window: list[float] = []
        self._converged_at: float | None = None

    def _fits(self, depth: int, state: TunerState) -> bool:
        return depth <= self.max_depth and (
            self.budget is None or depth * state.one_batch_bytes <= self.budget
        )

    def _next_move(self, state: TunerState) -> tuple[str, tuple[int, int]] | None:
        w, d = self.config
        max_workers = self.max_workers or 2 * state.cpu_count
        moves = {"workers": (w + 1, max(d, w + 1)), "depth": (w, d + 1)}
        for name, (nw, nd) in moves.items():
            if name not in self._moves_failed and nw <= max_workers and self._fits(nd, state):
                return name, (nw, nd)
        return None

    def decide(self, state: TunerState) -> Decision:
        check_budget(self.budget, state.one_batch_bytes)
        self._window.append(state.utilization)
        if len(self._window) < self.period:
            return self._decision("measuring")
        util = float(np.mean(self._window[1:]))  # the first batch after a change is transient
        self._window = []
        if self._trial is not None:
            if util >= self._base_util + self.min_gain:
                self.config, self._base_util = self._trial, util
                self._moves_failed.clear()
                note = f"kept: utilization rose to {util:.2f}"
            else:
                self._moves_failed.add(self._last_move)
                note = f"reverted: utilization {util:.2f} did not beat {self._base_util:.2f}"
            self._trial = None
        else:
            if self._converged_at is not None and util < self._converged_at - 0.05:
                self._moves_failed.clear()  # the workload changed: climb again
                self._converged_at = None
            self._base_util = util
            note = f"measured utilization {util:.2f}"
        if self._base_util >= 0.99:
            self._converged_at = self._base_util
            return self._decision(f"{note}; no stall left")
        move = self._next_move(state)
        if move is None:
            self._converged_at = self._base_util
            return self._decision(f"{note}; converged (no step helps or fits the budget)")
        self._last_move, self._trial = move
        w, d = self._trial
        return Decision(
            w,
            d,
            f"{note}; trying one more {move[0][:-1] if move[0] == 'workers' else 'batch of depth'}",
        )

    def _decision(self, note: str) -> Decision:
        w, d = self._trial or self.config
        return Decision(w, d, f"hill-climb: {note} ({w} workers, depth {d})")


class OracleTuner:
    """The best static configuration in a measured sweep: the least memory that meets
    the target within the budget, else the highest utilization. It sees the answers,
    so it bounds what a static choice can do; it is not a deployable tuner."""

    def __init__(
        self,
        sweep: pd.DataFrame,
        *,
        target_utilization: float = 0.9,
        memory_budget_bytes: float | None = None,
    ) -> None:
        target = check_target(target_utilization)
        table = sweep.copy()
        if "utilization" not in table:
            table["utilization"] = 1.0 - table["stall_fraction"]
        table = table.groupby(["workers", "depth"], as_index=False)[
            ["utilization", "memory_bytes"]
        ].median()
        if memory_budget_bytes is not None:
            table = table[table["memory_bytes"] <= memory_budget_bytes]
        if table.empty:
            raise TunerConfigError(
                "No configuration in the sweep fits `memory_budget_bytes` "
                f"({memory_budget_bytes!r}). Fix: raise the budget or sweep smaller depths."
            )
        ok = table[table["utilization"] >= target]
        if len(ok):
            row = ok.sort_values(["memory_bytes", "workers", "depth"]).iloc[0]
            why = f"oracle: least memory that measured >= {target:.2f}"
        else:
            row = table.sort_values(["utilization", "memory_bytes"], ascending=[False, True]).iloc[
                0
            ]
            why = f"oracle: nothing measured >= {target:.2f}; highest utilization"
        self.choice = Decision(
            int(row["workers"]),
            int(row["depth"]),
            f"{why} ({int(row['workers'])} workers, depth {int(row['depth'])}, "
            f"utilization {row['utilization']:.2f})",
            {"utilization": float(row["utilization"]), "memory_bytes": float(row["memory_bytes"])},
            feasible=bool(len(ok)),
        )

    def decide(self, state: TunerState) -> Decision:
        return self.choice
