"""Token data: variable-length `list<int32>` rows, and packed pretraining windows.

Workloads (made on first use under --data, default benchmarks/data/):
  variable: --rows documents of 64..191 int32 tokens (mean 128) in --files Parquet files,
    row groups of --row-group rows. iolib.DataLoader(ParquetSource) with shuffle=True
    (global) and shuffle="block", against torch's DataLoader over the map-style Dataset a
    user would write: the pyarrow table in memory, ``__getitem__`` returning one row as a
    tensor, padding (and the mask, lengths) in ``collate_fn``; both persistent workers.
    The first epoch counts the loader's construction (torch's Dataset reads the table).
    iolib-global-inline (no workers) shows what the consumer's thread alone does.
  packed: documents of log-normal length (median ~400 tokens) totalling --packed-tokens.
    iolib.DataLoader(PackedTokens(seq_len=2048), batch_size=16, shuffle=True) against
    nanoGPT's get_batch: random windows sliced from one flat np.memmap token file
    (x and y = x shifted), in the consumer's process; tokens/s of input_ids.
  memory: the packed loader's resident set (its own process) against the raw size of
    the token column.

Epochs alternate between loaders; steady state is the median of the epochs after the
first. 2 shared cores here: compare ratios from one run, not absolute figures.

    python benchmarks/bench_tokens.py --workers 2 --epochs 4
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

HERE = Path(__file__).parent
if str(HERE.parent) not in sys.path:  # run from a checkout: this checkout's iolib
    sys.path.insert(0, str(HERE.parent))

import iolib  # noqa: E402
from iolib.sources import ParquetSource  # noqa: E402
from iolib.text import PackedTokens  # noqa: E402

SEQ_LEN, PACKED_BATCH = 2048, 16


# -- data ------------------------------------------------------------------------------
def _write_lists(path: Path, lengths: np.ndarray, rng: np.random.Generator, rg: int) -> None:
    values = rng.integers(1, 50_000, size=int(lengths.sum()), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"tokens": tokens}), path, row_group_size=rg)


def make_variable(root: Path, rows: int, files: int, row_group: int) -> Path:
    directory = root / f"variable-{rows}x{files}-rg{row_group}"
    if not directory.exists():
        directory.mkdir(parents=True)
        rng = np.random.default_rng(0)
        for f, part in enumerate(np.array_split(np.arange(rows), files)):
            lengths = rng.integers(64, 192, size=part.size)
            _write_lists(directory / f"part-{f:02d}.parquet", lengths, rng, row_group)
    return directory


def make_packed(root: Path, tokens: int) -> tuple[Path, Path]:
    """Parquet documents and the same tokens as one flat memmap file (nanoGPT's train.bin)."""
    directory, flat = root / f"packed-{tokens}", root / f"packed-{tokens}.bin"
    if not directory.exists():
        directory.mkdir(parents=True)
        rng = np.random.default_rng(1)
        lengths = np.clip(rng.lognormal(6, 1, size=tokens // 300), 1, 32_000).astype(np.int64)
        lengths = lengths[np.cumsum(lengths) <= tokens]
        for f, part in enumerate(np.array_split(lengths, 4)):
            _write_lists(directory / f"part-{f}.parquet", part, rng, 1024)
        table = pq.read_table(directory, columns=["tokens"])
        flat_tokens = table.column("tokens").combine_chunks().flatten().to_numpy()
        np.asarray(flat_tokens, dtype=np.int32).tofile(flat)
    return directory, flat


# -- the torch side: what a user writes ------------------------------------------------
class TorchTokens(Dataset):
    def __init__(self, directory: Path) -> None:
        self.tokens = pq.read_table(directory).column("tokens").combine_chunks()

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.tokens[index].values.to_numpy(zero_copy_only=False).copy())


def pad_collate(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    tokens = pad_sequence(rows, batch_first=True, padding_value=0)
    mask = torch.arange(tokens.shape[1]) < lengths[:, None]
    return {"tokens": tokens, "tokens_mask": mask, "tokens_lengths": lengths}


# -- timing ----------------------------------------------------------------------------
def time_epoch(loader, epoch: int) -> tuple[float, int]:
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    start, rows = time.perf_counter(), 0
    for batch in loader:
        rows += len(batch["tokens_lengths"])
    return time.perf_counter() - start, rows


def bench_variable(args: SimpleNamespace) -> dict:
    directory = make_variable(args.data, args.rows, args.files, args.row_group)
    common = dict(batch_size=args.batch, num_workers=args.workers, persistent_workers=True)
    builders = {
        "torch": lambda: torch.utils.data.DataLoader(
            TorchTokens(directory), shuffle=True, collate_fn=pad_collate, **common
        ),
        "iolib-global": lambda: iolib.DataLoader(
            ParquetSource(str(directory)), shuffle=True, seed=0, **common
        ),
        "iolib-block": lambda: iolib.DataLoader(
            ParquetSource(str(directory)), shuffle="block", seed=0, **common
        ),
        # For the record: the same work on the consumer's thread alone (no workers).
        "iolib-global-inline": lambda: iolib.DataLoader(
            ParquetSource(str(directory)), batch_size=args.batch, shuffle=True, seed=0
        ),
    }
    loaders, first, steady = {}, {}, {name: [] for name in builders}
    for name, build in builders.items():
        start = time.perf_counter()
        loaders[name] = build()
        took, rows = time_epoch(loaders[name], 0)
        first[name] = rows / (time.perf_counter() - start)
    for epoch in range(1, args.epochs):
        for name, loader in loaders.items():
            took, rows = time_epoch(loader, epoch)
            steady[name].append(rows / took)
    out = {"first_epoch_rows_per_s": first, "steady_rows_per_s": {}}
    for name in builders:
        out["steady_rows_per_s"][name] = statistics.median(steady[name])
    for name in ("iolib-global", "iolib-block"):
        out.setdefault("stats", {})[name] = {
            k: v for k, v in loaders[name].stats().items() if k.startswith(("row_group", "cache"))
        }
    return out


def nanogpt_batches(flat: Path, batches: int, rng: torch.Generator) -> int:
    """nanoGPT's get_batch, `batches` times: random windows of a memmap (re-opened per
    batch, as nanoGPT does to avoid a memory leak)."""
    tokens = 0
    for _ in range(batches):
        data = np.memmap(flat, dtype=np.int32, mode="r")
        ix = torch.randint(len(data) - SEQ_LEN, (PACKED_BATCH,), generator=rng)
        x = torch.stack([torch.from_numpy(data[i : i + SEQ_LEN].astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + SEQ_LEN].astype(np.int64)) for i in ix]
        )
        tokens += x.numel()
        del y  # made as nanoGPT makes it; only input tokens are counted, as for iolib
    return tokens


def bench_packed(args: SimpleNamespace) -> dict:
    directory, flat = make_packed(args.data, args.packed_tokens)
    rates: dict[str, list[float]] = {"nanogpt-memmap": []}
    loaders = {}
    for workers in (0, args.workers):
        loaders[f"iolib-packed-w{workers}"] = iolib.DataLoader(
            PackedTokens(str(directory), column="tokens", seq_len=SEQ_LEN, eos_id=0),
            batch_size=PACKED_BATCH, shuffle=True, seed=0, num_workers=workers,
            persistent_workers=workers > 0,
        )  # fmt: skip
        rates[f"iolib-packed-w{workers}"] = []
    rng = torch.Generator().manual_seed(0)
    batches = len(next(iter(loaders.values())))
    for epoch in range(args.epochs):
        for name, loader in loaders.items():
            loader.set_epoch(epoch)
            start, tokens = time.perf_counter(), 0
            for batch in loader:
                tokens += batch["input_ids"].numel()
            rates[name].append(tokens / (time.perf_counter() - start))
        start = time.perf_counter()
        tokens = nanogpt_batches(flat, batches, rng)
        rates["nanogpt-memmap"].append(tokens / (time.perf_counter() - start))
    return {
        "batches_per_epoch": batches,
        "first_epoch_tokens_per_s": {k: v[0] for k, v in rates.items()},
        "steady_tokens_per_s": {k: statistics.median(v[1:]) for k, v in rates.items()},
    }


def memory_probe(directory: str) -> None:
    """In its own process: resident set before and after one epoch of packed windows."""
    process = psutil.Process()
    before = process.memory_info().rss
    loader = iolib.DataLoader(
        PackedTokens(directory, column="tokens", seq_len=SEQ_LEN, eos_id=0),
        batch_size=PACKED_BATCH, shuffle=True, seed=0, num_workers=2,
    )  # fmt: skip
    for _ in loader:
        pass
    tokens = int(loader.source.index.tokens.sum())  # raw tokens, without the eos added
    print(json.dumps({"rss_delta": process.memory_info().rss - before, "raw": 4 * tokens}))


def bench_memory(args: SimpleNamespace) -> dict:
    directory, _ = make_packed(args.data, args.packed_tokens)
    done = subprocess.run(
        [sys.executable, __file__, "--memory-probe", str(directory)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found["ratio"] = found["rss_delta"] / found["raw"]
    return found


# -- report ----------------------------------------------------------------------------
def write_report(results: dict, args: SimpleNamespace) -> None:
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "tokens.json").write_text(json.dumps(results, indent=2))
    v, p, m = results["variable"], results["packed"], results["memory"]
    torch_first, torch_steady = (
        v["first_epoch_rows_per_s"]["torch"],
        v["steady_rows_per_s"]["torch"],
    )
    lines = [
        "# Token data benchmarks",
        "",
        f"{results['when']}, {results['machine']}; `python benchmarks/bench_tokens.py "
        f"{' '.join(results['argv'])}`. Ratios are from this one run.",
        "",
        f"## Variable-length `list<int32>` ({args.rows:,} rows of 64-191 tokens, "
        f"{args.files} files, row groups of {args.row_group:,}, batch {args.batch}, "
        f"{args.workers} workers)",
        "",
        "| loader | first epoch rows/s | vs torch | steady rows/s | vs torch |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name in ("torch", "iolib-global", "iolib-block", "iolib-global-inline"):
        a, b = v["first_epoch_rows_per_s"][name], v["steady_rows_per_s"][name]
        lines.append(
            f"| {name} | {a:,.0f} | {a / torch_first:.2f}x | {b:,.0f} | {b / torch_steady:.2f}x |"
        )
    lines += ["", f"Cache counters: `{json.dumps(v['stats'])}`", ""]
    base = p["steady_tokens_per_s"]["nanogpt-memmap"]
    lines += [
        f"## Packed windows (seq_len {SEQ_LEN}, batch {PACKED_BATCH}, "
        f"{args.packed_tokens:,} tokens, {p['batches_per_epoch']} batches an epoch)",
        "",
        "| loader | first epoch tokens/s | steady tokens/s | vs nanoGPT memmap |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, rate in p["steady_tokens_per_s"].items():
        first = p["first_epoch_tokens_per_s"][name]
        ratio = rate / base
        lines.append(f"| {name} | {first / 1e6:,.1f} M | {rate / 1e6:,.1f} M | {ratio:.2f}x |")
    lines += [
        "",
        "## Memory",
        "",
        f"Packed loader's resident set grew by {m['rss_delta'] / 2**20:,.0f} MiB for a token "
        f"column of {m['raw'] / 2**20:,.0f} MiB raw (int32): {m['ratio']:.2f}x.",
        "",
    ]
    (out / "tokens.md").write_text("\n".join(lines))
    print("\n".join(lines))


@click.command(help=__doc__.split("\n")[0])
@click.option("--data", type=click.Path(path_type=Path), default=HERE / "data", show_default=True)
@click.option("--rows", type=int, default=200_000, show_default=True)
@click.option("--files", type=int, default=8, show_default=True)
@click.option("--row-group", type=int, default=4096, show_default=True)
@click.option("--batch", type=int, default=256, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--epochs", type=int, default=4, show_default=True)
@click.option("--packed-tokens", type=int, default=20_000_000, show_default=True)
@click.option(
    "--only",
    type=click.Choice(("variable", "packed", "memory")),
    multiple=True,
    help="repeat for several (default: all three)",
)
@click.option("--memory-probe", hidden=True)
def main(**options: object) -> None:
    args = SimpleNamespace(**options)
    if args.memory_probe:
        memory_probe(args.memory_probe)
        return
    torch.set_num_threads(1)
    wanted = args.only or ["variable", "packed", "memory"]
    runners = {"variable": bench_variable, "packed": bench_packed, "memory": bench_memory}
    results = {
        "when": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} cores",
        "argv": sys.argv[1:],
    }
    for name in wanted:
        results[name] = runners[name](args)
        print(name, json.dumps(results[name]), flush=True)
    if len(wanted) == 3:
        write_report(results, args)


if __name__ == "__main__":
    main()
