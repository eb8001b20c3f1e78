"""A synthetic pretraining corpus: documents of log-normal length as Parquet
(`list<int32>`, the shape tokenizers write) and the same tokens as a nanoGPT-style
flat `.bin` (uint16 or int32 tokens, eos between documents), for side-by-side runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

EOS = 0


def write_corpus(
    directory: Path,
    tokens: int,
    *,
    seed: int = 0,
    mean_doc: int = 600,
    rows_per_group: int = 4096,
    files: int = 4,
    vocab: int = 50_000,
) -> tuple[str, Path]:
    """About `tokens` tokens in `files` Parquet files of `rows_per_group`-document row
    groups, plus `tokens.bin` (int32). Returns (the Parquet directory URL, the .bin)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(mean_doc) - sigma**2 / 2
    lengths = []
    while sum(map(len, lengths)) < tokens:
        lengths.append(np.maximum(1, rng.lognormal(mu, sigma, 65536).astype(np.int64)))
    lengths = np.concatenate(lengths)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), tokens) + 1]
    values = rng.integers(1, vocab, size=int(lengths.sum()), dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    bounds = np.linspace(0, lengths.size, files + 1).astype(np.int64)
    with open(directory / "tokens.bin", "wb") as flat:
        for f in range(files):
            lo, hi = bounds[f], bounds[f + 1]
            part = offsets[lo : hi + 1]
            column = pa.ListArray.from_arrays(
                pa.array(part - part[0], pa.int32()), pa.array(values[part[0] : part[-1]])
            )
            pq.write_table(
                pa.table({"input_ids": column}),
                directory / f"part-{f:04d}.parquet",
                row_group_size=rows_per_group,
            )
            stream = np.insert(values[part[0] : part[-1]], part[1:] - part[0], EOS)
            stream.astype(np.int32).tofile(flat)
    return str(directory), directory / "tokens.bin"
