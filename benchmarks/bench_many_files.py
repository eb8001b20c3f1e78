"""Many small Parquet files on a store with 40 ms a request: how long a loader takes to
start (`len(source)`: listing and every file's row counts) with and without the
directory's `_metadata` summary (`iolib index`), and to its first batch.

    python benchmarks/bench_many_files.py --files 10000 --latency-ms 40

Writes benchmarks/results/many-files.md.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from iolib import DataLoader
from iolib.sources import ParquetSource
from iolib.sources.summary import write_summary
from iolib.storage import open_filesystem, wrap_url

RESULTS = Path(__file__).resolve().parent / "results"


def _source(directory: Path, latency_ms: float) -> ParquetSource:
    url, options = wrap_url(f"file://{directory}", None, "throttled", {"latency_ms": latency_ms})
    return ParquetSource(url, storage_options=options)


@click.command()
@click.option("--files", default=10_000, show_default=True, help="Parquet files to write.")
@click.option("--latency-ms", default=40.0, show_default=True, help="Time to first byte.")
def main(files: int, latency_ms: float) -> None:
    """Start-up time of a dataset of many files, with and without _metadata."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "many"
        directory.mkdir()
        for f in tqdm(range(files), desc="writing"):
            table = pa.table({"id": np.arange(f * 10, f * 10 + 10), "x": np.zeros(10)})
            pq.write_table(table, directory / f"part-{f:06d}.parquet")
        for label in ("footers", "_metadata"):
            if label == "_metadata":
                fs, path = open_filesystem(str(directory))
                write_summary(fs, path, sorted(str(p) for p in directory.glob("*.parquet")))
            source = _source(directory, latency_ms)
            start = time.perf_counter()
            count = len(source)
            started = time.perf_counter() - start
            loader = DataLoader(source, batch_size=64, shuffle=True, seed=0, num_workers=2)
            next(iter(loader))
            first = time.perf_counter() - start
            assert count == 10 * files
            rows.append((label, started, first))
    lines = [
        "# Many files on a 40 ms store",
        "",
        f"`python benchmarks/bench_many_files.py --files {files} --latency-ms {latency_ms:g}`: "
        f"{files} Parquet files of 10 rows each behind `throttled::` ({latency_ms:g} ms to "
        "first byte a request, listings included).",
        "",
        "| row counts from | len(source) (s) | first batch (s) |",
        "| --- | --- | --- |",
    ]
    for label, started, first in rows:
        what = "every footer (64 in flight)" if label == "footers" else "the _metadata summary"
        lines.append(f"| {what} | {started:.1f} | {first:.1f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "many-files.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
