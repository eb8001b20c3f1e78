"""What a tuner reads and returns, and what it derives from what it reads.

`TunerState` is one batch of the loader's telemetry as plain numbers, `Decision` the
configuration a tuner returns; `Tuner` and `PerformanceModel` are the two protocols.
`name_bottleneck` says which stage limits (storage, decode, transform, or
`cpu` when the workers' reads keep the cores busy). No decisions here: those are in
`predictors.tuner` (the queueing tuner) and `predictors.baselines`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from predictors.errors import TunerConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CPU_BUSY",
    "Decision",
    "PerformanceModel",
    "Tuner",
    "TunerState",
    "check_budget",
    "check_target",
    "cpu_share",
    "name_bottleneck",
    "stage_text",
]


@dataclass(frozen=True)
class TunerState:
    """Telemetry for one batch (or a short window), in milliseconds and bytes.

    Service times are per batch, as one worker spends them; `stall_ms` is how long the
    consumer waited for this batch; `memory_bytes` the bytes held in flight or ready.
    `storage_latency_ms` / `storage_bandwidth_mbps` come from the probe, if one ran;
    they split the measured read time between per-request latency and transfer.
    `epoch_start` marks the first batch of an iteration: the pipeline was empty, so it
    waits a whole service time whatever the configuration, and no configuration change
    would shorten that wait (the tuner leaves such batches out of what it judges).
    `cpu_ms` / `read_cpu_ms`: CPU the workers spent on the batch (all stages / the read),
    None when not measured; the rest of a stage's time is waiting, for storage or a core.
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
    epoch_start: bool = False
    cpu_ms: float | None = None
    read_cpu_ms: float | None = None

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


CPU_BUSY = 0.6


def cpu_share(m: dict[str, float], cpu_count: int) -> float | None:
    """Share of the cores the workers' CPU keeps busy at the measured batch rate (None:
    CPU not measured). `m`: per-batch step, stall and CPU, in ms."""
    cpu = m.get("cpu_ms")
    if cpu is None:
        return None
    batch_ms = max(m.get("batch_ms", m["step_ms"] + m["stall_ms"]), 1e-6)
    return cpu / batch_ms / max(cpu_count, 1)


def name_bottleneck(m: dict[str, float], cpu_count: int, cpu_bound: bool = False) -> str:
    """The limiting stage: the one taking the most time per batch ("storage" for reads),
    except when the workers keep the cores busy (`CPU_BUSY`) or the cores are what
    limits (`cpu_bound`): then the stage using the most CPU, and a read that is mostly
    CPU (parsing, copying) is "cpu", not storage: more workers would queue for cores."""
    stages = {"storage": m["read_ms"], "decode": m["decode_ms"], "transform": m["transform_ms"]}
    share = cpu_share(m, cpu_count)
    if share is None or (share < CPU_BUSY and not cpu_bound):
        return max(stages, key=stages.__getitem__)
    read_cpu = m.get("read_cpu_ms") or 0.0
    other_cpu = max(m["cpu_ms"] - read_cpu, 0.0)  # decode and transform
    if read_cpu >= other_cpu:
        return "cpu"
    return "decode" if m["decode_ms"] >= m["transform_ms"] else "transform"


def stage_text(m: dict[str, float]) -> str:
    """Per-batch stage times (and the workers' CPU, when measured) for reasons."""
    text = (
        f"per batch: storage {m['read_ms']:.1f} ms, decode {m['decode_ms']:.1f} ms, "
        f"transform {m['transform_ms']:.1f} ms, step {m['step_ms']:.1f} ms"
    )
    if m.get("cpu_ms") is not None:
        text += f", workers' CPU {m['cpu_ms']:.1f} ms"
    return text
