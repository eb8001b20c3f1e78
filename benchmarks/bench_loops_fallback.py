"""What the NumPy statement of the token loops costs a batch of packed windows, against
the compiled loops: the same epochs in subprocesses, one with IOLIB_NO_EXTENSION=1
(the choice is made once per process), legs interleaved.

A 9.3 M-token corpus (12,000 documents of 50-1,500 int32 tokens, row groups of 500
rows) that fits the default cache: after a first epoch that reads it, two timed epochs
of batch 16 x 2,048 windows, shuffled, at num_workers=0, so the time is the cut.

    python benchmarks/bench_loops_fallback.py --repeats 3

Writes benchmarks/results/loops-fallback.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

LEG = """
import json, sys, time
from iolib import DataLoader
from iolib.text import PackedTokens, kernels
windows = PackedTokens(sys.argv[1], column="t", seq_len=2048, eos_id=0, document_ids=True)
loader = DataLoader(windows, batch_size=16, shuffle=True, seed=0)
list(loader)  # the first epoch reads the corpus into the cache
start, batches = time.perf_counter(), 0
for epoch in (1, 2):
    loader.set_epoch(epoch)
    batches += sum(1 for _ in loader)
print(json.dumps({"kind": kernels.KIND, "ms": 1000 * (time.perf_counter() - start) / batches}))
"""


def _corpus(directory: Path) -> str:
    directory.mkdir()
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 1500, size=12_000)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(1, 50_000, size=int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"t": column}), directory / "a.parquet", row_group_size=500)
    return str(directory)


def _leg(url: str, cache: str, numpy_loops: bool) -> dict:
    env = {**os.environ, "IOLIB_CACHE_DIR": cache}
    env.pop("IOLIB_NO_EXTENSION", None)
    if numpy_loops:
        env["IOLIB_NO_EXTENSION"] = "1"
    run = subprocess.run([sys.executable, "-c", LEG, url], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--repeats", default=3, show_default=True)
@click.option("--out", default="benchmarks/results/loops-fallback.md", show_default=True)
def main(repeats: int, out: str) -> None:
    times: dict[str, list[float]] = {"compiled": [], "numpy": []}
    with tempfile.TemporaryDirectory() as tmp:
        url = _corpus(Path(tmp) / "corpus")
        loads = [os.getloadavg()[0]]
        for _ in range(repeats):
            for numpy_loops in (False, True):
                leg = _leg(url, f"{tmp}/cache", numpy_loops)
                times[leg["kind"]].append(leg["ms"])
        loads.append(os.getloadavg()[0])
    lines = [
        "# Token loops: compiled against their NumPy statement",
        "",
        f"`python benchmarks/bench_loops_fallback.py --repeats {repeats}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
        f"{min(loads):.1f}-{max(loads):.1f}). ms a batch of 16 x 2,048 windows, "
        "num_workers=0, corpus in the cache (the cut only):",
        "",
        "| loops | median ms a batch | runs |",
        "| --- | ---: | --- |",
    ]
    for kind, values in times.items():
        runs = ", ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {kind} | {statistics.median(values):.1f} | {runs} |")
    Path(out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
