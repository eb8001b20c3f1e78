"""Inline overhead, two checkouts side by side: `bench_inline_overhead.py` run in turns
(before, after, before, ...) in fresh processes with PYTHONPATH pointing at each
checkout's root, so both legs meet the same machine load. Printed per leg and Dataset:
the median over its runs of the per-epoch iolib / torch ratio, with the runs' medians
and the load.

    python benchmarks/bench_inline_ab.py --before /path/to/main --rounds 5
    python benchmarks/bench_inline_ab.py --before /path/to/main --rounds 5 --cpu
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent


def _leg(root: Path, repeats: int, batches: int, cpu: bool) -> dict:
    command = [sys.executable, str(HERE / "bench_inline_overhead.py"), "--json",
               "--repeats", str(repeats), "--batches", str(batches)]  # fmt: skip
    if cpu:
        command.append("--cpu")
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    record = json.loads(out.strip().splitlines()[-1])
    if not record["iolib"].startswith(str(root)):
        raise click.ClickException(f"iolib came from {record['iolib']}, not {root}")
    return record


@click.command()
@click.option(
    "--before",
    type=click.Path(exists=True, file_okay=False),
    required=True,
    help="Root of the checkout to compare against (e.g. main's).",
)
@click.option(
    "--after",
    type=click.Path(exists=True, file_okay=False),
    default=str(HERE.parent),
    show_default=True,
)
@click.option("--rounds", default=5, show_default=True)
@click.option("--repeats", default=3, show_default=True, help="Epoch pairs a run.")
@click.option("--batches", default=1000, show_default=True)
@click.option("--cpu", is_flag=True, help="Time in process CPU time, not wall time.")
def main(before: str, after: str, rounds: int, repeats: int, batches: int, cpu: bool) -> None:
    """Interleaved before/after legs of bench_inline_overhead.py."""
    legs = {"before": Path(before).resolve(), "after": Path(after).resolve()}
    runs: dict[str, list[dict]] = {leg: [] for leg in legs}
    for _ in range(rounds):
        for leg, root in legs.items():
            runs[leg].append(_leg(root, repeats, batches, cpu))
    print(f"clock {'cpu' if cpu else 'wall'}; {rounds} rounds x {repeats} epoch pairs")
    for name in ("getitems", "int"):
        for leg in legs:
            records = [run[name] for run in runs[leg]]
            ratios = [r for rec in records for r in rec["ratios"]]
            torch_ms = statistics.median(m for rec in records for m in rec["torch_ms"])
            iolib_ms = statistics.median(m for rec in records for m in rec["iolib_ms"])
            per_run = ", ".join(f"{statistics.median(rec['ratios']):.2f}" for rec in records)
            loads = ", ".join(rec["load"][0].split()[-1] for rec in records)
            print(f"{name} {leg:6s}: torch {torch_ms:.4f} ms/batch, iolib {iolib_ms:.4f}, "
                  f"ratio median {statistics.median(ratios):.3f} (min {min(ratios):.2f} "
                  f"max {max(ratios):.2f}); per run {per_run}; load {loads}")  # fmt: skip


if __name__ == "__main__":
    main()
