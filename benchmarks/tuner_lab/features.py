"""The learned model's input features and their leakage guard (the schema and its
validation are `predictors.observations`).

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

from predictors.errors import LeakageError
from predictors.observations import (
    CONFIG_COLUMNS,
    FEATURE_COLUMNS,
    GROUP_COLUMNS,
    META_COLUMNS,
    OUTCOME_COLUMNS,
    SCHEMA_VERSION,
    SHUFFLE_MODES,
    TARGET_COLUMNS,
    _col,
    active_workers,
    decode_ms_per_batch,
    producer_batches_per_s,
    queueing_batches_per_s,
    read_ms_per_batch,
    requests_per_batch,
    service_ms_per_batch,
    validate_observations,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CONFIG_COLUMNS",
    "DERIVED",
    "FEATURE_COLUMNS",
    "GROUP_COLUMNS",
    "INPUT_COLUMNS",
    "META_COLUMNS",
    "OUTCOME_COLUMNS",
    "SCHEMA_VERSION",
    "TARGET_COLUMNS",
    "Derived",
    "check_no_leakage",
    "extract_features",
    "group_labels",
    "queueing_batches_per_s",
    "requests_per_batch",
    "validate_observations",
]


@dataclass(frozen=True)
class Derived:
    """One model input: its name, the columns it reads, and how it is computed."""

    name: str
    sources: tuple[str, ...]
    compute: Callable[[pd.DataFrame], np.ndarray]


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
