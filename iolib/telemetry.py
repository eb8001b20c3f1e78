"""Per-batch measurements: consumer stall and step, stage service times, memory.

Utilization = step / (step + stall): the share of the consumer's time spent computing
(on the GPU) rather than waiting for data. The tuner reads these windows; `stats()`
reports them.
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
        self.waits: deque[float] = deque(maxlen=window)  # seconds blocked in __next__
        self.steps: deque[float] = deque(maxlen=window)  # seconds between hand-over and request
        self.sizes: deque[int] = deque(maxlen=window)  # samples per batch
        self.stages: dict[str, deque[float]] = {}
        self.stage_cpu: dict[str, deque[float]] = {}  # the workers' CPU ms of each stage
        self.batch_bytes: deque[int] = deque(maxlen=window)
        self.batches = self.samples = self.bytes_read = self.retries = 0
        self.skipped: list[int] = []
        self.refilled = 0  # samples read from a reserve for batches that lost every sample
        self.peak_bytes_in_flight = 0
        self._handed_over: float | None = None
        self.first_batch_s: float | None = None
        self._started = time.perf_counter()

    def start_epoch(self) -> None:
        """A new iteration: the gap since the last batch is not a training step."""
        self._handed_over = None
        self._started = time.perf_counter()

    def on_request(self, now: float) -> None:
        """The consumer asked for the next batch: close the step of the previous one."""
        if self._handed_over is not None:
            self.steps.append(now - self._handed_over)

    def on_batch(self, wait_s: float, meta: BatchMeta) -> None:
        """A batch was handed over after the consumer waited `wait_s`."""
        now = time.perf_counter()
        if self.first_batch_s is None:
            self.first_batch_s = now - self._started
        self._handed_over = now
        self.waits.append(wait_s)
        self.sizes.append(meta.samples)
        self.batch_bytes.append(meta.nbytes)
        for stage, ms in meta.stage_ms.items():
            self.stages.setdefault(stage, deque(maxlen=self.window)).append(ms)
        for stage, ms in meta.cpu_ms.items():
            self.stage_cpu.setdefault(stage, deque(maxlen=self.window)).append(ms)
        self.batches += 1
        self.samples += meta.samples
        self.bytes_read += meta.bytes_read
        self.retries += meta.retries
        self.skipped.extend(meta.skipped)
        self.refilled += meta.refilled

    def on_memory(self, bytes_in_flight: int) -> None:
        self.peak_bytes_in_flight = max(self.peak_bytes_in_flight, bytes_in_flight)

    def stall_fraction(self) -> float:
        """Share of the consumer's recent time spent waiting for data (0 when none measured)."""
        waits, steps = sum(self.waits), sum(self.steps)
        return waits / (waits + steps) if waits + steps > 0 else 0.0

    def snapshot(self) -> dict[str, Any]:
        """The figures `DataLoader.stats()` reports (without the engine's live counts)."""
        wall = sum(self.waits) + sum(self.steps)
        recent = sum(list(self.sizes)[-len(self.steps) - 1 :]) if self.steps else 0
        stall = self.stall_fraction()
        return {
            "batches": self.batches,
            "samples": self.samples,
            "samples_per_s": recent / wall if wall > 0 else 0.0,
            "stall_fraction": stall,
            "utilization": 1.0 - stall,
            "wait_ms": 1e3 * median(self.waits) if self.waits else 0.0,
            "step_ms": 1e3 * median(self.steps) if self.steps else 0.0,
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
