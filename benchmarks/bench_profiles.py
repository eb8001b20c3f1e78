"""iolib against torch's DataLoader on the local, nas and object-store profiles, for
images and tokens: writes benchmarks/results/profiles.md, observations and PNGs.

Run on a quiet machine (one command):

    python benchmarks/bench_profiles.py            # about 10 minutes on 2 cores

It is `iolib bench` with a fixed grid, so every figure can be reproduced one by one.
"""

from __future__ import annotations

import os
import sys

from iolib.cli import main

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results", "profiles")
# --step-ms 0: the loaders flat out (bench's default, a 40 ms step, makes both step-bound).
ARGS = [
    "bench", "--workload", "images,tokens", "--profile", "local,nas,object-store",
    "--samples", "2048", "--batch-size", "64", "--workers", "4", "--depth", "8",
    "--batches", "30", "--repeats", "3", "--max-seconds", "60", "--seed", "0",
    "--step-ms", "0", "--out", OUT, "--plot",
]  # fmt: skip


def write_markdown() -> None:
    from iolib.cli.bench.display import LEGEND, summary_table
    from iolib.cli.bench.records import read_observations

    rows = read_observations(os.path.join(OUT, "observations.parquet")).to_dict("records")
    with open(os.path.join(HERE, "results", "profiles.md"), "w") as f:
        f.write("# iolib vs torch DataLoader by storage profile\n\n")
        f.write(f"Command: `python benchmarks/bench_profiles.py` (= `iolib {' '.join(ARGS)}`)\n\n")
        f.write(f"Machine: {rows[0]['machine']}\n\n```\n{summary_table(rows)}\n```\n\n{LEGEND}\n")


if __name__ == "__main__":
    if sys.argv[1:]:  # a fixed grid: --help (or anything) must not start 10 minutes of runs
        sys.exit(f"{__doc__}\nTakes no arguments; the grid is `iolib {' '.join(ARGS)}`.")
    try:
        main(ARGS)
    except SystemExit as exc:
        if exc.code:
            sys.exit(exc.code)
    write_markdown()
