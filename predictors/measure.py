"""What the batches say: per-configuration utilization, the service estimate, and a
change detector. No decisions here (those are in `predictors.tuner`).

Rules of measurement that proved right on real runs (benchmarks/results/tuner-history.md):
the pipeline's first batch and each epoch's first batch waited for an empty pipeline
whatever the configuration, so they are no sample; settling counts from when a change
takes effect, not from when it was decided; and windows are sized in service times,
not batches, since at 2 ms steps eight batches hold less than one read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import fmean, median
from typing import Any

import numpy as np

from predictors.config import CONSTANTS, TunerConfig, TunerConstants
from predictors.state import TunerState

__all__ = [
    "ChangeDetector",
    "Measured",
    "Service",
    "against_measured",
    "fit_cores_share",
    "service_spread",
    "summarize",
]


@dataclass
class Measured:
    """One configuration's recent settled batches in the current regime: their
    time-weighted utilization over the last `keep` blocks of `block` batches, and its
    standard error by batch means (stalls come in runs, so per-batch values are not
    independent; blocks nearly are). Old blocks drop out: a long record of a regime
    the detector missed must not outvote what the configuration does now."""

    block: int = CONSTANTS.record_block
    keep: int = CONSTANTS.record_keep
    unknown: float = CONSTANTS.record_unknown_error  # the standard error before two blocks
    batches: int = 0
    blocks: list[tuple[float, float]] = field(default_factory=list)
    _open: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def add(self, state: TunerState) -> None:
        self.batches += 1
        self._open[0] += state.step_ms
        self._open[1] += state.stall_ms
        if self.batches % self.block == 0:
            self.blocks.append((self._open[0], self._open[1]))
            if len(self.blocks) > self.keep:
                del self.blocks[: -self.keep]
            self._open = [0.0, 0.0]

    @property
    def utilization(self) -> float:
        step = sum(b[0] for b in self.blocks) + self._open[0]
        return step / max(step + sum(b[1] for b in self.blocks) + self._open[1], 1e-9)

    @property
    def standard_error(self) -> float:
        """Of the utilization; `unknown` (little known) before two blocks."""
        n = len(self.blocks)
        if n < 2:
            return self.unknown
        utils = [step / max(step + stall, 1e-9) for step, stall in self.blocks]
        mean = fmean(utils)
        return math.sqrt(sum((u - mean) ** 2 for u in utils) / (n - 1) / n)


def service_spread(services: list[float]) -> float:
    """How late batches come, as a fraction of the mean service time: the upper
    semi-deviation (root mean square of the excesses over the median). Early batches
    never stall the consumer, so they do not count (a read-ahead hit at 3 ms among 12
    ms reads would otherwise double the depth asked for); late ones count by their
    size, so a burst or a heavy tail asks for the depth that rides it out.

    >>> round(service_spread([11.0, 2.5, 12.0, 11.5, 29.0, 12.5, 11.0, 12.0]), 2)
    0.68
    """
    if len(services) < 4 or (mean := fmean(services)) <= 0:
        return 0.0
    middle = median(services)
    late = [(s - middle) ** 2 for s in services if s > middle]
    return min(math.sqrt(sum(late) / len(services) * 2) / mean if late else 0.0, 1.0)


@dataclass(frozen=True)
class Service:
    """One worker's time per batch as measured at `active` busy workers, its lateness
    spread, the workers' CPU per batch (None: not measured) and the consumer's step."""

    service_ms: float
    spread: float
    cpu_ms: float | None
    step_ms: float
    active: int
    samples: int
    wait_ms: float = 0.0  # the service less its CPU at the cores' contention: storage
    cpu_count: int = 1
    relative: tuple[float, ...] = ()  # each batch's service over the mean: its spread
    read_ms: float = 0.0
    decode_ms: float = 0.0
    transform_ms: float = 0.0
    read_cpu_ms: float | None = None
    cores_share: float | None = None  # of the cores the CPU is shared by (None: the prior's)

    def stages(self) -> dict[str, float]:
        """Per-batch stage times, as `state.name_bottleneck` and `stage_text` read them."""
        out = {
            "read_ms": self.read_ms,
            "decode_ms": self.decode_ms,
            "transform_ms": self.transform_ms,
            "step_ms": self.step_ms,
        }
        if self.cpu_ms is not None:
            out.update(cpu_ms=self.cpu_ms, read_cpu_ms=self.read_cpu_ms or 0.0)
        return out


def fit_cores_share(
    states: list[TunerState],
    prior: float,
    prior_sd: float,
    noise_floor: float,
    block: int,
    min_batches: int,
    shares: np.ndarray,
) -> float:
    """The share of the cores the workers' CPU is spread over, learned from this run:
    the CPU stages' time over their CPU is the queue for a core, max(1, a / (share x
    cores)) at `a` busy workers. Each busy-worker count measured on `min_batches` or
    more gives its median (known to its relative spread, at least `noise_floor`, over
    the root of its blocks of `block` batches: batches come in runs); the result is
    the most probable share on the grid `shares` under a normal prior (`prior`,
    `prior_sd`). A storage burst or tail slows the read, not this ratio, so the
    tuner's own history (more workers while the service is slow) does not bias it.
    Without the CPU measured, or at one busy-worker count, the prior stands.

    >>> fit_cores_share([], 0.8, 0.15, 0.05, 8, 8, np.linspace(0.4, 1.0, 13))
    0.8
    """
    levels: dict[int, list[float]] = {}
    for s in states:
        if s.cpu_ms is None:
            return prior
        cpu = s.cpu_ms - (s.read_cpu_ms or 0.0)
        if cpu > 0:
            active = min(s.workers, s.depth)
            levels.setdefault(active, []).append((s.decode_ms + s.transform_ms) / cpu)
    levels = {a: v for a, v in levels.items() if len(v) >= min_batches}
    if prior_sd <= 0 or len(levels) < 2:
        return prior
    active = np.array(sorted(levels), dtype=float)
    factor = np.array([max(median(levels[a]), 1e-9) for a in sorted(levels)])
    spread = np.array(
        [
            1.4826 * median(abs(math.log(max(x, 1e-9) / m)) for x in levels[a])
            for a, m in zip(sorted(levels), factor, strict=True)
        ]
    )
    blocks = np.array([max(1.0, len(levels[a]) / block) for a in sorted(levels)])
    var = np.maximum(spread, noise_floor) ** 2 / blocks  # of each level's log factor
    cores = float(states[-1].cpu_count)
    model = np.maximum(1.0, active[None, :] / np.maximum(shares[:, None] * cores, 1.0))
    score = (((np.log(factor) - np.log(model)) ** 2) / var).sum(axis=1)
    score += ((shares - prior) / prior_sd) ** 2
    return float(shares[int(np.argmin(score))])


def summarize(
    states: list[TunerState], cores_share: float | None = None, learned: bool = False
) -> Service:
    """The service estimate from settled batches, possibly of several configurations
    of one regime (means: the throughput a worker gives is one over its mean service
    time, tails included). Each batch's waiting part is its service less its CPU at
    the contention it was measured under (`cores_share` of the cores usable, None: the
    prior's, `TunerConstants.cores_share`; `learned`: it came from `fit_cores_share`,
    and predictions use it too)."""
    if cores_share is None:
        cores_share = CONSTANTS.cores_share
    last = states[-1]
    cpu = [s.cpu_ms for s in states if s.cpu_ms is not None]
    read_cpu = [s.read_cpu_ms for s in states if s.read_cpu_ms is not None]
    waits = [
        s.service_ms
        - min(s.cpu_ms or 0.0, s.service_ms)
        * max(1.0, min(s.workers, s.depth) / max(cores_share * s.cpu_count, 1.0))
        for s in states
    ]
    mean = max(fmean(s.service_ms for s in states), 1e-3)
    return Service(
        relative=tuple(s.service_ms / mean for s in states),
        wait_ms=max(fmean(waits), 0.0),
        cpu_count=last.cpu_count,
        service_ms=max(fmean(s.service_ms for s in states), 1e-3),
        spread=service_spread([s.service_ms for s in states]),
        cpu_ms=fmean(cpu) if len(cpu) == len(states) else None,
        step_ms=max(median(s.step_ms for s in states), 1e-3),
        active=max(1, min(last.workers, last.depth)),
        samples=len(states),
        read_ms=fmean(s.read_ms for s in states),
        decode_ms=fmean(s.decode_ms for s in states),
        transform_ms=fmean(s.transform_ms for s in states),
        read_cpu_ms=fmean(read_cpu) if read_cpu else None,
        cores_share=cores_share if learned else None,
    )


class ChangeDetector:
    """Two-sided CUSUM on log service time: a regime shift (storage slowing tenfold,
    or recovering) is a lasting move of the mean, not one slow read.

    Its numbers are `config.shift_threshold` and the `detector_*` constants. The
    reference (median and spread of log service) comes from the first
    `reference_batches` samples after each `reset`; a configuration change moves it by
    the contention the change is expected to cause (`rebase`), which is no shift. Each
    later sample adds its standardized deviation, clipped at `clip` so one outlier
    cannot alarm alone, less `drift`; an alarm when either sum passes `threshold`.
    `run` is how many recent samples the alarming sum has been rising for: the new
    regime's batches. The reference set after an alarm is scored against the alarm's
    own batches the same way: back on the other side, it is a second shift (a
    slowdown whose batches in flight ran out while its alarm was answered).

    >>> d = ChangeDetector()
    >>> [d.update(x) for x in [10, 11, 9, 10, 12, 10, 9, 11]][-1] is None
    True
    >>> [d.update(x) for x in [100, 110, 95]]
    [None, None, 'slower']
    """

    def __init__(
        self, config: TunerConfig | None = None, constants: TunerConstants = CONSTANTS
    ) -> None:
        config = config or TunerConfig()
        self.threshold = config.shift_threshold
        self.drift, self.clip = constants.detector_drift, constants.detector_clip
        self.reference_batches = constants.detector_reference
        self.min_sigma = constants.detector_min_sigma
        self.large = constants.large_slowdown
        self.reset()

    def reset(self, level: float | None = None, word: str | None = None) -> None:
        """Start over; `level` (log service) is what the batches of a `word` alarm
        showed, checked against the new reference once it is set."""
        self._reference: list[float] = []
        self._level, self._word = level, word
        self.mean = self.sigma = 0.0
        self.up = self.down = 0.0
        self.run_up = self.run_down = self.run = 0
        self._recent: list[float] = []

    def rebase(self, ratio: float) -> None:
        """A configuration change expected to move the service by `ratio` (contention):
        the reference moves with it, the sums are kept, so a shift under way while the
        tuner changes configuration is still read."""
        step = math.log(max(ratio, 1e-6))
        if len(self._reference) >= self.reference_batches:
            self.mean += step
        else:
            self._reference = [r + step for r in self._reference]
            if self._level is not None:
                self._level += step

    def update(self, service_ms: float) -> str | None:
        """Add one sample; 'slower' or 'faster' on an alarm (then re-referenced), else None."""
        x = math.log(max(service_ms, 1e-6))
        if len(self._reference) < self.reference_batches:
            self._reference.append(x)
            if len(self._reference) == self.reference_batches:
                # Median and median deviation: a reference that straddles a shift (it
                # began while a change settled) takes the side most of it saw.
                self.mean = median(self._reference)
                spread = 1.4826 * median(abs(r - self.mean) for r in self._reference)
                self.sigma = max(spread, self.min_sigma)
                return self._check_reference()
            return None
        self._recent = [*self._recent[-63:], x]
        z = max(-self.clip, min(self.clip, (x - self.mean) / self.sigma))
        self.up = max(0.0, self.up + z - self.drift)
        self.down = max(0.0, self.down - z - self.drift)
        self.run_up = self.run_up + 1 if self.up > 0 else 0
        self.run_down = self.run_down + 1 if self.down > 0 else 0
        for total, run, word in (
            (self.up, self.run_up, "slower"),
            (self.down, self.run_down, "faster"),
        ):
            if total > self.threshold:
                self.reset(median(self._recent[-run:]), word)
                self.run = run
                return word
        return None

    def _check_reference(self) -> str | None:
        """The alarm's batches against the new reference, scored as the sums would
        score them: a reference far back on the other side is a second shift that
        undid the first (a slowdown that ended while its alarm was being answered),
        and so is one `large` times faster still than a faster alarm's batches (they
        were the last slow ones draining). Slower still is the new regime settling
        (more workers on a shared link read slower), which the plans measure."""
        if self._level is None:
            return None
        gap = self._level - self.mean
        z = max(-self.clip, min(self.clip, gap / self.sigma))
        word = "faster" if z > 0 else "slower"
        further = word == self._word
        if further and (word == "slower" or gap < math.log(self.large)):
            return None
        if len(self._reference) * (abs(z) - self.drift) <= self.threshold:
            return None
        self._level, self.run = None, self.reference_batches  # the reference stands
        return word


def against_measured(
    predicted: float | None,
    every: Measured | None,
    in_epoch: Measured | None,
    target: float | None,
    min_batches: int = 2 * CONSTANTS.record_block,
) -> dict[str, Any]:
    """What the loader measured of the current configuration beside what the tuner
    predicted of it: `every` counts each batch (epoch starts included, as training
    feels them), `in_epoch` leaves epoch starts out (as the tuner judges). `agrees` is
    None until `min_batches` batches; `disagreement` says how they differ and why,
    when they do by more than twice the standard error (at least 0.05), or when the
    prediction meets `target` and the measurement does not."""
    out: dict[str, Any] = {
        "predicted_utilization": predicted,
        "measured_utilization": None,
        "measured_standard_error": None,
        "measured_batches": 0 if every is None else every.batches,
        "agrees": None,
        "target_met_as_measured": None,
        "disagreement": None,
    }
    if every is None or every.batches == 0:
        return out
    util, error = every.utilization, every.standard_error
    out.update(measured_utilization=util, measured_standard_error=error)
    if predicted is None or every.batches < min_batches:
        return out
    noise = max(2.0 * error, 0.05)
    out["agrees"] = abs(predicted - util) <= noise
    unmet = target is not None and util < target <= predicted
    if target is not None:
        out["target_met_as_measured"] = util >= target
    if out["agrees"] and not unmet:
        return out
    text = (
        f"predicted {predicted:.2f}, measured {util:.2f} (± {error:.2f}) over the last "
        f"{every.batches} batches of this configuration"
    )
    inside = in_epoch.utilization if in_epoch is not None and in_epoch.batches else None
    if inside is not None and util < predicted and inside - util > 0.05:
        text += (
            f"; without each epoch's first batch {inside:.2f}: the epoch starts wait for an "
            "empty pipeline (persistent_workers=True reads them ahead)"
        )
    elif out["agrees"]:
        text += " (within the noise of the prediction)"
    elif util < predicted:
        text += ": the service is slower than the plan's estimate"
    else:
        text += ": the service is faster than the plan's estimate"
    if unmet:
        text += f"; the target {target:.2f} is not met as measured"
    out["disagreement"] = text
    return out
