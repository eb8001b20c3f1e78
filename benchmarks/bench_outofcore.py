"""Packed windows from local disk on corpora larger than `cache_bytes`, against
nanoGPT-style memmap random windows of the same tokens in the same process.

For each corpus size (a multiple of the budget) a fresh process runs: the iolib loader
(`PackedTokens`, shuffled, `--workers` thread workers, 2 by default) for `--batches`
batches, then nanoGPT's `get_batch` (`np.stack` of `seq_len` slices at random offsets of
a `.bin` memmap, as int64 tensors) for as many tokens. Reported: time to the first
batch, steady tokens/s (median and min-max over `--repeats`), and peak RSS above the
process's baseline (after imports), sampled every 10 ms.

    python benchmarks/bench_outofcore.py --budget-mb 64 --scales 1,4,16 --out outofcore-64mib

Writes benchmarks/results/<out>.md and .json (default outofcore-<budget>mib).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import click
from tqdm import tqdm

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent

RUN = textwrap.dedent(
    """
    import json, sys, threading, time
    import numpy as np, psutil, torch
    from iolib import DataLoader
    from iolib.text import PackedTokens

    url, flat = sys.argv[1], sys.argv[2]
    budget, batches, batch, seq, workers = map(int, sys.argv[3:])
    me = psutil.Process()
    peak = [0]
    def watch():
        while True:
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.01)
    base = me.memory_info().rss
    threading.Thread(target=watch, daemon=True).start()
    start = time.perf_counter()
    loader = DataLoader(PackedTokens(url, column="input_ids", seq_len=seq, eos_id=0,
                                     cache_bytes=budget, shuffle_window=budget // 2),
                        batch_size=batch, shuffle=True, num_workers=workers, seed=0)
    def forever():
        epoch = 0
        while True:  # a small corpus has fewer batches than are timed: go on to the next epoch
            loader.set_epoch(epoch)
            yield from loader
            epoch += 1
    it = forever()
    next(it)
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    iolib_rate = batches * batch * seq / (time.perf_counter() - start)
    iolib_peak = peak[0] - base
    loader.close()
    data = np.memmap(flat, dtype=np.int32, mode="r")
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(batches):
        ix = rng.integers(0, data.size - seq - 1, batch)
        x = torch.from_numpy(np.stack([data[i : i + seq] for i in ix]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + seq] for i in ix]).astype(np.int64))
    memmap_rate = batches * batch * seq / (time.perf_counter() - start)
    print(json.dumps({"first_s": first, "iolib_tok_s": iolib_rate, "memmap_tok_s": memmap_rate,
                      "iolib_peak_rss": iolib_peak}))
    """
)


def _corpus(root: Path, tokens: int, rows_per_group: int = 2048) -> tuple[str, Path]:
    """The corpus of `tokens` tokens under `root`, written unless a finished one is there
    (the flat `.bin` is written last)."""
    suffix = "" if rows_per_group == 2048 else f"-rg{rows_per_group}"
    directory = root / f"corpus-{tokens}{suffix}"
    if (directory / "tokens.bin").exists() and (directory / "done").exists():
        return str(directory), directory / "tokens.bin"
    sys.path.insert(0, str(ROOT))
    from benchmarks.token_corpus import write_corpus

    written = write_corpus(directory, tokens, rows_per_group=rows_per_group, files=4)
    (directory / "done").touch()
    return written


@click.command()
@click.option("--budget-mb", default=64, show_default=True, help="cache_bytes, in MiB.")
@click.option(
    "--scales",
    default="1,4,16",
    show_default=True,
    help="Corpus sizes, as multiples of the budget.",
)
@click.option(
    "--batches",
    default=2000,
    show_default=True,
    help="Batches timed per run: several chunks, so that reading the next one ahead is paid.",
)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--seq-len", default=2048, show_default=True)
@click.option("--repeats", default=3, show_default=True)
@click.option("--workers", default=2, show_default=True, help="iolib's num_workers (threads).")
@click.option("--work-dir", type=click.Path(path_type=Path), default=None,
              help="Where corpora are written and reused (default: a temp directory).")  # fmt: skip
@click.option("--rows-per-group", default=2048, show_default=True,
              help="Documents a row group (2048: ~5 MB decoded; 512 lets 8 MiB run).")  # fmt: skip
@click.option("--out", default=None, help="Results' name in benchmarks/results/.")
def main(
    budget_mb, scales, batches, batch_size, seq_len, repeats, workers, rows_per_group, work_dir, out
) -> None:
    """Packed windows streamed from local disk vs memmap random windows."""
    budget = budget_mb * 2**20
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = work_dir or Path(tmp)
        for scale in tqdm([int(s) for s in scales.split(",")], desc="corpora"):
            # int32 tokens: 4 bytes each
            url, flat = _corpus(root, scale * budget // 4, rows_per_group)
            runs = []
            for _ in tqdm(range(repeats), desc=f"{scale}x budget", leave=False):
                args = [url, str(flat), *map(str, (budget, batches, batch_size, seq_len, workers))]
                done = subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True,
                                     text=True, cwd=ROOT)  # fmt: skip
                if done.returncode:
                    raise click.ClickException(f"the run failed:\n{done.stderr[-3000:]}")
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            rows.append({"scale": scale, "corpus_bytes": scale * budget, "runs": runs})
    name = f"outofcore-{budget_mb}mib" + ("" if workers == 2 else f"-{workers}workers")
    _write(rows, budget_mb, batches, batch_size, seq_len, workers, out or name, rows_per_group)


def _span(values: list[float], scale: float, fmt: str) -> str:
    mid, low, high = (
        f"{v / scale:{fmt}}" for v in (statistics.median(values), min(values), max(values))
    )
    return f"{mid} ({low}-{high})"


def _write(
    rows: list[dict],
    budget_mb: int,
    batches: int,
    batch: int,
    seq: int,
    workers: int,
    out: str,
    rows_per_group: int = 2048,
) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{out}.json").write_text(json.dumps(rows, indent=1))
    lines = [
        "# Packed windows larger than cache_bytes, from local disk",
        "",
        f"`python benchmarks/bench_outofcore.py --budget-mb {budget_mb} --batches {batches} "
        f"--workers {workers} --rows-per-group {rows_per_group}` — cache_bytes "
        f"{budget_mb} MiB, shuffled, {workers} thread workers, batch {batch} x seq_len {seq}, "
        f"{batches} batches timed; memmap: nanoGPT's get_batch on the same tokens, same "
        "process. Median (min-max) over repeats; RSS is the peak above the process's "
        "baseline after imports.",
        "",
        "| corpus | first batch (s) | iolib M tokens/s | memmap M tokens/s | ratio "
        "| peak RSS above baseline (MiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        runs = row["runs"]
        ratio = [r["iolib_tok_s"] / r["memmap_tok_s"] for r in runs]
        lines.append(
            f"| {row['scale']}x budget ({row['corpus_bytes'] / 2**20:.0f} MiB) "
            f"| {_span([r['first_s'] for r in runs], 1, '.2f')} "
            f"| {_span([r['iolib_tok_s'] for r in runs], 1e6, '.1f')} "
            f"| {_span([r['memmap_tok_s'] for r in runs], 1e6, '.1f')} "
            f"| {_span(ratio, 1, '.2f')} "
            f"| {_span([r['iolib_peak_rss'] for r in runs], 2**20, '.0f')} |"
        )
    (RESULTS / f"{out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
