"""What the loader itself costs a batch of packed windows, with thread workers, against
nanoGPT's memmap `get_batch` of the same shape, in the same process.

A source whose `read` does only what any packed batch must: a fresh int64 buffer of
input_ids, labels and position_ids, filled with a constant (no storage, no cut). What
`DataLoader` adds to it (engine, hand-off between threads, collate to tensors) is the
floor under `PackedTokens`' per-batch time at that many workers; memmap's batch is
the figure `bench_outofcore.py` compares against. 0.5x memmap needs a whole batch
within twice memmap's time.

    python benchmarks/bench_loader_floor.py --workers 0,1,2 --repeats 5

Writes benchmarks/results/loader-floor.md and .json.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import click
import numpy as np
import pyarrow as pa
import torch
from tqdm import tqdm

from iolib import DataLoader
from iolib.sources.base import Source

RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = ("input_ids", "labels", "position_ids")


class ConstantBatches(Source):
    """`windows` packed windows of `seq_len` tokens, each batch a fresh buffer of 1s."""

    columnar = True

    def __init__(self, windows: int, seq_len: int) -> None:
        self.windows, self.seq_len = windows, seq_len

    def __len__(self) -> int:
        return self.windows

    def fingerprint(self) -> str:
        return f"constant-{self.windows}-{self.seq_len}"

    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        rows, length = len(indices), self.seq_len
        plane = rows * length * 8
        buffer = pa.allocate_buffer(len(COLUMNS) * plane)  # as PackedTokens allocates
        np.frombuffer(buffer, dtype=np.int64)[:] = 1
        columns = {}
        for i, name in enumerate(COLUMNS):
            values = [None, buffer.slice(i * plane, plane)]
            flat = pa.Array.from_buffers(pa.int64(), rows * length, values)
            columns[name] = pa.FixedSizeListArray.from_arrays(flat, length)
        return pa.table(columns)


def _loader_ms(workers: int, batches: int, batch: int, seq: int) -> float:
    """One run: ms a batch over `batches`, after a warm-up of 50."""
    source = ConstantBatches(batches * batch * 2, seq)
    loader = DataLoader(source, batch_size=batch, shuffle=True, num_workers=workers, seed=0)
    it = iter(loader)
    for _ in range(50):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - start
    loader.close()
    return elapsed / batches * 1e3


def _memmap_ms(path: Path, batches: int, batch: int, seq: int) -> float:
    """nanoGPT's get_batch: int64 x and y stacked from random slices of a .bin memmap."""
    data = np.memmap(path, dtype=np.int32, mode="r")
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(batches):
        ix = rng.integers(0, data.size - seq - 1, batch)
        torch.from_numpy(np.stack([data[i : i + seq] for i in ix]).astype(np.int64))
        torch.from_numpy(np.stack([data[i + 1 : i + 1 + seq] for i in ix]).astype(np.int64))
    return (time.perf_counter() - start) / batches * 1e3


@click.command()
@click.option("--workers", default="0,1,2", show_default=True, help="Thread workers to time.")
@click.option("--batches", default=3000, show_default=True)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--seq-len", default=2048, show_default=True)
@click.option("--repeats", default=5, show_default=True)
@click.option("--out", default="loader-floor", show_default=True)
def main(workers: str, batches: int, batch_size: int, seq_len: int, repeats: int, out: str) -> None:
    """The loader's own cost a packed batch, against memmap's whole batch."""
    counts = [int(w) for w in workers.split(",")]
    times: dict[str, list[float]] = {"memmap": [], **{f"{w} workers": [] for w in counts}}
    with tempfile.TemporaryDirectory() as tmp:
        flat = Path(tmp) / "tokens.bin"  # 256 MiB of int32 tokens, in the page cache
        rng = np.random.default_rng(0)
        with flat.open("wb") as f:
            for _ in range(16):
                f.write(rng.integers(0, 50_000, 1 << 22, dtype=np.int32).tobytes())
        for _ in tqdm(range(repeats), desc="repeats"):  # interleaved: load moves all alike
            times["memmap"].append(_memmap_ms(flat, batches, batch_size, seq_len))
            for w in counts:
                times[f"{w} workers"].append(_loader_ms(w, batches, batch_size, seq_len))
    memmap = statistics.median(times["memmap"])
    lines = [
        "# The loader's own cost a packed batch",
        "",
        f"`python benchmarks/bench_loader_floor.py --workers {workers} --repeats {repeats}` — "
        f"batch {batch_size} x seq_len {seq_len}, {batches} batches a run; a source that only "
        "fills a fresh int64 buffer of the three columns (no storage, no cut), against "
        "nanoGPT's memmap get_batch. Median (min-max) ms a batch over repeats; the last "
        "column is the most a loader at that floor could reach, as a share of memmap.",
        "",
        "| loader | ms a batch | best possible ratio to memmap |",
        "| --- | --- | --- |",
    ]
    for name, values in times.items():
        mid = statistics.median(values)
        ceiling = "1 (the baseline)" if name == "memmap" else f"{memmap / mid:.2f}x"
        lines.append(f"| {name} | {mid:.3f} ({min(values):.3f}-{max(values):.3f}) | {ceiling} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{out}.json").write_text(json.dumps(times, indent=1))
    (RESULTS / f"{out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
