"""Cheap probes measured before a run: the features the predictor may use.

They never look at a loader's outcome: bytes and decode cost come from a few samples,
latency and bandwidth from a handful of raw requests to the storage.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from iolib.cli.bench.datasets import decode_jpeg
from iolib.errors import DataError
from iolib.storage import open_filesystem


def probe_storage(
    url: str, storage_options: dict | None, *, reads: int = 16, small: int = 4096,
    large: int = 4 << 20, large_reads: int = 3,
) -> dict[str, float]:  # fmt: skip
    """Median first-byte latency (ms) of `reads` small reads at distinct offsets of the
    object `url`, and bandwidth (MB/s) from `large_reads` reads of up to `large` bytes
    (bytes / (median time - median latency)): medians, because storage latency has tails."""
    options = {k: dict(v) if isinstance(v, dict) else v for k, v in (storage_options or {}).items()}
    fs, path = open_filesystem(url, options)
    size = fs.size(path)
    step = max(small, (size - small) // max(reads, 1))
    times = []
    for k in range(reads):
        start = min(k * step, max(size - small, 0))
        t0 = time.perf_counter()
        fs.cat_file(path, start=start, end=start + small)
        times.append(time.perf_counter() - t0)
    latency = statistics.median(times)
    nbytes = min(size, large)
    spans = []
    for k in range(large_reads):
        start = (k * nbytes) % max(size - nbytes + 1, 1)
        t0 = time.perf_counter()
        fs.cat_file(path, start=start, end=start + nbytes)
        spans.append(time.perf_counter() - t0)
    elapsed = statistics.median(spans)
    transfer = elapsed - latency if elapsed > 2 * latency else elapsed
    return {
        "storage_latency_ms": latency * 1000.0,
        "storage_bandwidth_mbps": nbytes / max(transfer, 1e-9) / 1e6,
    }


def check_images(samples: list[Any], column: str, where: str) -> None:
    """Refuse a column whose first values are not encoded images (a binary column of
    something else), naming the file, the column and the sample, before any loader runs."""
    from iolib.decode.probe import DEFAULT_MAX_IMAGE_PIXELS, BadImage, probe

    for row, value in enumerate(samples):
        try:
            probe(value, DEFAULT_MAX_IMAGE_PIXELS)
        except BadImage as exc:
            raise DataError(
                f"Row {row} of {where}, column {column!r}, is not an image: {exc}. The images "
                "workload decodes that column (JPEG, PNG, ...): pick --workload tokens, "
                "--no-decode (reads only), or a dataset of encoded images."
            ) from None


def probe_decode(samples: list[Any], kind: str, decode: bool) -> float:
    """CPU ms to turn one stored sample into what the batch holds (process time)."""
    import numpy as np

    if not samples:
        return 0.0
    t0 = time.process_time()
    for value in samples:
        if kind == "images" and decode:
            decode_jpeg(value)
        elif kind == "tokens":
            np.asarray(value if value is not None else [], dtype=np.int32)  # null: no token
    return (time.process_time() - t0) * 1000.0 / len(samples)


def first_samples(url: str, storage_options: dict | None, column: str, n: int = 32) -> list:
    """The first `n` values of `column` in the Parquet object `url` (for the decode probe)."""
    import pyarrow.parquet as pq

    fs, path = open_filesystem(url, storage_options)
    with fs.open(path, "rb") as f:
        # pre_buffer=False: see iolib.sources.parquet_fetch.RowGroupFetcher._read.
        table = pq.ParquetFile(f, pre_buffer=False).read_row_group(0, columns=[column])
    col = table.column(0).slice(0, n)
    return [v.as_py() for v in col]
