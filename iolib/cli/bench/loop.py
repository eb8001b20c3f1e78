"""The measurement loop both loaders go through, and a sampler of RSS and CPU.

A simulated training step: after each batch the consumer sleeps (or spins) `step_ms`.
Stall is the time spent waiting inside `next()`. The first batch is reported apart
(`first_batch_s`, it includes worker start-up); every other outcome covers batches
2..n, so start-up does not blur the steady state.

Every wait is bounded by the run's time limit: the loop runs on a helper thread, and a
loader that hands over no batch for `max_seconds` (a request stuck in storage, which no
signal interrupts) is left behind with `timed_out=True`; `bounded` does the same for any
other wait (the storage probes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import psutil

from iolib.cli.bench.datasets import batch_nbytes
from iolib.errors import IolibError

T = TypeVar("T")


class BenchTimeout(IolibError):
    """A wait of the benchmark passed the run's time limit (--max-seconds)."""


def bounded(fn: Callable[[], T], limit_s: float, what: str) -> T:
    """`fn()`, or BenchTimeout once `limit_s` has passed: it runs on a daemon thread,
    left behind if stuck (a storage request cannot be interrupted, only abandoned)."""
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller
            box.append((False, exc))

    thread = threading.Thread(target=run, name="bench-bounded", daemon=True)
    thread.start()
    thread.join(limit_s)
    if not box:
        raise BenchTimeout(
            f"{what} took longer than the run's limit, --max-seconds {limit_s:g}: the "
            "storage answers too slowly. Lower --latency-ms or --jitter, or raise --max-seconds."
        )
    ok, value = box[0]
    if ok:
        return value
    raise value


class ResourceMonitor:
    """Samples the process tree (this process and its worker children) every `period_s`.

    peak_rss: the largest sum of RSS over the tree (an upper bound: forked workers share
    pages). cpu_percent: CPU seconds used by the tree per wall second x 100 (above 100
    means more than one core). read_bytes(): bytes the tree read through read calls
    (/proc's rchar) since the start: one measure for both loaders, whatever their stats.
    """

    def __init__(self, period_s: float = 0.1) -> None:
        self.period_s = period_s
        self.proc = psutil.Process()
        self.peak_rss = 0
        self._cpu: dict[int, float] = {}
        self._cpu0 = 0.0
        self._read: dict[int, int] = {}  # pid -> rchar; a worker's last value stays
        self._read0 = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-monitor")

    def sample(self) -> None:
        rss = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    self._cpu[p.pid] = t.user + t.system
                    self._read[p.pid] = getattr(p.io_counters(), "read_chars", 0)
            except (psutil.Error, AttributeError):  # no io_counters on some platforms
                continue
        self.peak_rss = max(self.peak_rss, rss)

    def cpu_seconds(self) -> float:
        return sum(self._cpu.values()) - self._cpu0

    def read_bytes(self) -> int:
        return sum(self._read.values()) - self._read0

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> ResourceMonitor:
        self.sample()
        self._cpu0 = sum(self._cpu.values())
        self._read0 = sum(self._read.values())
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
        self.wall_s = time.perf_counter() - self._t0


def simulate_step(step_ms: float, mode: str = "sleep") -> None:
    """The consumer's training step: `sleep` (frees the CPU, like a GPU step) or `spin`."""
    if step_ms <= 0:
        return
    if mode == "sleep":
        time.sleep(step_ms / 1000.0)
        return
    end = time.perf_counter() + step_ms / 1000.0
    while time.perf_counter() < end:
        pass


@dataclass
class Measurement:
    """Raw outcomes of one run; `outcomes()` turns them into the observation columns."""

    batch_size: int
    step_ms: float
    stalls: list[float] = field(default_factory=list)
    batch_bytes: list[int] = field(default_factory=list)
    first_batch_s: float = float("nan")
    elapsed_s: float = 0.0  # from the first batch's hand-over to the end
    interrupted: bool = False
    timed_out: bool = False  # no batch within max_seconds: the loader was left behind
    peak_rss_bytes: int = 0
    read_bytes: int = -1
    cpu_percent: float = 0.0
    loader_stats: dict[str, Any] = field(default_factory=dict)

    def outcomes(self, bytes_per_sample: float, depth: int) -> dict[str, float]:
        stalls = np.asarray(self.stalls[1:], dtype=float)  # batch 1 is start-up
        n = len(stalls)
        samples = n * self.batch_size
        elapsed = max(self.elapsed_s, 1e-9)
        step_total = n * self.step_ms / 1000.0
        stall_total = float(stalls.sum()) if n else float("nan")
        tput = samples / elapsed if n else float("nan")
        mean_batch = float(np.mean(self.batch_bytes)) if self.batch_bytes else 0.0
        peak = self.loader_stats.get("peak_bytes_in_flight")
        return {
            "batches": n,
            "throughput_sps": tput,
            "mb_per_s": tput * bytes_per_sample / 1e6,
            "stall_fraction": stall_total / elapsed if n else float("nan"),
            "utilization": step_total / (step_total + stall_total) if n and step_total else
            (float("nan") if not n else 0.0),
            "p50_batch_ms": float(np.percentile(stalls, 50) * 1000) if n else float("nan"),
            "p99_batch_ms": float(np.percentile(stalls, 99) * 1000) if n else float("nan"),
            "first_batch_s": self.first_batch_s,
            "peak_rss_bytes": int(self.peak_rss_bytes),
            "tree_read_bytes": int(self.read_bytes),
            "memory_bytes": int(peak) if peak is not None else int(max(depth, 1) * mean_batch),
            "cpu_percent": self.cpu_percent,
            "batch_bytes": mean_batch,
        }  # fmt: skip


def measure(
    make_iterable: Callable[[], Iterable],
    *,
    batch_size: int,
    step_ms: float,
    batches: int,
    max_seconds: float = float("inf"),
    step_mode: str = "sleep",
    on_batch: Callable[[], None] | None = None,
    stats: Callable[[], dict] | None = None,
) -> Measurement:
    """Run the consumer loop over up to `batches` batches (or `max_seconds` after the first).

    Ctrl-C ends the loop early: the result has `interrupted=True` and what was measured.
    A loader that hands over no batch for `max_seconds` (after start or after the last
    batch's step) is abandoned: `timed_out=True`, and the run took about `max_seconds`.
    """
    m = Measurement(batch_size=batch_size, step_ms=step_ms)
    stop = threading.Event()
    failed: list[BaseException] = []

    def consume() -> None:
        try:
            _consume(m, make_iterable, batches, max_seconds, step_mode, on_batch, stats, stop)
        except BaseException as exc:  # a loader's error: raised again by the caller's thread
            failed.append(exc)

    with ResourceMonitor() as monitor:
        t_start = time.perf_counter()
        consumer = threading.Thread(target=consume, name="bench-consumer", daemon=True)
        consumer.start()
        try:
            _watch(consumer, m, t_start, max_seconds)
        except KeyboardInterrupt:
            m.interrupted = True
            stop.set()  # the consumer ends after the batch it waits for
            consumer.join(max_seconds if max_seconds < float("inf") else None)
        if m.timed_out:
            stop.set()
        monitor.sample()
    if failed and not m.timed_out:
        raise failed[0]
    m.peak_rss_bytes = monitor.peak_rss
    m.read_bytes = monitor.read_bytes()
    m.cpu_percent = 100.0 * monitor.cpu_seconds() / max(monitor.wall_s, 1e-9)
    return m


def _watch(consumer: threading.Thread, m: Measurement, t_start: float, limit: float) -> None:
    """Wait for the consumer; mark `m` timed out when no batch came for `limit` seconds
    (a batch's step is the consumer's own time, not a wait)."""
    step_s = m.step_ms / 1000.0
    seen, since = 0, t_start
    while consumer.is_alive():
        consumer.join(min(0.05, limit))
        now = time.perf_counter()
        if len(m.stalls) != seen:
            seen, since = len(m.stalls), now
        elif now - since > limit + (step_s if seen else 0.0):
            m.timed_out = True
            return


def _consume(
    m: Measurement,
    make_iterable: Callable[[], Iterable],
    batches: int,
    max_seconds: float,
    step_mode: str,
    on_batch: Callable[[], None] | None,
    stats: Callable[[], dict] | None,
    stop: threading.Event,
) -> None:
    """The training loop (on the consumer thread): batches into `m`, then shutdown."""
    step_ms = m.step_ms
    t_start = time.perf_counter()
    iterator = iter(make_iterable())
    t_first = None
    try:
        for k in range(batches):
            if stop.is_set():
                break
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            t1 = time.perf_counter()
            if k == 0:
                t_first = t1
                m.first_batch_s = t1 - t_start
            m.stalls.append(t1 - t0)
            m.batch_bytes.append(batch_nbytes(batch))
            del batch
            if on_batch is not None:
                on_batch()
            simulate_step(step_ms, step_mode)
            if t_first is not None and time.perf_counter() - t_first > max_seconds:
                break
    except KeyboardInterrupt:
        m.interrupted = True
    t_end = time.perf_counter()
    # The step after the last batch is not part of the measured span: the consumer
    # was not waiting for anything.
    m.elapsed_s = (t_end - t_first - step_ms / 1000.0) if t_first is not None else 0.0
    if stop.is_set() and m.timed_out:
        return  # left behind: nobody reads its statistics
    if stats is not None:
        try:
            m.loader_stats = dict(stats())
        except Exception:  # a loader without stats, or one that failed mid-run
            m.loader_stats = {}
    shutdown = getattr(iterator, "_shutdown_workers", None) or getattr(iterator, "close", None)
    if shutdown is not None:
        shutdown()
    del iterator
