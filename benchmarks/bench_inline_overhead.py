"""Per-batch cost of the inline loader (`num_workers=0`) on cheap samples, against
torch's DataLoader: batches of 32 from `bench_cheap_samples`' int and getitems Datasets.

Each loader runs an epoch to warm up, then epochs alternate torch / iolib `repeats`
times; printed: ms a batch (medians), the median of the per-epoch ratios with their
spread, and the load average beside them. `--calls` also counts the Python calls a
batch (cProfile's total over an epoch / batches): a figure the machine's load does not
move, where the timings on a shared machine swing by 3x. `--cpu` times the epochs in
this process's CPU time (`time.process_time`) instead of wall time: less moved by other
processes on a busy machine. `--json` prints one JSON line (for bench_inline_ab.py).

    python benchmarks/bench_inline_overhead.py --repeats 5 --calls
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import click
from torch.utils.data import DataLoader as TorchDataLoader

import iolib

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cheap_samples import Ints, Table


def _ms_per_batch(kind: type, dataset, batch_size: int, clock=time.perf_counter) -> float:
    options = dict(batch_size=batch_size, shuffle=True, num_workers=0)
    if kind is iolib.DataLoader:
        options["seed"] = 0
    loader = kind(dataset, **options)
    list(loader)  # warm-up epoch
    start, batches = clock(), 0
    for _ in loader:
        batches += 1
    return (clock() - start) / batches * 1e3


def _calls_per_batch(kind: type, dataset, batch_size: int) -> float:
    options = dict(batch_size=batch_size, shuffle=True, num_workers=0)
    if kind is iolib.DataLoader:
        options["seed"] = 0
    loader = kind(dataset, **options)
    list(loader)  # warm-up epoch
    profile, batches = cProfile.Profile(), 0
    profile.enable()
    for _ in loader:
        batches += 1
    profile.disable()
    return sum(row[1] for row in pstats.Stats(profile).stats.values()) / batches


def _load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


@click.command()
@click.option("--repeats", default=5, show_default=True)
@click.option("--batch-size", default=32, show_default=True)
@click.option("--batches", default=1000, show_default=True)
@click.option("--calls", is_flag=True, help="Also count the Python calls a batch.")
@click.option("--cpu", is_flag=True, help="Time in process CPU time, not wall time.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line, not text.")
def main(
    repeats: int, batch_size: int, batches: int, calls: bool, cpu: bool, as_json: bool
) -> None:
    """ms a batch, torch and iolib, inline."""
    clock = time.process_time if cpu else time.perf_counter
    record = {"iolib": iolib.__file__, "clock": "cpu" if cpu else "wall"}
    for name, dataset in (("getitems", Table(batch_size * batches)),
                          ("int", Ints(batch_size * batches))):  # fmt: skip
        torch_ms, iolib_ms, loads = [], [], [_load()]
        for _ in range(repeats):
            torch_ms.append(_ms_per_batch(TorchDataLoader, dataset, batch_size, clock))
            iolib_ms.append(_ms_per_batch(iolib.DataLoader, dataset, batch_size, clock))
        ratios = [i / t for i, t in zip(iolib_ms, torch_ms, strict=True)]
        record[name] = {"torch_ms": torch_ms, "iolib_ms": iolib_ms, "ratios": ratios,
                        "load": [loads[0], _load()]}  # fmt: skip
        if not as_json:
            print(
                f"{name}: torch {statistics.median(torch_ms):.3f} ms/batch, iolib "
                f"{statistics.median(iolib_ms):.3f} ms/batch, ratio median "
                f"{statistics.median(ratios):.2f} (min {min(ratios):.2f} max {max(ratios):.2f}); "
                f"{loads[0]} -> {_load()}"
            )
        if calls:
            counts = [
                _calls_per_batch(k, dataset, batch_size)
                for k in (TorchDataLoader, iolib.DataLoader)
            ]
            record[name]["calls"] = counts
            if not as_json:
                print(f"{name}: Python calls a batch: torch {counts[0]:.1f}, iolib {counts[1]:.1f}")
    if as_json:
        print(json.dumps(record))


if __name__ == "__main__":
    main()
