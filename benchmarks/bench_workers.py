"""Process workers against torch's, at equal workers, on map-style Datasets.

The drop-in case: a script keeps its torch Dataset and changes the import line. Two
Dataset shapes, each timed with a short training step (the consumer sleeps `--step-ms`
per batch, as a GPU step would keep it busy):
  storage: each sample waits `--read-ms` (remote storage latency), almost no CPU.
  cpu: each sample does Python and torch work (a small normalisation and sum, about
    as much CPU as a light image transform), no waiting.
Both loaders run with process workers, `num_workers` equal, persistent workers, the
same batch size; they take turns epoch by epoch, after a warm-up epoch each. Reported:
samples/s, and the share of the time the step was busy (step / (step + wait)), as
medians over `--repeats`; the ratio iolib / torch is per repeat, then the median.

    python benchmarks/bench_workers.py --workers 6 --repeats 5
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import click
import torch
from torch.utils.data import Dataset

import iolib

RESULTS = Path(__file__).parent / "results"


class StorageBound(Dataset):
    """Waits like a remote read; the sample is small."""

    def __init__(self, size: int, read_ms: float) -> None:
        self.size, self.read_s = size, read_ms / 1e3

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.read_s)
        return torch.full((64,), float(index)), index % 10


class CpuBound(Dataset):
    """Python and torch work per sample, no waiting."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = torch.arange(3 * 32 * 32, dtype=torch.float32).view(3, 32, 32) + index
        total = 0.0
        for value in range(300):  # a transform's worth of Python
            total += value * 0.5
        x = (x - x.mean()) / (x.std() + 1e-6) + total * 0.0
        return x, index % 10


def timed_epoch(loader, step_s: float) -> tuple[float, float]:
    """(samples/s, busy share of the step) over one epoch."""
    samples, waited, stepped = 0, 0.0, 0.0
    start = time.perf_counter()
    iterator = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            x, _ = next(iterator)
        except StopIteration:
            break
        t1 = time.perf_counter()
        waited += t1 - t0
        if step_s:
            time.sleep(step_s)
        stepped += time.perf_counter() - t1
        samples += len(x)
    elapsed = time.perf_counter() - start
    return samples / elapsed, stepped / max(stepped + waited, 1e-9)


def compare(dataset: Dataset, args: SimpleNamespace) -> dict:
    options = dict(
        batch_size=args.batch_size,
        num_workers=args.workers,
        persistent_workers=True,
        shuffle=True,
    )
    loaders = {
        "torch": torch.utils.data.DataLoader(dataset, **options),
        "iolib": iolib.DataLoader(dataset, worker_mode="process", **options),
    }
    step_s = args.step_ms / 1e3
    for loader in loaders.values():
        timed_epoch(loader, step_s)  # warm-up: workers started
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    for _ in range(args.repeats):
        for name, loader in loaders.items():
            runs[name].append(timed_epoch(loader, step_s))
    for loader in loaders.values():
        if hasattr(loader, "close"):
            loader.close()
    del loaders
    ratios = [i[0] / t[0] for i, t in zip(runs["iolib"], runs["torch"], strict=True)]
    return {
        name: {
            "samples_per_s": statistics.median(r[0] for r in rs),
            "busy": statistics.median(r[1] for r in rs),
            "samples_per_s_range": [min(r[0] for r in rs), max(r[0] for r in rs)],
        }
        for name, rs in runs.items()
    } | {"ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}


@click.command(help=__doc__.split("\n")[0])
@click.option("--workers", type=int, default=6, help="num_workers for both (6)")
@click.option("--batch-size", type=int, default=32, help="samples a batch (32)")
@click.option("--samples", type=int, default=1536, help="samples an epoch (1536)")
@click.option("--read-ms", type=float, default=4.0, help="storage wait a sample (4)")
@click.option("--step-ms", type=float, default=5.0, help="training step (5)")
@click.option("--repeats", type=int, default=5, help="timed epochs per loader (5)")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=RESULTS / "workers.md",
    show_default=True,
    help="report",
)
def main(**options: object) -> None:
    args = SimpleNamespace(**options)
    results = {
        "storage": compare(StorageBound(args.samples, args.read_ms), args),
        "cpu": compare(CpuBound(args.samples), args),
    }
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Process workers: iolib against torch's DataLoader",
        "",
        f"{stamp}; {platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores; "
        f"`python benchmarks/bench_workers.py --workers {args.workers} --batch-size "
        f"{args.batch_size} --samples {args.samples} --read-ms {args.read_ms} --step-ms "
        f"{args.step_ms} --repeats {args.repeats}`",
        "",
        "| dataset | loader | samples/s (median, min-max) | step busy | iolib / torch |",
        "| --- | --- | --- | --- | --- |",
    ]
    for kind, result in results.items():
        for name in ("torch", "iolib"):
            r = result[name]
            low, high = r["samples_per_s_range"]
            ratio = (
                f"{result['ratio']:.2f}x ({result['ratio_range'][0]:.2f}-"
                f"{result['ratio_range'][1]:.2f})"
                if name == "iolib"
                else ""
            )
            lines.append(
                f"| {kind} | {name} | {r['samples_per_s']:,.0f} ({low:,.0f}-{high:,.0f}) | "
                f"{r['busy']:.2f} | {ratio} |"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
