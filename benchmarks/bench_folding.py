"""Requests with and without room in the cache: a batch's neighbouring row groups that
come in one request (`FetchPool.submit_many`, `RowGroupFetcher.foldable`). Counts only
(row-group reads, those folded into another's request, requests at the store), one
epoch over a local `throttled::` file of 100 row groups of 600 rows.

Run: python benchmarks/bench_folding.py [cache_bytes] [batch_size]
"""

import os
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iolib import DataLoader
from iolib.sources import ParquetSource, parquet_fetch
from iolib.storage.throttle import ThrottledFileSystem

path = os.path.join(tempfile.gettempdir(), "iolib-bench-folding.parquet")
if not os.path.exists(path):
    rng = np.random.default_rng(0)
    table = pa.table({"x": np.arange(60000), "blob": [rng.bytes(100) for _ in range(60000)]})
    pq.write_table(table, path, row_group_size=600, compression="none")
cache = int(sys.argv[1]) if len(sys.argv) > 1 else None
batch_size = int(sys.argv[2]) if len(sys.argv) > 2 else 256
folds, reads = [0, 0], []
fetch = parquet_fetch.RowGroupFetcher.fetch
after = ThrottledFileSystem.after_request


def counting_fetch(self, group, later=(), **kwargs):
    folds[0] += 1
    folds[1] += len(later)
    return fetch(self, group, later, **kwargs)


def counting_after(self, token, data):
    data = after(self, token, data)
    if data is not None:
        reads.append(len(data))
    return data


parquet_fetch.RowGroupFetcher.fetch = counting_fetch
ThrottledFileSystem.after_request = counting_after
options = {"throttled": {"latency_ms": 1, "skip_instance_cache": True}}
for shuffle in (False, "block", "global"):
    for workers in (0, 2):
        folds[:], reads[:] = [0, 0], []
        source = ParquetSource("throttled::file://" + path, storage_options=options,
                               cache_bytes=cache)  # fmt: skip
        for _ in DataLoader(source, batch_size=batch_size, shuffle=shuffle, seed=0,
                            num_workers=workers):  # fmt: skip
            pass
        print(f"shuffle={shuffle} workers={workers}: row-group reads {folds[0]}, folded "
              f"{folds[1]}, requests {len(reads)}, MB {sum(reads) / 1e6:.1f}")  # fmt: skip
