"""SYNTHETIC data: a small discrete-event simulator of a prefetching loader.

Used by the tests and to sanity-check the model before a real sweep exists. Nothing
it produces is shipped as training data: the default model is trained on real
`iolib bench --sweep` observations under `benchmarks/tuner_lab/data/` only.

The simulated loader: `workers` workers each build whole batches (read, then decode);
at most `depth` batches are in flight or ready at once (a batch takes a slot when a
worker starts it and frees it when the consumer takes it); the consumer takes batches
in order and computes for `step_ms` each. Service times are lognormal around:

    read   = slowdown * (latency * requests + batch_bytes / (bandwidth / active))
    decode = batch_size * decode_ms * max(1, active / cores)

(`active` = min(workers, depth): bandwidth and cores are shared; `cores` defaults to
`cpu_count`, fewer for threads held by Python's lock.) Reads can be heavy-tailed (with
`tail_prob`, a Pareto factor of shape `tail_shape`) and bursty (a slow state entered
with `burst_prob` per batch, left with 0.2, reads `burst_factor` slower). The workers'
CPU per batch (`cpu_ms`) is the decode without contention plus `read_cpu_share` of
the read. A ready batch holds
`memory_factor * batch_bytes` of memory (decoded data is larger than encoded).

Example:
    >>> w = SimWorkload("tokens", "local", bytes_per_sample=4096, decode_ms_per_sample=0.05,
    ...                 storage_latency_ms=0.2, storage_bandwidth_mbps=800, batch_size=64,
    ...                 step_ms=10, rows_per_read=64, cpu_count=8)
    >>> loader = SimulatedLoader(w, workers=2, depth=4, seed=0)
    >>> record = loader.next_batch()
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

    from predictors.state import TunerState


@dataclass(frozen=True)
class SimWorkload:
    """Parameters of one synthetic workload on one synthetic storage profile."""

    workload: str
    storage_profile: str
    bytes_per_sample: float
    decode_ms_per_sample: float
    storage_latency_ms: float
    storage_bandwidth_mbps: float
    batch_size: int
    step_ms: float
    rows_per_read: int
    cpu_count: int
    jitter: float = 0.25  # sigma of the lognormal service-time noise
    memory_factor: float = 2.0
    cores: float | None = None  # cores the workers' CPU can use (None: cpu_count)
    read_cpu_share: float = 0.02
    tail_prob: float = 0.0
    tail_shape: float = 1.5
    burst_prob: float = 0.0
    burst_factor: float = 1.0

    @property
    def batch_bytes(self) -> float:
        return self.bytes_per_sample * self.batch_size


@dataclass(frozen=True)
class BatchRecord:
    """What telemetry would report for one consumed batch (milliseconds, bytes)."""

    index: int
    stall_ms: float
    step_ms: float
    read_ms: float
    decode_ms: float
    cpu_ms: float
    bytes_read: float
    batch_memory_bytes: float
    memory_bytes: float
    workers: int
    depth: int


class SimulatedLoader:
    """Event-driven loader: config changes apply to batches dispatched afterwards."""

    def __init__(self, workload: SimWorkload, workers: int, depth: int, seed: int = 0) -> None:
        self.workload = workload
        self.rng = np.random.default_rng(seed)
        self.slowdown = 1.0
        self.now = 0.0  # time the consumer asks for the next batch
        self.workers = workers
        self.depth = depth
        self._free: list[float] = [0.0] * workers  # heap of times each worker becomes free
        self._start: list[float] = []
        self._ready: list[float] = []
        self._service: list[tuple[float, float, float]] = []
        self._burst = False
        self._handed: list[float] = []

    def set_config(self, workers: int, depth: int) -> None:
        if workers > self.workers:
            for _ in range(workers - self.workers):
                heapq.heappush(self._free, self.now)
        elif workers < self.workers:
            self._free = sorted(self._free)[:workers]  # the busiest workers retire
            heapq.heapify(self._free)
        self.workers, self.depth = workers, depth

    def _service_ms(self) -> tuple[float, float, float]:
        w = self.workload
        active = min(self.workers, self.depth)
        requests = math.ceil(w.batch_size / w.rows_per_read)
        transfer = w.batch_bytes / (w.storage_bandwidth_mbps * 1e3 / active)
        read = self.slowdown * (w.storage_latency_ms * requests + transfer)
        cpu = w.batch_size * w.decode_ms_per_sample
        decode = cpu * max(1.0, active / (w.cores or w.cpu_count))
        noise = self.rng.lognormal(-0.5 * w.jitter**2, w.jitter, size=2)
        if w.tail_prob and self.rng.random() < w.tail_prob:
            read *= self.rng.pareto(w.tail_shape) + 1.0
        if w.burst_prob:
            self._burst = self.rng.random() < (0.8 if self._burst else w.burst_prob)
            read *= w.burst_factor if self._burst else 1.0
        read *= noise[0]
        return read, decode * noise[1], cpu * noise[1] + w.read_cpu_share * read

    def _dispatch(self) -> None:
        # Batch k may start once batch k - depth has been handed over (its slot is free).
        while len(self._start) < len(self._handed) + self.depth:
            k = len(self._start)
            slot = self._handed[k - self.depth] if k - self.depth >= 0 else 0.0
            free = heapq.heappop(self._free)
            start = max(free, slot)
            read, decode, cpu = self._service_ms()
            heapq.heappush(self._free, start + read + decode)
            self._start.append(start)
            self._ready.append(start + read + decode)
            self._service.append((read, decode, cpu))

    def next_batch(self) -> BatchRecord:
        self._dispatch()
        k = len(self._handed)
        handed = max(self.now, self._ready[k])
        stall = handed - self.now
        self._handed.append(handed)
        held = sum(1 for j in range(k, len(self._start)) if self._start[j] <= handed)
        self.now = handed + self.workload.step_ms
        read, decode, cpu = self._service[k]
        w = self.workload
        batch_memory = w.memory_factor * w.batch_bytes
        return BatchRecord(
            index=k,
            stall_ms=stall,
            step_ms=w.step_ms,
            read_ms=read,
            decode_ms=decode,
            cpu_ms=cpu,
            bytes_read=w.batch_bytes,
            batch_memory_bytes=batch_memory,
            memory_bytes=max(held, 1) * batch_memory,
            workers=self.workers,
            depth=self.depth,
        )


def measure(
    workload: SimWorkload, workers: int, depth: int, n_batches: int = 120, seed: int = 0
) -> dict:
    """One synthetic observation row (features, config, outcomes) as `iolib bench` writes it."""
    loader = SimulatedLoader(workload, workers, depth, seed=seed)
    records = [loader.next_batch() for _ in range(n_batches)]
    skip = min(5, n_batches // 4)  # the pipeline fills first; bench measures after warm-up
    steady = records[skip:]
    step = sum(r.step_ms for r in steady)
    stall = sum(r.stall_ms for r in steady)
    seconds = (step + stall) / 1e3
    samples = len(steady) * workload.batch_size
    intervals = np.array([r.step_ms + r.stall_ms for r in steady])
    hidden = {f.name for f in fields(SimWorkload)} - {f.name for f in fields(SimWorkload)[:10]}
    row = {k: v for k, v in asdict(workload).items() if k not in hidden}
    row.update(
        loader="iolib",
        run_id=f"synthetic-{seed}",
        repeat=0,
        machine="synthetic",
        workers=workers,
        depth=depth,
        shuffle="none",
        cache=False,
        throughput_sps=samples / seconds,
        mb_per_s=samples * workload.bytes_per_sample / 1e6 / seconds,
        stall_fraction=stall / (step + stall),
        utilization=step / (step + stall),
        p50_batch_ms=float(np.percentile(intervals, 50)),
        p99_batch_ms=float(np.percentile(intervals, 99)),
        first_batch_s=records[0].stall_ms / 1e3,
        memory_bytes=max(r.memory_bytes for r in records),
        peak_rss_bytes=max(r.memory_bytes for r in records) + 200e6,
        cpu_percent=100.0 * min(workers, workload.cpu_count),
    )
    return row


_PROFILES = {  # latency ms, bandwidth MB/s: roughly local disk, NAS, object store
    "local": (0.1, 1500.0),
    "nas": (2.0, 300.0),
    "object-store": (25.0, 120.0),
}
_KINDS = {  # bytes/sample, decode ms/sample, rows per read, batch size
    "images": (110e3, 1.6, 1, 64),
    "tokens": (8e3, 0.03, 256, 256),
}


def random_workloads(n: int, seed: int = 0) -> list[SimWorkload]:
    """`n` workloads (kind x profile x random sizes), step time set so that one worker is
    1.5-10x too slow for the consumer: the loader is the bottleneck at small settings."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        kind = ("images", "tokens")[i % 2]
        profile = list(_PROFILES)[(i // 2) % 3]
        size, decode, rows, batch = _KINDS[kind]
        latency, bandwidth = _PROFILES[profile]
        w = SimWorkload(
            workload=f"{kind}-{i}",
            storage_profile=profile,
            bytes_per_sample=size * rng.uniform(0.5, 2.0),
            decode_ms_per_sample=decode * rng.uniform(0.5, 2.0),
            storage_latency_ms=latency * rng.uniform(0.5, 2.0),
            storage_bandwidth_mbps=bandwidth * rng.uniform(0.7, 1.5),
            batch_size=int(batch * rng.choice([0.5, 1, 2])),
            step_ms=1.0,
            rows_per_read=int(rows * rng.choice([0.5, 1, 2])) if rows > 1 else 1,
            cpu_count=int(rng.choice([4, 8, 16])),
        )
        service = _nominal_service_ms(w)
        out.append(replace(w, step_ms=float(service / rng.uniform(1.5, 10.0))))
    return out


def _nominal_service_ms(w: SimWorkload) -> float:
    requests = math.ceil(w.batch_size / w.rows_per_read)
    read = w.storage_latency_ms * requests + w.batch_bytes / (w.storage_bandwidth_mbps * 1e3)
    return read + w.batch_size * w.decode_ms_per_sample


def make_observations(
    n_workloads: int = 12,
    workers: tuple[int, ...] = (1, 2, 4, 8, 16),
    depths: tuple[int, ...] = (1, 2, 4, 8, 16),
    n_batches: int = 100,
    seed: int = 0,
) -> pd.DataFrame:
    """A SYNTHETIC observations table over a workers x depth grid, one repeat each."""
    import pandas as pd

    rows = []
    for i, w in enumerate(random_workloads(n_workloads, seed)):
        for j, (nw, d) in enumerate((a, b) for a in workers for b in depths):
            rows.append(measure(w, nw, d, n_batches=n_batches, seed=seed * 100_000 + i * 100 + j))
    return pd.DataFrame(rows)


def tuner_state(
    r: BatchRecord, k: int, workload: SimWorkload, *, report_cpu: bool = True
) -> TunerState:
    """Batch `k` of a simulated loader as a tuner reads it (`report_cpu=False`: the
    workers' CPU unmeasured, as a loader without CPU clocks)."""
    from predictors.state import TunerState

    return TunerState(
        batch_index=k,
        workers=r.workers,
        depth=r.depth,
        batch_size=workload.batch_size,
        step_ms=r.step_ms,
        stall_ms=r.stall_ms,
        read_ms=r.read_ms,
        decode_ms=r.decode_ms,
        bytes_per_batch=r.bytes_read,
        memory_bytes=r.memory_bytes,
        cpu_count=workload.cpu_count,
        batch_memory_bytes=r.batch_memory_bytes,
        rows_per_read=workload.rows_per_read,
        storage_latency_ms=workload.storage_latency_ms,
        storage_bandwidth_mbps=workload.storage_bandwidth_mbps,
        cpu_ms=r.cpu_ms if report_cpu else None,
        read_cpu_ms=workload.read_cpu_share * r.read_ms if report_cpu else None,
    )


def run_tuner(
    tuner: object,
    workload: SimWorkload,
    n_batches: int = 150,
    *,
    slowdown: tuple[int, int, float] | None = None,
    start: tuple[int, int] | None = None,
    seed: int = 0,
    report_cpu: bool = True,
) -> pd.DataFrame:
    """Drive `tuner` (anything with `decide(TunerState)`) on a simulated loader.

    `slowdown=(begin, end, factor)` multiplies storage time by `factor` for batches in
    [begin, end): the regime shift of the scenarios. `report_cpu=False` leaves the
    workers' CPU unmeasured (as a loader without CPU clocks would). Returns one row per batch with
    the measured utilization, the configuration and memory, and the decision's reason.
    """
    import pandas as pd

    start = start or getattr(tuner, "start", (2, 2))
    loader = SimulatedLoader(workload, *start, seed=seed)
    rows = []
    for k in range(n_batches):
        if slowdown is not None:
            loader.slowdown = slowdown[2] if slowdown[0] <= k < slowdown[1] else 1.0
        r = loader.next_batch()
        state = tuner_state(r, k, workload, report_cpu=report_cpu)
        decision = tuner.decide(state)  # type: ignore[attr-defined]
        if (decision.workers, decision.depth) != (loader.workers, loader.depth):
            loader.set_config(decision.workers, decision.depth)
        rows.append(
            {
                "batch": k,
                "utilization": state.utilization,
                "step_ms": r.step_ms,
                "stall_ms": r.stall_ms,
                "workers": r.workers,
                "depth": r.depth,
                "memory_bytes": r.memory_bytes,
                "bound_bytes": r.depth * r.batch_memory_bytes,
                "feasible": decision.feasible,
                "bottleneck": decision.bottleneck,
                "reason": decision.reason,
            }
        )
    return pd.DataFrame(rows)
