"""The observation schema as code, its validation, and the first-principles rates.

One row of an observations table is one (configuration, repeat) measured by
`iolib bench`. Its columns fall in four kinds:

- features: measured cheaply *before* the run (probe of the data and the storage);
- config: the knobs the tuner chooses (workers, depth, shuffle, cache);
- outcomes: what the run measured (throughput, stall, memory);
- group and meta: who and where (workload, storage profile, machine, versions).

`QueueingModel` (predictors.baselines) predicts from these columns by the rates
below. The learned model's inputs and their leakage guard are research and live in
`benchmarks/tuner_lab/features.py`.

Units: bytes, milliseconds, and `storage_bandwidth_mbps` in megabytes (10⁶ bytes) per
second, the same unit as the `mb_per_s` outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictors.errors import SchemaError

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
