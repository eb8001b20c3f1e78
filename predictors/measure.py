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

import numpy as np

from predictors.state import TunerState

__all__ = [
    "ChangeDetector",
    "Contention",
    "Measured",
    "Service",
    "fit_contention",
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

    block: int = 8
    keep: int = 8
    unknown: float = 0.1  # the standard error before two blocks
    batches: int = 0
    blocks: list[tuple[float, float]] = field(default_factory=list)
    _open: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def add(self, state: TunerState) -> None:
        self.batches += 1
        self._open[0] += state.step_ms
        self._open[1] += state.stall_ms
        if self.batches % self.block == 0:
            self.blocks = [*self.blocks[-(self.keep - 1) :], (self._open[0], self._open[1])]
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
    wait_ms: float = 0.0  # the service less its CPU at the cores' contention, at 1 worker
    cpu_count: int = 1
    relative: tuple[float, ...] = ()  # each batch's service over the mean: its spread
    read_ms: float = 0.0
    decode_ms: float = 0.0
    transform_ms: float = 0.0
    read_cpu_ms: float | None = None
    growth: float = 0.0  # the waiting part's growth per extra busy worker (`Contention`)
    cores_share: float | None = None  # of the cores the CPU is shared by (None: the prior's)

    def wait_at(self, active: np.ndarray | float) -> np.ndarray | float:
        """The waiting part of one worker's service at `active` busy workers."""
        return self.wait_ms * np.maximum(1.0 + self.growth * (np.asarray(active) - 1.0), 0.0)

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


def _waits(states: list[TunerState], cores_share: float) -> np.ndarray:
    """Each batch's waiting part: its service less its CPU at the contention it was
    measured under (`cores_share` of the cores usable)."""
    return np.array(
        [
            s.service_ms
            - min(s.cpu_ms or 0.0, s.service_ms)
            * max(1.0, min(s.workers, s.depth) / max(cores_share * s.cpu_count, 1.0))
            for s in states
        ]
    )


@dataclass(frozen=True)
class Contention:
    """How one worker's service grows with `a` busy workers: its CPU is shared by
    `share` of the cores, and its wait grows by `growth` per extra worker (a shared
    link), wait(a) = wait(1) * (1 + growth * (a - 1)); each with its sd."""

    share: float = 0.8
    growth: float = 0.0
    share_sd: float = 0.0
    growth_sd: float = 0.0


def fit_contention(
    states: list[TunerState],
    prior: Contention,
    noise_floor: float,
    block: int,
    min_batches: int,
    shares: np.ndarray,
    growths: np.ndarray,
) -> Contention:
    """The contention learned from this run's batches, each part from the stage that
    shows it: the read's growth with busy workers (a shared link) from the read times,
    and the share of the cores from the decode's time over its CPU (the queue for a
    core). Each busy-worker count measured on `min_batches` or more gives its medians
    (a burst or a tail moves a median little), known to their relative spread (at
    least `noise_floor`) over the root of its blocks of `block` batches (batches come
    in runs, blocks nearly independent). Each part is the posterior mode on its grid
    (`growths`, `shares`) under a normal prior (`prior`). One busy-worker count says
    nothing of either, so the prior stands.

    >>> fit_contention([], Contention(0.8, 0.1, 0.1, 0.05), 0.05, 8, 16, np.ones(1), np.ones(1))
    Contention(share=0.8, growth=0.1, share_sd=0.1, growth_sd=0.05)
    """
    by_active: dict[int, list[TunerState]] = {}
    for s in states:
        by_active.setdefault(min(s.workers, s.depth), []).append(s)
    levels = {a: part for a, part in by_active.items() if len(part) >= min_batches}
    if len(levels) < 2:
        return prior
    active = np.array(sorted(levels), dtype=float)
    parts = [levels[a] for a in sorted(levels)]
    blocks = np.array([max(1.0, len(part) / block) for part in parts])

    def medians(values: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
        """Each level's median, and the variance of its log."""
        mid = np.array([max(median(v), 1e-9) for v in values])
        spread = np.array(
            [
                1.4826 * median(abs(math.log(max(x, 1e-9) / m)) for x in v)
                for v, m in zip(values, mid, strict=True)
            ]
        )
        return mid, np.maximum(spread, noise_floor) ** 2 / blocks

    growth, growth_sd = prior.growth, prior.growth_sd
    if prior.growth_sd > 0:
        read, var = medians([[s.read_ms for s in part] for part in parts])
        shape = 1.0 + growths[:, None] * (active - 1.0)[None, :]
        ok = (shape > 0).all(axis=1)
        logs = np.log(np.where(shape > 0, shape, 1.0))
        # The one-worker read that fits best in logs, for each growth.
        one = ((np.log(read) - logs) / var).sum(axis=1) / (1.0 / var).sum()
        score = (((np.log(read) - one[:, None] - logs) ** 2) / var).sum(axis=1)
        score += ((growths - prior.growth) / prior.growth_sd) ** 2
        growth, growth_sd = _posterior(growths[ok], score[ok])
    share, share_sd = prior.share, prior.share_sd
    cpu_known = all(s.cpu_ms is not None for s in states)
    if prior.share_sd > 0 and cpu_known:
        waits = [
            [
                (s.decode_ms + s.transform_ms)
                / max((s.cpu_ms or 0.0) - (s.read_cpu_ms or 0.0), 1e-6)
                for s in part
            ]
            for part in parts
        ]
        factor, var = medians(waits)
        cores = float(states[-1].cpu_count)
        model = np.maximum(1.0, active[None, :] / np.maximum(shares[:, None] * cores, 1.0))
        score = (((np.log(factor) - np.log(model)) ** 2) / var).sum(axis=1)
        score += ((shares - prior.share) / prior.share_sd) ** 2
        share, share_sd = _posterior(shares, score)
    return Contention(share, growth, share_sd, growth_sd)


def _posterior(grid: np.ndarray, score: np.ndarray) -> tuple[float, float]:
    """The most probable value of the density exp(-score / 2) on a grid, and its sd
    (each point weighted by its width). The mode, not the mean: with little data the
    prior's own value stands, not the mean of its part inside the grid's range."""
    density = np.exp(-(score - score.min()) / 2) * _widths(grid)
    density /= density.sum()
    mean = float(density @ grid)
    sd = float(np.sqrt(max(float(density @ (grid - mean) ** 2), 0.0)))
    return float(grid[int(np.argmin(score))]), sd


def _widths(grid: np.ndarray) -> np.ndarray:
    return np.gradient(grid) if len(grid) > 1 else np.ones(1)


def summarize(
    states: list[TunerState],
    cores_share: float = 0.8,
    growth: float = 0.0,
    learned: bool = False,
    normalize: bool = False,
) -> Service:
    """The service estimate from settled batches, possibly of several configurations
    of one regime (means: the throughput a worker gives is one over its mean service
    time, tails included). Each batch's waiting part is its service less its CPU at
    the contention it was measured under (`cores_share` of the cores usable), taken
    back to one busy worker by `growth`. `learned`: both came from `fit_contention`,
    so each batch's service is taken to the last batch's busy workers by that curve
    before its mean and spread are taken (a spread across configurations is no
    lateness)."""
    last = states[-1]
    cpu = [s.cpu_ms for s in states if s.cpu_ms is not None]
    read_cpu = [s.read_cpu_ms for s in states if s.read_cpu_ms is not None]
    active = np.array([min(s.workers, s.depth) for s in states], dtype=float)
    waits = _waits(states, cores_share) / np.maximum(1.0 + growth * (active - 1.0), 1e-3)
    wait_ms = max(fmean(waits.tolist()), 0.0)
    services = [s.service_ms for s in states]
    if learned and normalize:  # each batch's service at the last busy workers, by the curve
        cores = max(cores_share * last.cpu_count, 1.0)
        cpu_ms = fmean(min(s.cpu_ms or 0.0, s.service_ms) for s in states)
        curve = wait_ms * np.maximum(1.0 + growth * (active - 1.0), 0.0)
        curve = np.maximum(curve + cpu_ms * np.maximum(1.0, active / cores), 1e-3)
        services = (np.array(services) * curve[-1] / curve).tolist()
    mean = max(fmean(services), 1e-3)
    return Service(
        relative=tuple(s / mean for s in services),
        wait_ms=wait_ms,
        cpu_count=last.cpu_count,
        service_ms=mean,
        spread=service_spread(services),
        cpu_ms=fmean(cpu) if len(cpu) == len(states) else None,
        step_ms=max(median(s.step_ms for s in states), 1e-3),
        active=max(1, min(last.workers, last.depth)),
        samples=len(states),
        read_ms=fmean(s.read_ms for s in states),
        decode_ms=fmean(s.decode_ms for s in states),
        transform_ms=fmean(s.transform_ms for s in states),
        read_cpu_ms=fmean(read_cpu) if read_cpu else None,
        growth=growth,
        cores_share=cores_share if learned else None,
    )


class ChangeDetector:
    """Two-sided CUSUM on log service time: a regime shift (storage slowing tenfold,
    or recovering) is a lasting move of the mean, not one slow read.

    The reference (median and spread of log service) comes from the first
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
        self,
        threshold: float = 8.0,
        drift: float = 0.5,
        clip: float = 4.0,
        reference_batches: int = 8,
        min_sigma: float = 0.25,
        large: float = 4.0,
    ) -> None:
        self.threshold, self.drift, self.clip = threshold, drift, clip
        self.reference_batches, self.min_sigma = reference_batches, min_sigma
        self.large = large
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
