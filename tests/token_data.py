"""Variable-length token documents in Parquet (`list<int32>`), as tokenizers write them.

Each document's tokens encode (document id, position) so that tests can check order and
completeness from the values alone: token = 1000 * doc + position (+1, so 0 stays free
for padding and end-of-document ids)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def document(doc: int, length: int) -> np.ndarray:
    return (1000 * doc + np.arange(length) + 1).astype(np.int32)


def doc_lengths(count: int, *, seed: int = 0, low: int = 1, high: int = 40) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, size=count)


def write_documents(
    directory: Path,
    lengths: np.ndarray,
    *,
    shards: int = 2,
    row_group_size: int = 16,
    nulls: tuple[int, ...] = (),
    null_items: bool = False,
) -> str:
    """`lengths[d]` tokens for document d, in `shards` files; documents in `nulls` are null
    rows; `null_items` puts a null inside one list. Columns: `id` (int64), `tokens`."""
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(lengths), shards + 1).astype(int)
    for s in range(shards):
        ids = range(bounds[s], bounds[s + 1])
        rows = [None if d in nulls else document(d, int(lengths[d])).tolist() for d in ids]
        if null_items and s == shards - 1 and rows and rows[-1]:
            rows[-1][0] = None
        table = pa.table(
            {
                "id": np.arange(bounds[s], bounds[s + 1]),
                "tokens": pa.array(rows, pa.list_(pa.int32())),
            }
        )
        pq.write_table(table, directory / f"part-{s}.parquet", row_group_size=row_group_size)
    return str(directory)
