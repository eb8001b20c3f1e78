"""Per-batch measurements: consumer stall and step, stage service times, memory.

Utilization = step / (step + stall): the share of the consumer's time spent computing
(on the GPU) rather than waiting for data. The tuner reads these windows; `stats()`
reports them.

Why recorded in blocks: a batch of cheap samples costs torch's DataLoader ~40 µs, and
folding each batch into a dozen windows and counters as it arrives cost ~10 µs of that
again. A batch appends one tuple; the tuples are folded a window at a time, or when a
figure is read (`steps`, `waits`, `snapshot()`).
"""

from __future__ import annotations

import time
from collections import deque
from statistics import median
from typing import Any

from iolib.fetcher import BatchMeta


class Telemetry:
    """Rolling windows over the last `window` batches, plus run totals."""

    def __init__(self, window: int = 64) -> None:
        self.window = window
        self._waits: deque[float] = deque(maxlen=window)  # seconds blocked in __next__
        self._steps: deque[float] = deque(maxlen=window)  # seconds between hand-over and request
        self.sizes: deque[int] = deque(maxlen=window)  # samples per batch
        self.stages: dict[str, deque[float]] = {}
        self.stage_cpu: dict[str, deque[float]] = {}  # the workers' CPU ms of each stage
        self.batch_bytes: deque[int] = deque(maxlen=window)
        self.batches = self.samples = self.bytes_read = self.retries = 0
        self.skipped: list[int] = []
        self.refilled = 0  # samples read from a reserve for batches that lost every sample
        self.peak_bytes_in_flight = 0
        # Batches not folded yet: (requested, handed over, meta, bytes in flight).
        self._pending: list[tuple[float, float, BatchMeta, int]] = []
        self._handed_over: float | None = None  # the last folded batch's hand-over
        self.first_batch_s: float | None = None
        self._started = time.perf_counter()

    def start_epoch(self) -> None:
        """A new iteration: the gap since the last batch is not a training step."""
        self._fold()
        self._handed_over = None
        self._started = time.perf_counter()

    def record(self, requested: float, handed_over: float, meta: BatchMeta, memory: int) -> None:
        """A batch asked for at `requested` and handed over at `handed_over`
        (`time.perf_counter()`), with `memory` bytes in flight counting it."""
        pending = self._pending
        pending.append((requested, handed_over, meta, memory))
        if len(pending) >= self.window:
            self._fold()

    def on_request(self, now: float) -> None:
        """The consumer asked for a batch that did not come (the epoch ended): the step
        of the last one still counts."""
        self._fold()
        if self._handed_over is not None:
            self._steps.append(now - self._handed_over)
            self._handed_over = None

    def _fold(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        if self.first_batch_s is None:
            self.first_batch_s = pending[0][1] - self._started
        window, handed_over = self.window, self._handed_over
        waits, steps, sizes, batch_bytes = self._waits, self._steps, self.sizes, self.batch_bytes
        stages, stage_cpu, peak = self.stages, self.stage_cpu, self.peak_bytes_in_flight
        for requested, handed, meta, memory in pending:
            if handed_over is not None:
                steps.append(requested - handed_over)
            handed_over = handed
            waits.append(handed - requested)
            sizes.append(meta.samples)
            batch_bytes.append(meta.nbytes)
            for stage, ms in meta.stage_ms.items():
                found = stages.get(stage)
                if found is None:
                    found = stages[stage] = deque(maxlen=window)
                found.append(ms)
            for stage, ms in meta.cpu_ms.items():
                found = stage_cpu.get(stage)
                if found is None:
                    found = stage_cpu[stage] = deque(maxlen=window)
                found.append(ms)
            self.samples += meta.samples
            self.bytes_read += meta.bytes_read
            self.retries += meta.retries
            if meta.skipped:
                self.skipped.extend(meta.skipped)
            self.refilled += meta.refilled
            if memory > peak:
                peak = memory
        self.batches += len(pending)
        self.peak_bytes_in_flight, self._handed_over = peak, handed_over

    def step_before(self, requested: float) -> float:
        """The step that ended with a request at `requested`: since the last batch's
        hand-over (this epoch's), else the last step measured (0 when none)."""
        last = self._pending[-1][1] if self._pending else self._handed_over
        if last is not None:
            return requested - last
        return self._steps[-1] if self._steps else 0.0

    @property
    def waits(self) -> deque[float]:
        """Seconds the consumer was blocked in `__next__`, of the last `window` batches."""
        self._fold()
        return self._waits

    @property
    def steps(self) -> deque[float]:
        """Seconds between a batch's hand-over and the next request (the training step)."""
        self._fold()
        return self._steps

    def stall_fraction(self) -> float:
        """Share of the consumer's recent time spent waiting for data (0 when none measured)."""
        waits, steps = sum(self.waits), sum(self.steps)
        return waits / (waits + steps) if waits + steps > 0 else 0.0

    def snapshot(self) -> dict[str, Any]:
        """The figures `DataLoader.stats()` reports (without the engine's live counts)."""
        self._fold()
        waits, steps = self._waits, self._steps
        wall = sum(waits) + sum(steps)
        recent = sum(list(self.sizes)[-len(steps) - 1 :]) if steps else 0
        stall = self.stall_fraction()
        return {
            "batches": self.batches,
            "samples": self.samples,
            "samples_per_s": recent / wall if wall > 0 else 0.0,
            "stall_fraction": stall,
            "utilization": 1.0 - stall,
            "wait_ms": 1e3 * median(waits) if waits else 0.0,
            "step_ms": 1e3 * median(steps) if steps else 0.0,
            "stage_ms": {k: median(v) for k, v in self.stages.items() if v},
            # Of that, CPU: a stage far above its CPU waits (storage, or a busy core).
            "stage_cpu_ms": {k: median(v) for k, v in self.stage_cpu.items() if v},
            "batch_bytes": int(median(self.batch_bytes)) if self.batch_bytes else 0,
            "bytes_read": self.bytes_read,
            "retries": self.retries,
            "skipped": len(self.skipped),
            "refilled": self.refilled,
            "peak_bytes_in_flight": self.peak_bytes_in_flight,
            "first_batch_s": self.first_batch_s,
        }
