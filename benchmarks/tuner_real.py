"""The tuner on real (unsimulated) loaders, against torch's default and the hill-climber:

- a map-style torch Dataset whose reads wait on "remote storage" (a sleep per sample,
  almost no CPU), process workers, a step several times shorter than a batch's reads
  (the case of issue #23);
- Parquet token rows through the throttled `nas` storage profile, thread workers;
- JPEG images in Parquet decoded by DALI on the CPU (`ImagePipeline(device="cpu")`).

    python benchmarks/tuner_real.py            # about 5 minutes on 2 cores

Utilization is time-weighted over the last third of each run (the first batch left
out); memory is the peak held in batches in flight or ready. Results:
benchmarks/results/tuner-real.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).absolute().parent.parent))

from benchmarks.tuner_experiments import (
    batches_to_target,
    make_images,
    make_tokens,
    run,
    source_for,
    utilization,
)
from iolib import DataLoader
from predictors.baselines import HillClimbTuner, StaticDefaultTuner

TARGET = 0.9


class RemoteReads(Dataset):
    """Each sample waits `latency_s` on storage (a sleep: no CPU, the GIL released)."""

    def __init__(self, n: int = 20_000, latency_s: float = 0.001) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.latency_s)
        return torch.full((256,), index, dtype=torch.float32)


def _tuners(max_workers: int) -> dict[str, dict[str, Any]]:
    return {
        "learned": {"prefetch": "auto", "num_workers": max_workers, "target_utilization": TARGET},
        "torch-default": {"prefetch": StaticDefaultTuner(), "num_workers": max_workers},
        "hill-climb": {
            "prefetch": HillClimbTuner(max_workers=max_workers),
            "num_workers": max_workers,
        },
    }


def _cases(tmp: Path) -> dict[str, dict[str, Any]]:
    from iolib.images import ImagePipeline

    tokens, images = make_tokens(tmp), make_images(tmp)
    return {
        "map-style Dataset, process workers (32 x 1 ms reads, 6 ms step)": {
            "make": lambda: RemoteReads(),
            "loader": {"batch_size": 32, "worker_mode": "process"},
            "step_ms": 6.0,
            "batches": 300,
            "max_workers": 16,
        },
        "map-style Dataset, thread workers (32 x 1 ms reads, 6 ms step)": {
            "make": lambda: RemoteReads(),
            "loader": {"batch_size": 32, "worker_mode": "thread"},
            "step_ms": 6.0,
            "batches": 300,
            "max_workers": 16,
        },
        "Parquet tokens on nas, threads (4 ms step)": {
            "make": lambda: source_for(tokens, "nas", "real-nas", 0),
            "loader": {"batch_size": 64},
            "step_ms": 4.0,
            "batches": 300,
            "max_workers": 16,
        },
        "images in Parquet, DALI on the CPU (60 ms step)": {
            "make": lambda: source_for(images, None, "real-img", 0),
            "loader": {"batch_size": 64, "decode": ImagePipeline(backend="dali", device="cpu")},
            "step_ms": 60.0,
            "batches": 80,
            "max_workers": 4,
        },
        # Decode-bound: the cores, not the workers, limit; DALI's pool does the work.
        "images in Parquet, DALI on the CPU (15 ms step)": {
            "make": lambda: source_for(images, None, "real-img", 0),
            "loader": {"batch_size": 64, "decode": ImagePipeline(backend="dali", device="cpu")},
            "step_ms": 15.0,
            "batches": 150,
            "max_workers": 4,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--only", default="", help="Run the cases whose name holds this.")
    parser.add_argument("--name", default="tuner-real", help="Results file name (no suffix).")
    args = parser.parse_args()
    lines = [
        "# The tuner on real loaders (2-core machine, shared with other jobs)",
        "",
        "`python benchmarks/tuner_real.py`. Utilization over the last third (time-weighted), "
        f"target {TARGET}; memory: peak held in batches; batches to reach the target "
        "(rolling 10).",
        "",
        "| case | tuner | utilization | peak MiB | batches to target | final workers / depth |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in _cases(Path(tmp)).items():
            if args.only not in name:
                continue
            for tuner, options in _tuners(case["max_workers"]).items():
                try:
                    result = run(
                        lambda c=case, o=options: DataLoader(
                            c["make"](), persistent_workers=True, **c["loader"], **o
                        ),
                        case["batches"],
                        case["step_ms"],
                    )
                except Exception as exc:  # a loader failure is a result too
                    row = f"| {name} | {tuner} | failed: {type(exc).__name__}: {exc} | | | |"
                    lines.append(row)
                    print(row, flush=True)
                    continue
                third = -(case["batches"] // 3)
                util = utilization(result, third)
                reached = batches_to_target(result, TARGET)
                row = (
                    f"| {name} | {tuner} | {util:.3f} | {result['peak_bytes'] / 2**20:.1f} | "
                    f"{reached if reached is not None else '-'} | "
                    f"{result['workers'][-1]} / {result['depth'][-1]} |"
                )
                lines.append(row)
                print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{args.name}.md"
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
