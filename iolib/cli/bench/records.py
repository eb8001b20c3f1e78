"""The observation record: one row per (configuration, repeat), written as Parquet.

The schema (predictors/observations.py) and the lab's model code against these names;
docs/benchmarks.md documents every column. Three groups, kept apart so that no outcome
becomes a feature: META (who, where, when), FEATURES (measured by cheap probes before the run) plus
CONFIG (what was chosen), and OUTCOMES (what the run measured).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from typing import Any

SCHEMA_VERSION = 1

# name -> (pyarrow type name, description)
META: dict[str, tuple[str, str]] = {
    "workload": ("string", "workload name, e.g. images-256, tokens-2048"),
    "storage_profile": ("string", "local, memory, nvme, nas, object-store, custom, s3..."),
    "loader": ("string", "iolib or torch"),
    "run_id": ("string", "one id per `iolib bench` invocation"),
    "config_id": ("string", "one id per configuration within a run (repeats share it)"),
    "repeat": ("int64", "0-based repeat index"),
    "timestamp": ("string", "UTC ISO-8601 time the configuration started"),
    "machine": ("string", "cpu count and model, OS"),
    "versions": ("string", "JSON: python, iolib, torch, pyarrow, fsspec, numpy"),
    "command": ("string", "the command line that produced the row"),
    "schema_version": ("int64", "version of this schema"),
}
FEATURES: dict[str, tuple[str, str]] = {
    "bytes_per_sample": ("float64", "stored bytes per sample in the layout this loader reads"),
    "decode_ms_per_sample": ("float64", "CPU ms to decode/convert one sample (probe)"),
    "storage_latency_ms": ("float64", "median first-byte latency of small probe reads"),
    "storage_bandwidth_mbps": ("float64", "MB/s (10^6 B/s) of one large probe read"),
    "batch_size": ("int64", "samples per batch"),
    "step_ms": ("float64", "simulated training step per batch, ms"),
    "rows_per_read": ("int64", "samples one storage request returns (row group or 1)"),
    "cpu_count": ("int64", "logical CPUs of the machine"),
}
CONFIG: dict[str, tuple[str, str]] = {
    "workers": ("int64", "worker threads (iolib) or processes (torch); 0 = in-line"),
    "depth": ("int64", "batches in flight or ready (torch: prefetch_factor x workers)"),
    "shuffle": ("string", "none, block or global (torch: none or global)"),
    "cache": ("bool", "local disk cache of remote shards on"),
}
OUTCOMES: dict[str, tuple[str, str]] = {
    "throughput_sps": ("float64", "samples/s after the first batch"),
    "mb_per_s": ("float64", "throughput x bytes_per_sample / 10^6"),
    "stall_fraction": ("float64", "time waiting in next() / elapsed, after the first batch"),
    "utilization": ("float64", "step / (step + stall), after the first batch"),
    "p50_batch_ms": ("float64", "median wait in next() per batch, ms"),
    "p99_batch_ms": ("float64", "99th percentile wait in next() per batch, ms"),
    "first_batch_s": ("float64", "iterator creation to the first batch, s"),
    "peak_rss_bytes": ("int64", "peak RSS summed over the process and its workers"),
    "tree_read_bytes": (
        "int64",
        "bytes the process and its workers read through read calls (/proc rchar; -1 unknown)",
    ),
    "memory_bytes": (
        "int64",
        "peak bytes held in flight by the loader (torch: max(depth,1) x mean batch bytes)",
    ),
    "cpu_percent": ("float64", "CPU time of the process tree / wall time x 100"),
    "batches": ("int64", "batches measured (after the first)"),
    "batch_bytes": ("float64", "mean bytes of a delivered batch"),
    "bytes_read": ("int64", "bytes the loader read from storage (iolib stats; -1 unknown)"),
    "retries": ("int64", "storage retries (iolib stats; -1 unknown)"),
    "complete": ("bool", "false when Ctrl-C cut the configuration short"),
}
SCHEMA: dict[str, tuple[str, str]] = {**META, **FEATURES, **CONFIG, **OUTCOMES}


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {cpu}, {platform.system()} {platform.release()}"


def versions() -> str:
    import fsspec
    import numpy
    import pyarrow
    import torch

    import iolib

    return json.dumps(
        {
            "python": sys.version.split()[0],
            "iolib": iolib.__version__,
            "torch": torch.__version__,
            "pyarrow": pyarrow.__version__,
            "fsspec": fsspec.__version__,
            "numpy": numpy.__version__,
        },
        sort_keys=True,
    )


def arrow_type(name: str):
    """The pyarrow type of a SCHEMA type name ("bool" is pyarrow's bool_)."""
    import pyarrow as pa

    return pa.bool_() if name == "bool" else getattr(pa, name)()


def to_table(rows: list[dict[str, Any]]):
    """Rows -> pyarrow Table with exactly SCHEMA's columns and types (missing -> null)."""
    import pyarrow as pa

    fields = [pa.field(name, arrow_type(typ)) for name, (typ, _) in SCHEMA.items()]
    schema = pa.schema(fields, metadata={"iolib.schema_version": str(SCHEMA_VERSION)})
    columns = {name: [row.get(name) for row in rows] for name in SCHEMA}
    return pa.table(columns, schema=schema)


def write_observations(rows: list[dict[str, Any]], out_dir: str, *, stem: str = "observations"):
    """Write `rows` as `<stem>.parquet` (and `<stem>.json` when there are few) in `out_dir`."""
    import pyarrow.parquet as pq

    from iolib.base.redact import redact_text

    # Defence in depth: BenchSpec already redacts its command line.
    rows = [
        {**row, "command": redact_text(row["command"])} if row.get("command") else row
        for row in rows
    ]
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{stem}.parquet")
    tmp = path + ".partial"
    pq.write_table(to_table(rows), tmp)
    os.replace(tmp, path)
    paths = [path]
    if len(rows) <= 64:
        jpath = os.path.join(out_dir, f"{stem}.json")
        with open(jpath, "w") as f:
            json.dump({"schema_version": SCHEMA_VERSION, "rows": rows}, f, indent=1, default=str)
        paths.append(jpath)
    return paths


def read_observations(path: str):
    """Read observations (Parquet) as a pandas DataFrame; check the columns are all there."""
    import pyarrow.parquet as pq

    from iolib.errors import ConfigError

    table = pq.read_table(path)
    missing = [c for c in SCHEMA if c not in table.column_names]
    if missing:
        raise ConfigError(
            f"{path} lacks observation columns {missing}. Fix: rerun `iolib bench --out`."
        )
    return table.to_pandas()
