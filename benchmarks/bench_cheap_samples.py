"""Cheap samples: where iolib's per-sample work shows against torch's DataLoader.

Issue 33, items 16 and 20. Two map-style Datasets whose samples cost almost nothing:
  int: ``__getitem__`` returns an int (tabular rows, feature stores).
  int, draws: the same plus a draw from torch's or Python's global generator: iolib
    seeds that generator per sample (the price of its determinism contract, paid only
    where a sample draws: ~1 µs for torch's, ~6-12 µs for ``random``'s).
  getitems: a Hugging Face ``datasets``-style table, ``__getitem__`` and a batched
    ``__getitems__`` (numpy columns sliced once per batch, split into row dicts of
    tensors, as ``set_format("torch")`` does); torch's fetcher calls the batched one.
Both loaders get the same Dataset, batch size, shuffle and worker count
(``num_workers`` 0, and 1 process worker), and take turns, repeat by repeat. Reported:
time to the first batch (``iter`` + ``next``) and to the end of the epoch, medians over
``--repeats``, and iolib / torch per repeat (then the median).

    python benchmarks/bench_cheap_samples.py --repeats 5
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import click
import numpy as np
import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset

import iolib

RESULTS = Path(__file__).parent / "results"


class Ints(Dataset):
    """Sample i is the int i * 3."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index * 3


class DrawingInts(Ints):
    """Sample i is i * 3 plus a draw from Python's global `random`: the case iolib seeds
    per sample (its determinism contract), so it shows what that costs."""

    def __getitem__(self, index: int) -> float:
        return index * 3 + random.random()


class TorchDrawingInts(Ints):
    """Sample i is i * 3 plus a draw from torch's global generator (torchvision's
    random transforms draw there): iolib seeds only that generator per sample."""

    def __getitem__(self, index: int) -> float:
        return index * 3 + float(torch.rand(()))


class Table(Dataset):
    """A columnar table read as Hugging Face ``datasets`` reads one in torch format."""

    def __init__(self, size: int) -> None:
        self.columns = {
            "x": np.arange(size, dtype=np.float32),
            "label": (np.arange(size) % 10).astype(np.int64),
        }
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: torch.tensor(column[index]) for name, column in self.columns.items()}

    def __getitems__(self, keys: list[int]) -> list[dict[str, torch.Tensor]]:
        rows = np.asarray(keys)
        batch = {name: torch.from_numpy(column[rows]) for name, column in self.columns.items()}
        return [{name: values[i] for name, values in batch.items()} for i in range(len(keys))]


def run_once(kind: type, dataset: Dataset, batch_size: int, workers: int) -> tuple[float, float]:
    """(seconds to the first batch, seconds to the epoch's end)."""
    options = dict(batch_size=batch_size, shuffle=True, num_workers=workers)
    if kind is iolib.DataLoader:
        options["seed"] = 0
    start = time.perf_counter()
    loader = kind(dataset, **options)
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - start
    for _ in iterator:
        pass
    total = time.perf_counter() - start
    del iterator, loader
    return first, total


def measure(name: str, dataset: Dataset, batch_size: int, workers: int, repeats: int) -> dict:
    rows: dict[str, list[tuple[float, float]]] = {"torch": [], "iolib": []}
    run_once(TorchDataLoader, dataset, batch_size, workers)  # warm-up: imports, forks
    run_once(iolib.DataLoader, dataset, batch_size, workers)
    for _ in range(repeats):
        rows["torch"].append(run_once(TorchDataLoader, dataset, batch_size, workers))
        rows["iolib"].append(run_once(iolib.DataLoader, dataset, batch_size, workers))

    def median(who: str, k: int) -> float:
        return statistics.median(r[k] for r in rows[who])

    def ratio(k: int) -> float:
        pairs = zip(rows["iolib"], rows["torch"], strict=True)
        return statistics.median(i[k] / t[k] for i, t in pairs)

    return {
        "dataset": name,
        "workers": workers,
        "torch_first_s": median("torch", 0),
        "iolib_first_s": median("iolib", 0),
        "first_ratio": ratio(0),
        "torch_epoch_s": median("torch", 1),
        "iolib_epoch_s": median("iolib", 1),
        "epoch_ratio": ratio(1),
    }


@click.command(context_settings={"show_default": True})
@click.option("--batch-size", default=40960, help="Samples a batch.")
@click.option("--batches", default=4, help="Batches an epoch.")
@click.option("--repeats", default=5, help="Repeats; medians are reported.")
@click.option("--out", default=str(RESULTS / "cheap-samples.md"), help="Markdown results.")
def main(batch_size: int, batches: int, repeats: int, out: str) -> None:
    """Cheap samples (ints, tables): iolib's per-sample cost against torch's DataLoader."""
    size = batch_size * batches
    results = [
        measure(name, dataset, batch_size, workers, repeats)
        for name, dataset in (
            ("int", Ints(size)),
            ("getitems", Table(size)),
            ("int, draws from torch", TorchDrawingInts(size)),
            ("int, draws from random", DrawingInts(size)),
        )
        for workers in (0, 1)
    ]
    lines = [
        "# Cheap samples: iolib against torch's DataLoader",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{len(__import__('os').sched_getaffinity(0))} cores, torch {torch.__version__}; "
        f"batch_size={batch_size}, {batches} batches an epoch, shuffle=True, "
        f"medians of {repeats} repeats (`python benchmarks/bench_cheap_samples.py`).",
        "",
        "| dataset | workers | torch first batch s | iolib first batch s | ratio "
        "| torch epoch s | iolib epoch s | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['dataset']} | {r['workers']} | {r['torch_first_s']:.3f} | "
            f"{r['iolib_first_s']:.3f} | {r['first_ratio']:.2f} | {r['torch_epoch_s']:.3f} | "
            f"{r['iolib_epoch_s']:.3f} | {r['epoch_ratio']:.2f} |"
        )
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
