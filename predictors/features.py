"""The observation schema as code, its validation, and the model's input features.

One row of an observations table is one (configuration, repeat) measured by
`iolib bench`. Its columns fall in four kinds, and only two of them may feed a model:

- features: measured cheaply *before* the run (probe of the data and the storage);
- config: the knobs the tuner chooses (workers, depth, shuffle, cache);
- outcomes: what the run measured (throughput, stall, memory): never an input;
- group and meta: who and where (workload, storage profile, machine, versions).

Every derived input declares the columns it is computed from, and
`check_no_leakage` refuses any input that is, or comes from, an outcome. A published
I/O predictor reached R² 0.99 only because measured throughput was among its inputs;
without it its error was 48-88 %. The guard exists so that cannot happen here.

Units: bytes, milliseconds, and `storage_bandwidth_mbps` in megabytes (10⁶ bytes) per
second, the same unit as the `mb_per_s` outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from predictors.errors import LeakageError, SchemaError

if TYPE_CHECKING:
    import pandas as pd

SCHEMA_VERSION = 1

GROUP_COLUMNS: tuple[str, ...] = ("workload", "storage_profile")
META_COLUMNS: tuple[str, ...] = (
    "loader",
    "run_id",
    "repeat",
    "timestamp",
    "machine",
    "versions",
    "command",
)
FEATURE_COLUMNS: tuple[str, ...] = (
    "bytes_per_sample",
    "decode_ms_per_sample",
    "storage_latency_ms",
    "storage_bandwidth_mbps",
    "batch_size",
    "step_ms",
    "rows_per_read",
    "cpu_count",
)
CONFIG_COLUMNS: tuple[str, ...] = ("workers", "depth", "shuffle", "cache")
OUTCOME_COLUMNS: tuple[str, ...] = (
    "throughput_sps",
    "mb_per_s",
    "stall_fraction",
    "utilization",
    "p50_batch_ms",
    "p99_batch_ms",
    "first_batch_s",
    "peak_rss_bytes",
    "memory_bytes",
    "cpu_percent",
)
# The outcomes a model is trained on; the others are kept for reports only.
TARGET_COLUMNS: tuple[str, ...] = ("throughput_sps", "stall_fraction", "memory_bytes")
SHUFFLE_MODES: tuple[str, ...] = ("none", "block", "global")

# Columns whose values must be > 0 (a zero latency or bandwidth is a broken probe).
_POSITIVE = (
    "bytes_per_sample",
    "storage_bandwidth_mbps",
    "batch_size",
    "step_ms",
    "rows_per_read",
    "cpu_count",
    "workers",
    "depth",
)
_NON_NEGATIVE = ("decode_ms_per_sample", "storage_latency_ms")


@dataclass(frozen=True)
class Derived:
    """One model input: its name, the columns it reads, and how it is computed."""

    name: str
    sources: tuple[str, ...]
    compute: Callable[[pd.DataFrame], np.ndarray]


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    return frame[name].to_numpy(dtype=float)


def requests_per_batch(frame: pd.DataFrame) -> np.ndarray:
    """Storage requests to assemble one batch: ceil(batch_size / rows_per_read)."""
    return np.ceil(_col(frame, "batch_size") / _col(frame, "rows_per_read"))


def read_ms_per_batch(frame: pd.DataFrame) -> np.ndarray:
    """One worker's storage time per batch: latency per request plus bytes over bandwidth."""
    batch_bytes = _col(frame, "bytes_per_sample") * _col(frame, "batch_size")
    transfer_ms = batch_bytes / (_col(frame, "storage_bandwidth_mbps") * 1e3)
    return _col(frame, "storage_latency_ms") * requests_per_batch(frame) + transfer_ms


def decode_ms_per_batch(frame: pd.DataFrame) -> np.ndarray:
    """One worker's CPU time per batch for decode and transforms."""
    return _col(frame, "decode_ms_per_sample") * _col(frame, "batch_size")


def service_ms_per_batch(frame: pd.DataFrame) -> np.ndarray:
    """Per-batch service time of one worker: storage time plus decode time."""
    return read_ms_per_batch(frame) + decode_ms_per_batch(frame)


def active_workers(frame: pd.DataFrame) -> np.ndarray:
    """Workers that can be busy at once: a worker needs a free slot of the `depth` budget."""
    return np.minimum(_col(frame, "workers"), _col(frame, "depth"))


def producer_batches_per_s(frame: pd.DataFrame) -> np.ndarray:
    """Batches per second the loader could make, consumer aside (the queueing model)."""
    service = service_ms_per_batch(frame)
    active = active_workers(frame)
    by_workers = active * 1e3 / service
    decode = decode_ms_per_batch(frame)
    by_cpu = np.where(decode > 0, _col(frame, "cpu_count") * 1e3 / np.maximum(decode, 1e-9), np.inf)
    batch_mb = _col(frame, "bytes_per_sample") * _col(frame, "batch_size") / 1e6
    by_storage = _col(frame, "storage_bandwidth_mbps") / batch_mb
    return np.minimum.reduce([by_workers, by_cpu, by_storage])


def queueing_batches_per_s(frame: pd.DataFrame) -> np.ndarray:
    """The queueing model's batch rate (see `predictors.baselines.QueueingModel`)."""
    return np.minimum(producer_batches_per_s(frame), 1e3 / _col(frame, "step_ms"))


def _log(fn: Callable[[pd.DataFrame], np.ndarray]) -> Callable[[pd.DataFrame], np.ndarray]:
    return lambda frame: np.log1p(np.maximum(fn(frame), 0.0))


_F = FEATURE_COLUMNS
_BW = ("bytes_per_sample", "storage_bandwidth_mbps", "batch_size")
_READ = ("storage_latency_ms", "rows_per_read", *_BW)
_DECODE = ("decode_ms_per_sample", "batch_size")
_ACTIVE = ("workers", "depth")
_QUEUE = (*_READ, "decode_ms_per_sample", *_ACTIVE, "cpu_count", "step_ms")

DERIVED: tuple[Derived, ...] = (
    *(Derived(f"log_{name}", (name,), _log(lambda f, n=name: _col(f, n))) for name in _F),
    Derived("log_workers", ("workers",), _log(lambda f: _col(f, "workers"))),
    Derived("log_depth", ("depth",), _log(lambda f: _col(f, "depth"))),
    Derived("depth_per_worker", _ACTIVE, lambda f: _col(f, "depth") / _col(f, "workers")),
    Derived("cache", ("cache",), lambda f: f["cache"].astype(bool).to_numpy(dtype=float)),
    *(
        Derived(
            f"shuffle_{mode}", ("shuffle",), lambda f, m=mode: (f["shuffle"] == m).to_numpy(float)
        )
        for mode in SHUFFLE_MODES
    ),
    Derived("log_read_ms_per_batch", _READ, _log(read_ms_per_batch)),
    Derived("log_decode_ms_per_batch", _DECODE, _log(decode_ms_per_batch)),
    Derived(
        "log_service_ms_per_batch", (*_READ, "decode_ms_per_sample"), _log(service_ms_per_batch)
    ),
    Derived(
        "read_share",
        (*_READ, "decode_ms_per_sample"),
        lambda f: read_ms_per_batch(f) / np.maximum(service_ms_per_batch(f), 1e-9),
    ),
    Derived(
        "cpu_pressure",
        (*_ACTIVE, "cpu_count"),
        lambda f: active_workers(f) / _col(f, "cpu_count"),
    ),
    Derived(
        "log_load_ratio",
        (*_READ, "decode_ms_per_sample", *_ACTIVE, "step_ms"),
        lambda f: np.log(service_ms_per_batch(f) / (_col(f, "step_ms") * active_workers(f))),
    ),
    Derived(
        "log_producer_headroom",  # > 0: the loader could outrun the consumer, by this much
        _QUEUE,
        lambda f: np.log(producer_batches_per_s(f) * _col(f, "step_ms") / 1e3),
    ),
)

INPUT_COLUMNS: tuple[str, ...] = tuple(d.name for d in DERIVED)


def check_no_leakage(derived: Iterable[Derived] = DERIVED) -> None:
    """Raise LeakageError if any model input is an outcome or is computed from one.

    Allowed sources are the feature and config columns only; an unknown source is
    refused too, since a column the schema does not classify could be an outcome.
    """
    allowed = set(FEATURE_COLUMNS) | set(CONFIG_COLUMNS)
    for item in derived:
        bad_name = item.name in OUTCOME_COLUMNS
        leaked = [s for s in item.sources if s in OUTCOME_COLUMNS]
        unknown = [s for s in item.sources if s not in allowed and s not in OUTCOME_COLUMNS]
        if bad_name or leaked:
            raise LeakageError(
                f"Model input `{item.name}` is, or is computed from, an outcome "
                f"({sorted(leaked) or item.name}). Outcomes are what the model predicts; as "
                "inputs they make cross-validation meaningless. Fix: compute it from feature "
                f"and config columns only: {sorted(allowed)}."
            )
        if unknown:
            raise LeakageError(
                f"Model input `{item.name}` reads columns the schema does not classify: "
                f"{sorted(unknown)}. Fix: add them to FEATURE_COLUMNS (measured before the run) "
                "or drop them."
            )


def validate_observations(frame: pd.DataFrame, *, require_outcomes: bool = True) -> pd.DataFrame:
    """Check an observations table against the schema; return it (unchanged) if it fits.

    `require_outcomes=False` validates candidate rows to predict (no outcomes yet).
    """
    required = [*FEATURE_COLUMNS, *CONFIG_COLUMNS]
    if require_outcomes:
        required += [*GROUP_COLUMNS, *TARGET_COLUMNS]
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise SchemaError(
            f"Observations are missing columns {missing} (schema version {SCHEMA_VERSION}). "
            "Fix: produce them with `iolib bench --out DIR` (or `--sweep`), which writes every "
            "column, or add them; see docs/tuning.md for the schema."
        )
    if len(frame) == 0:
        raise SchemaError("Observations are empty. Fix: pass a file with at least one run.")
    numeric = [c for c in required if c not in (*GROUP_COLUMNS, "shuffle", "cache")]
    for name in numeric:
        values = np.asarray(frame[name].to_numpy(), dtype=float)
        if not np.all(np.isfinite(values)):
            bad = int((~np.isfinite(values)).sum())
            raise SchemaError(
                f"Column `{name}` has missing or infinite values in {bad} rows. "
                "Fix: drop those runs or measure them again."
            )
        rule = ">" if name in _POSITIVE else ">=" if name in _NON_NEGATIVE else None
        if rule and np.any(values <= 0 if rule == ">" else values < 0):
            raise SchemaError(
                f"Column `{name}` must be {rule} 0. Found: {float(values.min())!r}. "
                "Fix: check the probe or the configuration that produced it."
            )
    bad_shuffle = sorted(set(frame["shuffle"].astype(str)) - set(SHUFFLE_MODES))
    if bad_shuffle:
        raise SchemaError(
            f"Column `shuffle` must be one of {list(SHUFFLE_MODES)}. Found: {bad_shuffle}."
        )
    return frame


def extract_features(frame: pd.DataFrame) -> pd.DataFrame:
    """The model's input matrix, computed from feature and config columns only.

    Outcome columns, if present, are never read: `check_no_leakage` runs first.
    """
    import pandas as pd

    check_no_leakage(DERIVED)
    validate_observations(frame, require_outcomes=False)
    visible = frame[[*FEATURE_COLUMNS, *CONFIG_COLUMNS]]
    return pd.DataFrame({d.name: d.compute(visible) for d in DERIVED}, index=frame.index)


def group_labels(frame: pd.DataFrame) -> np.ndarray:
    """One label per row, "workload/storage_profile": the unit of grouped cross-validation."""
    return (frame["workload"].astype(str) + "/" + frame["storage_profile"].astype(str)).to_numpy()
