"""Every number the online controller uses, in one frozen record.

`LearnedTuner(config=TunerConfig(...))` or its keyword arguments (`confidence=0.8`)
change them; nothing in `predictors.tuner`, `predictors.forecast` or
`predictors.measure` hides a number of its own. Each field says what it is and why it
has its value (the measurements are in benchmarks/results/controller-notes.md and
tuner-history.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from predictors.errors import TunerConfigError

__all__ = ["TunerConfig"]


@dataclass(frozen=True)
class TunerConfig:
    """The controller's parameters and constants (see the module doc)."""

    # --- the knobs (also LearnedTuner's keyword arguments) --------------------------
    confidence: float = 0.5  # z of the lower confidence bound on utilization
    max_step: float = 8.0  # memory may change by at most this factor per decision
    settle_services: float = 1.0  # service times to wait after a change takes effect
    window_services: float = 3.0  # service times of batches a decision may wait for
    shift_threshold: float = 8.0  # the CUSUM's alarm level (standardized units)
    shift_headroom: float = 1.5  # reads taken this much slower after a large slowdown
    burst_batches: int = 40  # a slowdown over within this many batches was a burst
    warmup_batches: int = 3  # settled batches before any decision
    # --- regimes ----------------------------------------------------------------------
    large_slowdown: float = 4.0  # a service this many times slower is a new regime
    transient_level: float = 1.5  # back within this factor of before: the burst is over
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
    record_unknown_error: float = 0.1  # a record's standard error before two blocks
    # --- the prior --------------------------------------------------------------------
    prior_mdape: float = 0.04  # the queueing prior's median throughput error, unseen groups
    mdape_to_sigma: float = 1.4826  # a normal's sd per median absolute deviation
    prior_error_floor: float = 0.03  # the prior's log error is at least this
    prior_spread: float = 0.1  # the prior's utilization error when the model has none
    # What the tuner plans with when no model is named (the prior alone): the errors
    # measured on the real sweeps (predictors/data, grouped cross-validation), the
    # numbers the shipped model file carried while its correction weight was 0.
    default_prior_mdape: float = 0.04351248001718577
    default_prior_spread: float = 0.12505449055369317
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
    # --- the online model (`online=True`) ----------------------------------------------
    online: bool = False  # share measured errors with neighbouring configurations
    online_length: float = 1.0  # its kernel's length, in log2 of workers and of depth
    online_sd: float = 0.5  # its prior sd of the log stall factor
    online_stall_floor: float = 0.02  # added to stalls before their log is taken
    online_min_batches: int = 16  # a record shorter than this does not teach it
    online_censor: bool = False  # drop saturated records better than predicted (worse)
    online_narrow: bool = False  # narrow the bound by the posterior sd (measured: worse)

    def __post_init__(self) -> None:
        if not self.shift_headroom >= 1.0:
            raise TunerConfigError(
                f"`shift_headroom` must be at least 1. Found: {self.shift_headroom!r}. "
                "Fix: 1 plans for the service as measured; 1.5 is the default."
            )
        if not self.recheck_factor >= 1.0:
            raise TunerConfigError(
                f"`recheck_factor` must be at least 1. Found: {self.recheck_factor!r}. "
                "Fix: 1.5 is the default; inf never remakes an unreachable plan."
            )
        if not self.burst_batches >= 0:
            raise TunerConfigError(
                f"`burst_batches` must be at least 0. Found: {self.burst_batches!r}. "
                "Fix: 0 reads every slowdown as a new regime; 40 is the default."
            )

    @classmethod
    def with_overrides(cls, base: TunerConfig | None = None, **overrides: object) -> TunerConfig:
        """`base` (default: the defaults) with the named fields replaced."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TunerConfigError(
                f"Unknown tuner parameter(s) {unknown}. Fix: use one of {sorted(names)}."
            )
        values = {f.name: getattr(base or cls(), f.name) for f in fields(cls)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
