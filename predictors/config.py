"""The controller's numbers, in two frozen records: what a user may set, and constants.

`TunerConfig` holds the few settings a user may change (`QueueingTuner(confidence=0.8)`
or `config=TunerConfig(...)`). `TunerConstants` holds every other number: measured
once, documented here, and not offered as keyword arguments (the lab replaces them
with `constants=`). `Forecaster`, `ChangeDetector` and `summarize` read both, so each
number has one source. The measurements are in benchmarks/results/controller-notes.md
and tuner-history.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from predictors.errors import TunerConfigError

__all__ = ["CONSTANTS", "TunerConfig", "TunerConstants"]


@dataclass(frozen=True)
class TunerConfig:
    """What a user may set (also the tuner's keyword arguments)."""

    confidence: float = 0.5  # z of the lower confidence bound on utilization
    max_step: float = 8.0  # memory may change by at most this factor per decision
    settle_services: float = 1.0  # service times to wait after a change takes effect
    window_services: float = 3.0  # service times of batches a decision may wait for
    shift_threshold: float = 8.0  # the CUSUM's alarm level (standardized units)
    shift_headroom: float = 1.5  # reads taken this much slower after a large slowdown
    burst_batches: int = 40  # a slowdown over within this many batches was a burst
    warmup_batches: int = 3  # settled batches before any decision

    def __post_init__(self) -> None:
        if not self.confidence >= 0.0:
            raise TunerConfigError(
                f"`confidence` must be at least 0. Found: {self.confidence!r}. "
                "Fix: 0 plans on the point prediction; 0.5 is the default."
            )
        if not self.max_step > 1.0:
            raise TunerConfigError(
                f"`max_step` must be above 1. Found: {self.max_step!r}. "
                "Fix: 8 (memory may change eightfold per decision) is the default."
            )
        if not self.shift_headroom >= 1.0:
            raise TunerConfigError(
                f"`shift_headroom` must be at least 1. Found: {self.shift_headroom!r}. "
                "Fix: 1 plans for the service as measured; 1.5 is the default."
            )
        if not self.burst_batches >= 0:
            raise TunerConfigError(
                f"`burst_batches` must be at least 0. Found: {self.burst_batches!r}. "
                "Fix: 0 reads every slowdown as a new regime; 40 is the default."
            )

    @classmethod
    def with_overrides(cls, base: TunerConfig | None = None, **overrides: object) -> TunerConfig:
        """`base` (default: the defaults) with the named settings replaced; a constant's
        name or an unknown one is refused."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            constants = sorted(set(unknown) & {f.name for f in fields(TunerConstants)})
            hint = (
                f" {constants} are constants (`TunerConstants`, for the lab: `constants=`)."
                if constants
                else ""
            )
            raise TunerConfigError(
                f"Unknown tuner parameter(s) {unknown}.{hint} Fix: use one of {sorted(names)}."
            )
        return replace(base or cls(), **{k: v for k, v in overrides.items() if v is not None})


@dataclass(frozen=True)
class TunerConstants:
    """Every other number the controller uses; each says what it is and why."""

    # --- regimes ----------------------------------------------------------------------
    large_slowdown: float = 4.0  # a service this many times slower is a new regime
    transient_level: float = 1.5  # back within this factor of before: the burst is over
    # A slowdown the regime's and the history's pooled services reached before (a
    # share `known_burst_share` of them at least `known_burst_level` x its level over
    # their median, among `known_burst_samples` or more) is a known burst, no regime.
    known_burst_share: float = 0.01
    known_burst_level: float = 0.8
    known_burst_samples: int = 64
    # A history whose slow batches (`burst_slow` x their record's median or more,
    # `burst_batches_seen` of them at least) follow a slow one in a share
    # `burst_persistence` or more saw bursts: a warm run does not plan below its start.
    burst_slow: float = 2.0
    burst_persistence: float = 0.25
    burst_batches_seen: int = 8
    regime_window: int = 256  # settled batches of a regime the service estimate keeps
    fresh_batches: int = 2  # at least this many batches make a new regime's estimate
    detector_drift: float = 0.5  # the CUSUM's allowance per batch (standardized)
    detector_clip: float = 4.0  # one batch moves the CUSUM by at most this
    detector_reference: int = 8  # batches that set the detector's reference
    detector_min_sigma: float = 0.25  # floor of the reference's spread (log service)
    # --- when to decide ---------------------------------------------------------------
    early_batches: int = 4  # batches before the interval may trigger a decision
    margin_floor: float = 0.02  # a record this close to the target waits for the window
    pace_samples: int = 8  # recent batches whose medians size the window
    max_window: int = 64  # the longest window, in batches
    min_pace_ms: float = 1e-3  # a step shorter than this is taken as this
    keep_samples: int = 64  # batches of the current configuration kept when holding
    # An unreachable verdict stands only while the service it was judged from does: a
    # tail in the first few batches inflates the mean, and the plan would keep it for
    # `regime_window` batches. Once the current configuration's settled batches (at
    # least `recheck_batches`) serve `recheck_factor` times faster than that plan
    # expected of them, the plan is remade from them alone (controller-notes.md, tenth
    # round: with `near_best` 0.02, no dev sum worse than without both).
    recheck_factor: float = 1.5  # the transient's level; inf never remakes one
    recheck_batches: int = 16  # two record blocks: at 8 a remade plan lost a bursty meet
    # --- what a record says -----------------------------------------------------------
    measured_blocks: int = 2  # blocks of batches that make a configuration measured
    keep_batches: int = 4  # batches meeting the target that justify holding
    saturated: float = 0.97  # a record this high says nothing of the model (it is capped)
    calibration_depth: tuple[float, float] = (1.0, 8.0)  # clip of the depth factor
    calibration_rate: tuple[float, float] = (0.2, 1.0)  # clip of the rate factor
    min_prediction: float = 1e-3  # floor of a prediction divided by
    blend_batches: int = 2  # a record shorter than this is not blended
    blend_error_floor: float = 0.01  # a record's standard error is at least this
    min_confidence: float = 1e-6  # floor of z where it divides
    record_block: int = 8  # batches per block of a record (batch means)
    record_keep: int = 8  # blocks a record keeps (older ones drop out)
    probe_blocks: int = 2  # record blocks a probe is measured on before it is judged
    history_batches: int = 16  # a history record this long is evidence in a warm run's plans
    history_run_error: float = 0.03  # utilization spread between runs of one job, at least
    record_unknown_error: float = 0.1  # a record's standard error before two blocks
    # --- the prior --------------------------------------------------------------------
    # The queueing prior's errors measured on the real sweeps (grouped cross-validation,
    # benchmarks/tuner_lab): its median throughput error on unseen groups, and its
    # utilization error.
    prior_mdape: float = 0.04351248001718577
    prior_spread: float = 0.12505449055369317
    mdape_to_sigma: float = 1.4826  # a normal's sd per median absolute deviation
    prior_error_floor: float = 0.03  # the prior's log error is at least this
    cores_share: float = 0.8  # share of the cores the workers keep busy (Python's lock)
    # ... learned in the run from the CPU stages' time over their CPU (`fit_cores_share`):
    share_sd: float = 0.15  # the prior's sd of it (processes use every core: 1.0)
    share_bounds: tuple[float, float] = (0.4, 1.0)  # the range considered
    share_grid: int = 13  # points of that range (steps of 0.05)
    share_noise: float = 0.05  # a level's relative spread is taken as at least this
    share_batches: int = 8  # a busy-worker count measured on fewer batches is not used
    # Predictions this close to the best count as the best (then the least memory):
    # 0.01 held one grid step more memory for a point nothing meets with confidence
    # anyway. On the dev ranges, run seeds 7-11, against 0.01 (met, memory within 1.25x
    # of the oracle, more than 0.03 below torch's default: 960, 789, 27): 0.02 alone
    # 962, 794, 24; with the recheck above 962, 797, 25 (0.3 and 0.4 for `confidence`
    # met less often and held more memory).
    near_best: float = 0.02
    # Of the worker counts that score alike at one memory, the fewest whose headroom
    # holds at this quantile of the measured services (bursts, tails), not their mean;
    # none: the most headroom there, up to a worker per core.
    tail_quantile: float = 0.95

    def __post_init__(self) -> None:
        if not self.recheck_factor >= 1.0:
            raise TunerConfigError(
                f"`recheck_factor` must be at least 1. Found: {self.recheck_factor!r}. "
                "Fix: 1.5 is the default; inf never remakes an unreachable plan."
            )

    @property
    def prior_error(self) -> float:
        """The prior's typical log error on throughput: `mdape_to_sigma` x its median
        absolute percentage error on unseen groups (a normal's sd), at least
        `prior_error_floor`."""
        return max(self.prior_error_floor, self.mdape_to_sigma * self.prior_mdape)


CONSTANTS = TunerConstants()
