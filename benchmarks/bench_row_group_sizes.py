"""ParquetSource's defaults on data written by another tool: pyarrow's writer with 1 MB
row groups and with its own default (1,048,576 rows a group: 128 MB here), read from
moto's S3 through throttled:: (40 ms to first byte, 5 MB/s a connection, 20 MB/s in
all), with default options (DataLoader(source, batch_size=256, shuffle=True)).

Per leg, in a fresh process: time to the first batch against its floor (bytes of the
row groups it needs / 20 MB/s + 40 ms), bytes fetched over stored for the epoch and
requests (counted at the throttle), peak RSS. Legs alternate between the two layouts.

Run: python benchmarks/bench_row_group_sizes.py [rounds]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

ROWS = 1 << 21  # two of pyarrow's default row groups
BLOB = 120  # bytes a row, incompressible: ~128 MB a default row group
# rows a group (None: pyarrow's default), rows a file: moto copies a whole object for
# each ranged GET, so files stay at most 128 MB (the store's cost, not the reader's).
LAYOUTS = {"1MB": (8192, 1 << 18), "128MB": (None, 1 << 20)}
PROFILE = {"latency_ms": 40, "bandwidth_mbps": 5, "total_bandwidth_mbps": 20}


def write(folder: str) -> dict[str, str]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    offsets = pa.py_buffer(np.arange(ROWS + 1, dtype=np.int32) * BLOB)
    blob = pa.Array.from_buffers(
        pa.binary(), ROWS, [None, offsets, pa.py_buffer(rng.bytes(ROWS * BLOB))]
    )
    table = pa.table({"x": np.arange(ROWS), "blob": blob})
    folders = {}
    for name, (rows, per_file) in LAYOUTS.items():
        folders[name] = f"{folder}/{name}"
        os.makedirs(folders[name], exist_ok=True)
        kwargs = {} if rows is None else {"row_group_size": rows}
        for i, start in enumerate(range(0, ROWS, per_file)):
            pq.write_table(table.slice(start, per_file), f"{folders[name]}/part-{i}.parquet",
                           compression="none", **kwargs)  # fmt: skip
    return folders


def leg(url: str, options: dict) -> dict:
    """One epoch in this process (a fresh one per leg)."""
    import resource
    import time

    from iolib import DataLoader
    from iolib.sources import ParquetSource
    from iolib.storage.throttle import ThrottledFileSystem

    reads: list[int] = []
    after = ThrottledFileSystem.after_request

    def counting(self, token, data):
        data = after(self, token, data)
        if data is not None:
            reads.append(len(data))
        return data

    ThrottledFileSystem.after_request = counting
    t0 = time.perf_counter()
    source = ParquetSource(url, storage_options=options)
    loader = DataLoader(source, batch_size=256, shuffle=True, seed=0)
    it = iter(loader)
    first = next(it)
    first_s = time.perf_counter() - t0
    at_first = sum(reads)
    rows = len(first["x"])
    for batch in it:
        rows += len(batch["x"])
    d = source.description
    needed = {d.block_of(int(i)) for i in first["x"].tolist()}
    need_bytes = sum(end - start for g in needed for start, end in d.chunk_spans(g))
    return {
        "first_s": first_s,
        "epoch_s": time.perf_counter() - t0,
        "rows": rows,
        "fetched": sum(reads),
        "fetched_by_first": at_first,
        "requests": len(reads),
        "first_needs": need_bytes,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "stats": {k: v for k, v in loader.stats().items() if isinstance(v, (int, float))},
    }


def main() -> None:
    import s3fs

    from iolib.cli.bench.s3server import moto_s3

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory() as folder, moto_s3("iolib-bench") as s3:
        folders = write(folder)
        fs = s3fs.S3FileSystem(**s3)
        stored = {}
        for name, local in folders.items():
            fs.put(local, f"iolib-bench/{name}", recursive=True)
            stored[name] = sum(e.stat().st_size for e in os.scandir(local))
        options = {"s3": dict(s3), "throttled": {**PROFILE, "skip_instance_cache": True}}
        out: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
        for r in range(rounds):
            for name in LAYOUTS if r % 2 == 0 else list(LAYOUTS)[::-1]:
                url = f"throttled::s3://iolib-bench/{name}"
                code = f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
                code += "from bench_row_group_sizes import leg; "
                code += f"print('RESULT', json.dumps(leg({url!r}, {options!r})))"
                done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, timeout=900)  # fmt: skip
                line = [x for x in done.stdout.splitlines() if x.startswith("RESULT")]
                if not line:
                    print(done.stdout[-2000:], done.stderr[-4000:])
                    raise SystemExit(f"leg {name} failed")
                result = json.loads(line[0][7:])
                out[name].append(result)
                print(name, json.dumps(result), flush=True)
        for name, runs in out.items():
            floor = runs[0]["first_needs"] / (PROFILE["total_bandwidth_mbps"] * 1e6) + 0.04
            firsts = [x["first_s"] for x in runs]
            fetched = statistics.median(x["fetched"] for x in runs) / stored[name]
            epoch = statistics.median(x["epoch_s"] for x in runs)
            print(
                f"{name}: first batch median {statistics.median(firsts):.2f} s "
                f"({min(firsts):.2f}-{max(firsts):.2f}), floor {floor:.2f} s; "
                f"fetched/stored {fetched:.2f}; before first batch "
                f"{runs[0]['fetched_by_first'] / 1e6:.0f} MB; requests {runs[0]['requests']}; "
                f"epoch {epoch:.1f} s; peak RSS {max(x['peak_rss'] for x in runs) / 2**20:.0f} MiB"
            )


if __name__ == "__main__":
    main()
