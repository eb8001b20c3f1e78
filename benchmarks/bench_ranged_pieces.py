"""Time to first batch for one 24 MB row group through throttled:: (40 ms, 5 MB/s a
connection, 20 MB/s in all): needed reads split into parallel ranged GETs (on) against
one request (off, SPLIT_ABOVE out of reach), interleaved legs, a fresh source each leg.

Run: python benchmarks/bench_ranged_pieces.py [pairs]
"""

import os
import statistics
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iolib import DataLoader
from iolib.sources import ParquetSource, ranges

path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "iolib-bench-big.parquet")
if not os.path.exists(path):
    rng = np.random.default_rng(0)
    rows = 256
    table = pa.table(
        {"x": np.arange(2 * rows), "blob": [rng.bytes(94_000) for _ in range(2 * rows)]}
    )
    pq.write_table(table, path, row_group_size=rows, compression="none")
print("row group bytes", pq.ParquetFile(path).metadata.row_group(0).total_byte_size)
opts = {
    "throttled": {
        "latency_ms": 40,
        "bandwidth_mbps": 5,
        "total_bandwidth_mbps": 20,
        "skip_instance_cache": True,
    }
}
default = ranges.SPLIT_ABOVE
out = {"on": [], "off": []}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for leg in ("on", "off") if r % 2 == 0 else ("off", "on"):
        ranges.SPLIT_ABOVE = default if leg == "on" else 1 << 62
        source = ParquetSource("throttled::file://" + path, storage_options=opts, readahead=1)
        len(source)
        t = time.perf_counter()
        it = iter(DataLoader(source, batch_size=256))
        batch = next(it)
        out[leg].append(time.perf_counter() - t)
        assert batch["x"].tolist() == list(range(256))
        del it, batch
        source.close()
for leg, xs in out.items():
    runs = " ".join(f"{x:.2f}" for x in xs)
    spread = f"min {min(xs):.2f}, max {max(xs):.2f}"
    print(f"{leg}: median {statistics.median(xs):.2f} s, {spread}; {runs}")
