"""Warm against cold `prefetch="auto"` runs on a real loader, counted in batches.

A map-style dataset whose reads sleep (storage-like waits, thread workers) and a training
loop whose step sleeps. Each repeat uses a fresh history: run 1 is cold (it records),
runs 2-3 are warm. Per run: the batch from which the consumer's utilization over the next
8 batches first reaches the target (batches to target), the utilization over the run's
last third, and the memory the run settled on (depth x batch bytes). Cold and warm runs
alternate within a repeat, so the machine's load falls on both alike.

    python benchmarks/history_warm.py --repeats 5 --out benchmarks/results/history-warm.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from iolib import DataLoader

TARGET = 0.9


class SlowReads(torch.utils.data.Dataset):
    def __init__(self, n: int = 480, read_s: float = 0.006) -> None:
        self.n, self.read_s = n, read_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.read_s)
        return torch.full((256,), i, dtype=torch.float32)


def one_run(history: str, step_s: float) -> dict[str, float]:
    loader = DataLoader(
        SlowReads(), batch_size=4, shuffle=True, seed=0, num_workers=8, worker_mode="thread",
        prefetch="auto", target_utilization=TARGET, history=history,
    )  # fmt: skip
    waits, steps = [], []
    asked = time.perf_counter()
    for _ in loader:
        got = time.perf_counter()
        waits.append(got - asked)
        time.sleep(step_s)
        asked = time.perf_counter()
        steps.append(asked - got)
    loader.close()
    stats = loader.stats()
    utils = [s / (s + w) for s, w in zip(steps, waits, strict=True)]
    reached = next(
        (b for b in range(1, len(utils) - 8) if statistics.fmean(utils[b : b + 8]) >= TARGET),
        len(utils),
    )
    third = len(utils) * 2 // 3
    last = sum(steps[third:]) / (sum(steps[third:]) + sum(waits[third:]))
    history_report = stats["tuner"]["history"] or {}
    return {
        "to_target": reached,
        "last_third": last,
        "memory": stats["depth"] * stats["batch_bytes"],
        "warm": bool(history_report.get("started_from")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as history:
            cold.append(one_run(history, args.step_ms / 1e3))
            for _ in range(2):
                warm.append(one_run(history, args.step_ms / 1e3))

    def summary(runs: list[dict[str, float]], name: str) -> str:
        to = [r["to_target"] for r in runs]
        util = [r["last_third"] for r in runs]
        mem = [r["memory"] for r in runs]
        return (
            f"| {name} | {len(runs)} | {statistics.median(to):.0f} ({min(to)}-{max(to)}) | "
            f"{statistics.median(util):.3f} ({min(util):.3f}-{max(util):.3f}) | "
            f"{statistics.median(mem) / 1024:.0f} KiB | {sum(r['warm'] for r in runs)} |"
        )

    load = os.getloadavg()
    lines = [
        f"Target {TARGET}, step {args.step_ms:g} ms, batch 4, reads 4 x 6 ms, 8 thread "
        f"workers at most, 120 batches a run; load average {load[0]:.1f} on "
        f"{os.cpu_count()} CPUs.",
        "",
        "| runs | n | batches to target: median (range) | utilization, last third | "
        "memory settled (median) | warm starts |",
        "| --- | --- | --- | --- | --- | --- |",
        summary(cold, "cold (run 1)"),
        summary(warm, "warm (runs 2-3)"),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(
            '# Warm against cold prefetch="auto" runs\n\n'
            f"`python benchmarks/history_warm.py --repeats {args.repeats}`\n\n{text}\n"
        )


if __name__ == "__main__":
    main()
