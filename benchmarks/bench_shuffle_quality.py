"""What the windowed shuffle of `PackedTokens` costs in shuffle quality, per `cache_bytes`.

For each budget, one shuffled epoch of packed windows (batch 16, seq_len 2048) is read
with `document_ids`, and each batch is scored by:

- how many distinct row groups its windows come from (a full shuffle: nearly one a
  window; a sequential read: one or two);
- the spread of its documents over the corpus: the standard deviation of their rows'
  positions, as a fraction of the corpus (uniform over the corpus: 0.29).

    python benchmarks/bench_shuffle_quality.py --tokens 32000000 --budgets-mb 24,32,64,128,4096

Writes benchmarks/results/shuffle-quality.md.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@click.command()
@click.option("--tokens", default=32_000_000, show_default=True, help="Corpus size in tokens.")
@click.option("--budgets-mb", default="24,32,64,128,4096", show_default=True)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--seq-len", default=2048, show_default=True)
def main(tokens: int, budgets_mb: str, batch_size: int, seq_len: int) -> None:
    """Distinct row groups and document spread per batch, for each cache_bytes."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.token_corpus import write_corpus
    from iolib import DataLoader
    from iolib.text import PackedTokens

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        url, _ = write_corpus(Path(tmp) / "c", tokens, rows_per_group=2048, files=4)
        for budget in tqdm([int(b) for b in budgets_mb.split(",")], desc="budgets"):
            windows = PackedTokens(url, column="input_ids", seq_len=seq_len, eos_id=0,
                                   document_ids=True, cache_bytes=budget * 2**20,
                                   shuffle_window=budget * 2**19)  # fmt: skip
            starts = windows.parquet.row_starts()
            total_rows = int(starts[-1])
            loader = DataLoader(windows, batch_size=batch_size, shuffle=True, seed=0,
                                num_workers=2)  # fmt: skip
            groups, spread = [], []
            for batch in loader:
                docs = np.asarray(batch["document_ids"])[:, 0]  # each window's first document
                groups.append(np.unique(np.searchsorted(starts, docs, side="right")).size)
                spread.append(float(np.std(docs)) / total_rows)
            rows.append((budget, windows.shuffle_window_groups(), len(starts) - 1,
                         np.median(groups), np.median(spread)))  # fmt: skip
    lines = [
        "# Shuffle quality of packed windows, per cache_bytes",
        "",
        f"`python benchmarks/bench_shuffle_quality.py --tokens {tokens} --budgets-mb "
        f"{budgets_mb}`: one shuffled epoch, batch {batch_size} x seq_len {seq_len}, "
        "medians over its batches. Spread: standard deviation of a batch's first documents' "
        "rows over the corpus's rows (uniform: 0.29).",
        "",
        "| cache_bytes (MiB) | shuffle window (row groups) | row groups | distinct row groups "
        "a batch | spread a batch |",
        "| --- | --- | --- | --- | --- |",
    ]
    for budget, window, total, groups, spread in rows:
        lines.append(f"| {budget} | {window} | {total} | {groups:.0f} | {spread:.3f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "shuffle-quality.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
