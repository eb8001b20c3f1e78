"""The tuner interface and the learned online tuner.

Every tuner (learned or baseline) has one method, `decide(state) -> Decision`: it
reads numbers measured by the loader's telemetry and *returns* a configuration with a
reason; the loader applies it (`engine.set_workers`, `engine.set_depth`). Tuners never
change which samples come in which order, only how many workers build batches and how
many batches may be in flight or ready.

The learned tuner:

1. starts safe (2 workers, depth 2 by default) and measures for `warmup_batches`;
2. turns the measured per-batch service times into the model's features, predicts
   utilization for every candidate (workers, depth) whose memory bound
   `depth * batch_memory_bytes` fits the budget, and takes the one with the least memory
   whose predicted utilization meets `target + margin` (the margin is the model's
   measured error on unseen workloads);
3. keeps comparing: a service-time change beyond `shift_ratio` (a storage slowdown or
   its recovery) re-decides at once; observed utilization that departs from the
   prediction rescales the service time the model is given (effective vs measured)
   and re-decides;
4. when nothing within the budget reaches the target, says so, names the bottleneck
   stage and takes the configuration with the highest predicted utilization.

Example:
    >>> tuner = LearnedTuner(QueueingModel(), target_utilization=0.9, memory_budget_bytes=2**31)
    >>> decision = tuner.decide(state)            # state: a TunerState from telemetry
    >>> engine.set_workers(decision.workers); engine.set_depth(decision.depth)
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from predictors.errors import TunerConfigError

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
    "state_features",
]

DEPTH_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class TunerState:
    """Telemetry for one batch (or a short window), in milliseconds and bytes.

    Service times are per batch, as one worker spends them; `stall_ms` is how long the
    consumer waited for this batch; `memory_bytes` the bytes held in flight or ready.
    `storage_latency_ms` / `storage_bandwidth_mbps` come from the probe, if one ran;
    they split the measured read time between per-request latency and transfer.
    """

    batch_index: int
    workers: int
    depth: int
    batch_size: int
    step_ms: float
    stall_ms: float
    read_ms: float
    decode_ms: float
    bytes_per_batch: float
    memory_bytes: float
    cpu_count: int
    transform_ms: float = 0.0
    batch_memory_bytes: float | None = None
    rows_per_read: int = 1
    storage_latency_ms: float | None = None
    storage_bandwidth_mbps: float | None = None

    @property
    def utilization(self) -> float:
        """step / (step + stall): the share of time the consumer computes."""
        total = self.step_ms + self.stall_ms
        return 1.0 if total <= 0 else self.step_ms / total

    @property
    def service_ms(self) -> float:
        return self.read_ms + self.decode_ms + self.transform_ms

    @property
    def one_batch_bytes(self) -> float:
        """Memory of one batch held by the loader (the measured value, else raw bytes)."""
        return float(self.batch_memory_bytes or self.bytes_per_batch)


@dataclass(frozen=True)
class Decision:
    """A configuration to apply, why, and what the tuner expects from it."""

    workers: int
    depth: int
    reason: str
    predicted: dict[str, float] = field(default_factory=dict)
    feasible: bool = True
    bottleneck: str | None = None


class Tuner(Protocol):
    """What every tuner provides; the loader calls `decide` after each batch."""

    def decide(self, state: TunerState) -> Decision: ...


class PerformanceModel(Protocol):
    """A predictor of outcomes for candidate rows (feature + config columns).

    `predict` returns columns throughput_sps, stall_fraction, utilization, memory_bytes;
    `utilization_error` is its typical absolute error on workloads it never saw.
    """

    utilization_error: float

    def predict(self, frame: pd.DataFrame) -> pd.DataFrame: ...


def check_target(target: float) -> float:
    """Return `target` if 0 < target < 1, else raise TunerConfigError with the fix."""
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise TunerConfigError(
            f"`target_utilization` must be a number strictly between 0 and 1. Found: {target!r}. "
            "Fix: pass the share of time the GPU should compute, e.g. 0.9."
        )
    return float(target)


def check_budget(budget: float | None, one_batch_bytes: float) -> None:
    """Raise TunerConfigError if the memory budget cannot hold a single batch."""
    if budget is not None and budget < one_batch_bytes:
        raise TunerConfigError(
            f"`memory_budget` must hold at least one batch ({one_batch_bytes / 2**20:.1f} MiB). "
            f"Found: {budget / 2**20:.1f} MiB. Fix: raise the budget or lower the batch size."
        )


def state_features(state: TunerState) -> dict[str, Any]:
    """The model's feature and config columns from one batch of telemetry.

    Measured times depend on the configuration they were measured under; the features
    must not. Two sharing assumptions undo that, with `active = min(workers, depth)`:
    cores are shared, so decode time is divided by max(1, active / cpu_count); storage
    bandwidth is shared, so the measured read time is matched to
    `latency * requests + active * bytes / bandwidth` by scaling the probe's latency
    and bandwidth together (a storage slowdown shows in both). Without a probe the
    read time is all latency (the usual case for remote storage).
    """
    active = max(1, min(state.workers, state.depth))
    requests = math.ceil(state.batch_size / state.rows_per_read)
    decode = (state.decode_ms + state.transform_ms) / max(1.0, active / state.cpu_count)
    latency, bandwidth = state.storage_latency_ms, state.storage_bandwidth_mbps
    if latency is not None and bandwidth:
        probe_read = latency * requests + active * state.bytes_per_batch / (bandwidth * 1e3)
        scale = state.read_ms / probe_read if probe_read > 0 else 1.0
        latency, bandwidth = latency * scale, bandwidth / max(scale, 1e-9)
    else:
        latency, bandwidth = state.read_ms / requests, 1e6
    return {
        "bytes_per_sample": state.bytes_per_batch / state.batch_size,
        "decode_ms_per_sample": decode / state.batch_size,
        "storage_latency_ms": latency,
        "storage_bandwidth_mbps": bandwidth,
        "batch_size": state.batch_size,
        "step_ms": state.step_ms,
        "rows_per_read": state.rows_per_read,
        "cpu_count": state.cpu_count,
        "shuffle": "none",
        "cache": False,
    }


def _nominal_service_ms(f: dict[str, Any]) -> float:
    """One worker's time per batch, alone on the machine (from `state_features`)."""
    requests = math.ceil(f["batch_size"] / f["rows_per_read"])
    transfer = f["bytes_per_sample"] * f["batch_size"] / (f["storage_bandwidth_mbps"] * 1e3)
    return (
        f["storage_latency_ms"] * requests + transfer + f["decode_ms_per_sample"] * f["batch_size"]
    )


def _bottleneck(read_ms: float, decode_ms: float, transform_ms: float) -> str:
    stages = {"storage": read_ms, "decode": decode_ms, "transform": transform_ms}
    return max(stages, key=stages.__getitem__)


class LearnedTuner:
    """Online controller: the least memory whose predicted utilization meets the target."""

    def __init__(
        self,
        model: PerformanceModel | None = None,
        *,
        target_utilization: float = 0.9,
        memory_budget_bytes: float | None = None,
        max_workers: int | None = None,
        max_depth: int = 64,
        start: tuple[int, int] = (2, 2),
        warmup_batches: int = 6,
        window: int = 16,
        shift_window: int = 8,
        settle_batches: int = 4,
        shift_ratio: float = 1.6,
        divergence: float = 0.04,
        margin: float | None = None,
    ) -> None:
        if model is None:
            from predictors.model import load_default

            model = load_default()
        self.model = model
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
        error = model.utilization_error if margin is None else margin
        self.margin = min(max(error, 0.0), (1.0 - self.target) / 2)  # keep target+margin < 1
        self._recent: deque[TunerState] = deque(maxlen=window)
        self._current: Decision | None = None
        self._planned_at = 0
        self._planned_service = 0.0
        self._rebased = False
        self._divergences = 0  # large prediction errors in a row
        self._slowness = 1.0  # effective / measured service time, learned from divergence
        self.history: list[tuple[int, Decision]] = []

    # --- the protocol -----------------------------------------------------------
    def decide(self, state: TunerState) -> Decision:
        check_budget(self.budget, state.one_batch_bytes)
        self._recent.append(state)
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
            return self._plan(state, "first decision after measuring")
        shift = self._service_shift()
        if shift is not None:
            before, now = shift
            self._slowness = 1.0
            return self._plan(
                state,
                f"regime shift: service time per batch {before:.1f} ms -> {now:.1f} ms",
                last=4,
            )
        since = state.batch_index - self._planned_at
        if since >= self.settle_batches + 5 and self._diverged():
            return self._plan(state, self._divergence_note)
        return self._hold()

    # --- internals ----------------------------------------------------------------
    def _safe_start(self, state: TunerState) -> tuple[int, int]:
        w, d = self.start
        w = min(w, state.cpu_count)
        if self.budget is not None:
            d = max(1, min(d, int(self.budget // state.one_batch_bytes)))
        return w, d

    def _smoothed(self, last: int | None = None) -> dict[str, float]:
        """Medians over the recent batches of the stage times (for reasons and bottlenecks)."""
        states = list(self._recent)[-last:] if last else list(self._recent)
        return {
            name: median(getattr(s, name) for s in states)
            for name in ("read_ms", "decode_ms", "transform_ms", "step_ms", "stall_ms")
        }

    def _features(self, last: int | None = None) -> dict[str, Any]:
        """Means over the recent batches of the configuration-free features. Means, not
        medians: storage cost is bursty (one request can serve several batches through
        read-ahead), and what the workers must keep up with is its average."""
        states = list(self._recent)[-last:] if last else list(self._recent)
        return self._mean_features(states)

    def _service_shift(self) -> tuple[float, float] | None:
        """A lasting change of the service time under an unchanged configuration.

        The baseline is re-measured after each decision from `shift_window` batches run
        under the new configuration: more workers slow each read down (they share the
        link and the cores), and that self-inflicted change must not read as a storage
        slowdown, or the tuner would chase it with still more workers."""
        current = self._current
        if current is None:
            return None
        same = [
            s
            for s in self._recent
            if s.batch_index >= self._planned_at + self.settle_batches
            and (s.workers, s.depth) == (current.workers, current.depth)
        ]
        if len(same) < self.shift_window:
            return None
        now = _nominal_service_ms(self._mean_features(same[-self.shift_window :]))
        if not self._rebased:
            self._planned_service, self._rebased = now, True
            return None
        ratio = now / max(self._planned_service, 1e-9)
        if ratio > self.shift_ratio or ratio < 1 / self.shift_ratio:
            return self._planned_service, now
        return None

    @staticmethod
    def _mean_features(states: list[TunerState]) -> dict[str, Any]:
        rows = [state_features(s) for s in states]
        return {
            k: sum(r[k] for r in rows) / len(rows) if k not in ("shuffle", "cache") else rows[-1][k]
            for k in rows[-1]
        }

    def _diverged(self) -> bool:
        current = self._current
        if current is None:
            return False
        settled = [
            s for s in self._recent if s.batch_index >= self._planned_at + self.settle_batches
        ]
        settled = [s for s in settled if (s.workers, s.depth) == (current.workers, current.depth)]
        if len(settled) < 5:
            return False
        step = sum(s.step_ms for s in settled)
        observed = step / max(step + sum(s.stall_ms for s in settled), 1e-9)
        predicted = current.predicted.get("utilization", observed)
        short = observed < predicted - self.divergence and observed < self.target
        # Above the prediction only counts when not saturated (utilization ~1 hides the rate).
        long = observed > predicted + self.divergence and observed < 0.99
        if not (short or long):
            self._divergences = 0
            return False
        from predictors.baselines import QueueingModel  # baselines import this module

        self._divergences += 1
        if self._divergences >= 2 and not isinstance(self.model, QueueingModel):
            # Twice off by more than the margin: this workload lies outside what the model
            # learned. First principles extrapolate where the learned corrections do not.
            self.model, self._slowness = QueueingModel(), 1.0
            self._divergence_note = (
                f"observed utilization {observed:.2f} vs predicted {predicted:.2f} twice: "
                "outside the model's training range, switching to the queueing model"
            )
            return True
        # Bounded: one noisy window must not swing the model by more than 2x.
        step_change = min(max(predicted / max(observed, 1e-3), 0.5), 2.0)
        self._slowness *= step_change
        self._divergence_note = (
            f"observed utilization {observed:.2f} vs predicted {predicted:.2f}: "
            f"treating the service as {step_change:.2f}x as slow as measured"
        )
        return True

    def _candidates(self, state: TunerState, features: dict[str, Any]) -> pd.DataFrame:
        import pandas as pd

        max_workers = self.max_workers or max(2 * state.cpu_count, 4)
        one = state.one_batch_bytes
        rows = []
        for d in (x for x in DEPTH_GRID if x <= self.max_depth):
            if self.budget is not None and d * one > self.budget:
                continue
            for w in range(1, max_workers + 1):
                rows.append((w, d))
        frame = pd.DataFrame(rows, columns=["workers", "depth"])
        # The correction acts on the service time, not on the prediction: a prediction
        # capped at utilization 1 would otherwise hide how far off the model is.
        slow = self._slowness
        features = {
            **features,
            "storage_latency_ms": features["storage_latency_ms"] * slow,
            "storage_bandwidth_mbps": features["storage_bandwidth_mbps"] / slow,
            "decode_ms_per_sample": features["decode_ms_per_sample"] * slow,
        }
        for name, value in features.items():
            frame[name] = value
        return frame

    def _plan(self, state: TunerState, why: str, last: int | None = None) -> Decision:
        m = self._smoothed(last)
        features = self._features(last)
        frame = self._candidates(state, features)
        pred = self.model.predict(frame)
        util = pred["utilization"].to_numpy()
        memory = frame["depth"].to_numpy() * state.one_batch_bytes
        required = self.target + self.margin
        order = np.lexsort((frame["depth"], frame["workers"], memory))  # least memory first
        meets = [i for i in order if util[i] >= required]
        feasible, bottleneck = True, None
        if meets:
            i = meets[0]
            note = (
                f"least memory predicted to reach {required:.2f} "
                f"(target {self.target:.2f} + margin {self.margin:.2f})"
            )
        else:
            # Highest utilization; among near-equals (within 2 %) the least memory.
            best = util.max()
            i = next(j for j in order if util[j] >= best * 0.98)
            feasible = util[i] >= self.target
            if feasible:
                note = f"reaches the target {self.target:.2f} but not the margin {self.margin:.2f}"
            else:
                bottleneck = _bottleneck(m["read_ms"], m["decode_ms"], m["transform_ms"])
                budget = "" if self.budget is None else f" within {self.budget / 2**20:.0f} MiB"
                note = (
                    f"target {self.target:.2f} is out of reach{budget}: best predicted "
                    f"{util[i]:.2f}. Bottleneck: {bottleneck} (per batch: storage "
                    f"{m['read_ms']:.1f} ms, decode {m['decode_ms']:.1f} ms, transform "
                    f"{m['transform_ms']:.1f} ms, step {m['step_ms']:.1f} ms); taking the best"
                )
        w, d = int(frame["workers"].iloc[i]), int(frame["depth"].iloc[i])
        predicted = {
            "utilization": float(util[i]),
            "throughput_sps": float(pred["throughput_sps"].iloc[i]),
            "memory_bytes": float(memory[i]),
            "model_memory_bytes": float(pred["memory_bytes"].iloc[i]),
            "margin": self.margin,
            "service_scale": self._slowness,
        }
        decision = Decision(
            w, d, f"{why}; {note}: {w} workers, depth {d}", predicted, feasible, bottleneck
        )
        self._current = decision
        self._planned_at = state.batch_index
        self._planned_service = _nominal_service_ms(features)
        self._rebased = False  # re-measured under the new configuration (_service_shift)
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
        import pandas as pd

        if not self._recent:
            raise TunerConfigError("No batch measured yet: call decide() first.")
        state = self._recent[-1]
        frame = self._candidates(state, self._features())
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
