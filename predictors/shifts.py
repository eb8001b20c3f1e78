"""Reading a regime shift: a lasting change of the service time at one configuration.

A baseline is measured after each configuration change, from the first `window` settled
batches under it; later windows are compared with it (`signals.large_change`,
`signals.moderate_change`). The baseline is re-measured after every change because more
workers slow each read down (they share the link and the cores): that self-inflicted
change must not read as a storage slowdown, or the tuner would chase it with still more
workers. What the tuner does about a shift is in `predictors.tuner`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from statistics import fmean, median, pstdev

from predictors.signals import large_change, moderate_change
from predictors.state import TunerState, nominal_service_ms, state_features, utilization

__all__ = ["ServiceBaseline", "Shift", "batch_service_ms"]


@functools.lru_cache(maxsize=1024)
def batch_service_ms(state: TunerState) -> float:
    """One batch's configuration-free service time, computed once per batch: the shift
    checks read the last 8-32 batches at every batch, and recomputing their features
    cost 0.53 ms of the tuner thread's CPU a batch at 32-batch windows (0.12 ms with
    this), on the 2 cores the workers are short of at nas 2 ms."""
    return nominal_service_ms(state_features(state))


@dataclass(frozen=True)
class Shift:
    """A lasting service-time change: the baseline and the new service time (ms a
    batch), how many recent batches show the new regime, and whether it is large (5x)."""

    before: float
    now: float
    fresh: int
    large: bool


class ServiceBaseline:
    """The service time measured after the last configuration change, and the shifts
    read against it (`read`)."""

    def __init__(self, shift_ratio: float) -> None:
        self.shift_ratio = shift_ratio
        self.median = 0.0  # service time per batch after the last change: its median
        self.mean = 0.0  # and its mean
        self.cv = 0.0  # and its coefficient of variation
        self.utilization = 0.0  # and the utilization measured with it
        self.active = 0  # and the busy workers (min(workers, depth)) it had
        self.measured = False  # re-measured since the last change
        self.suspect = False  # one recent batch far slower than the baseline

    def rebase(self) -> None:
        """Measure the baseline afresh from the next window (a new configuration, or a
        new regime kept as is)."""
        self.measured = False

    def moderate_ratio(self) -> float:
        """How far a moderate change must move the service time: `shift_ratio`, or more
        when the baseline's own service times are noisier (1 + 2 cv)."""
        return max(self.shift_ratio, 1 + 2 * self.cv)

    def read(
        self, settled: list[TunerState], goal: float, window: int, fresh_batches: int
    ) -> Shift | None:
        """A lasting change of the service time in the last `window` of the current
        configuration's `settled` batches, None when there is none (or too few
        batches yet). The first full window after a change sets the baseline; a shift
        that began while the configuration settled is read then (`_settle_shift`)."""
        if len(settled) < window:
            return None
        window_states = settled[-window:]
        services = [batch_service_ms(s) for s in window_states]
        # Medians: the first batches of new workers pay for connections and file footers
        # and would make a baseline that a steady service then reads as a speed-up.
        now = median(services)
        if not self.measured:
            before, before_active, ratio = self.median, self.active, 0.0
            if before > 0:
                ratio = self.moderate_ratio()  # the last baseline's
            self.median, self.measured = now, True
            self.mean = fmean(services)
            self.cv = pstdev(services) / max(self.mean, 1e-9)
            self.utilization = utilization(window_states)
            self.active = active = min(window_states[-1].workers, window_states[-1].depth)
            return self._settle_shift(
                before, before_active, now, active, ratio, len(window_states), goal
            )
        fresh = window_states[-fresh_batches:]
        recent = services[-fresh_batches:]
        # A large change first (planned from the batches of the new regime on: earlier
        # ones would under-provision a slowdown), then a moderate one (`signals`).
        change, first = large_change(recent, self.mean)
        # A batch 5x slower within the window, not yet a shift: a slowdown may be
        # starting. The whole window: with read-ahead at one worker every other batch
        # is cheap and the batch read while the storage slowed is only part slow, so
        # the second slow batch came 4 after the first (object-store at 1/1).
        wide, _ = large_change(services, self.mean)
        self.suspect = wide in ("slower", "one-slow")
        # A speed-up matters only for releasing memory, so only while utilization meets
        # the goal: still short, the baseline moved with contention (fewer files opening,
        # a quieter core), and re-planning from it went back down to a configuration
        # already measured short (nas at 2 ms: down and up again every 50-100 batches).
        short = utilization(fresh) < goal
        if change == "faster":
            return None if short else Shift(self.mean, fmean(recent), len(recent), True)
        if change == "slower":
            if utilization(fresh[first:]) >= goal:
                return None  # slower, but still fast enough: nothing to fix
            return Shift(self.mean, fmean(recent[first:]), len(recent) - first, True)
        # A moderate change must exceed what the baseline's own jitter explains: the
        # object-store profile's lognormal reads measured cv 0.3-0.6 over a baseline
        # window (r up to 2.2), and its 1.7x "slowdowns" were jitter; nas at 2 ms
        # measured 0.2-0.35, which leaves r at 1.6.
        ratio = self.moderate_ratio()
        change = moderate_change(services, self.median, ratio, len(fresh))
        if change == "none" or (change == "slower" and not short) or (change == "faster" and short):
            return None  # no lasting change, slower but fast enough, or faster but short
        if change == "slower" and utilization(window_states) >= 0.9 * self.utilization:
            # Slower reads that cost no utilization: the workers' own contention (a shared
            # link or cores, whose queue grows with the workers), not the storage. At nas
            # 2 ms, 18 workers' reads went from 27 to 80 ms while utilization held, and
            # re-planning for that slower "storage" took the most workers there are.
            return None
        return Shift(self.median, now, len(fresh), False)

    def _settle_shift(
        self,
        before: float,
        before_active: int,
        now: float,
        active: int,
        ratio: float,
        n: int,
        goal: float,
    ) -> Shift | None:
        """A shift that began while a new configuration settled, read by comparing its
        baseline (`now` ms, `active` busy workers) with the last one: unseen, the new
        regime would become the baseline, and what was measured before compared with it.
        Contention only slows each batch: with no fewer workers, a baseline `ratio`
        faster is a speed-up; with no more, one `ratio` slower is a slowdown; and 5x
        either way is a shift with at most 1.5x the workers or at least 1/1.5 of them (a
        step-down from 21 to 16 workers as the tenfold slowdown ended read 35 ms
        against 1094: unseen, the memory came down one step-down at a time).
        (`ratio`: 0 when no baseline.)"""
        if ratio <= 0:
            return None
        meets = self.utilization >= goal
        faster = (now * ratio < before and active >= before_active) or (
            now * 5 < before and 1.5 * active >= before_active
        )
        if faster and meets:
            return Shift(before, now, n, now * 5 < before)
        slower = (now > ratio * before and active <= before_active) or (
            now > 5 * before and active <= 1.5 * before_active
        )
        if slower and not meets:
            return Shift(before, now, n, now > 5 * before)
        return None
