"""Plans that do not grow with the data: time to the first batch and plan memory at
N = 10^9 samples, and a 10^8-row Parquet file's first batch.

Each case runs in a fresh process: peak Python allocations while the loader is built
and its first batch made (tracemalloc: the plan's arrays), and the process's resident
set growth (psutil), at world size 1 and 64 (rank 0).

- a map-style Dataset of 10^9 samples (`__getitem__` returns the index);
- the plan of 10^9 packed windows in chunks of 1,000 (what `PackedTokens` builds for a
  corpus of 2 * 10^12 tokens at seq_len 2048), dealt to lanes at world size 64;
- one Parquet file of 10^8 int32 rows (400 MB), row groups of 10^6.

    python benchmarks/bench_plans.py

Writes benchmarks/results/plans.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

CASE = textwrap.dedent(
    """
    import json, sys, time, tracemalloc
    import numpy as np, psutil
    kind, shuffle, world, where = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    shuffle = {"True": True, "False": False}.get(shuffle, shuffle)
    from iolib import DataLoader
    from iolib.sources import ParquetSource
    from iolib.plan import EpochOrder, LaneOrder, RankSchedule, default_blocks, lane_sizes
    me = psutil.Process()
    rss = me.memory_info().rss
    tracemalloc.start()
    start = time.perf_counter()
    if kind == "dataset":
        class Big:
            def __len__(self): return 10**9
            def __getitem__(self, i): return i
        loader = DataLoader(Big(), batch_size=256, shuffle=shuffle, seed=0, rank=0,
                            world_size=world)
        first = next(iter(loader))
    elif kind == "packed-plan":
        n, chunk = 10**9, 1000
        lanes = [EpochOrder(int(s), seed=lane, epoch=0, shuffle="block",
                            blocks=default_blocks(int(s), chunk), window=1)
                 for lane, s in enumerate(lane_sizes(n, world))]
        order = LaneOrder(lanes, 16)
        first = order[RankSchedule(n, 0, 16, world, 0).positions(0)]
    else:
        loader = DataLoader(ParquetSource(where), batch_size=256, shuffle=shuffle, seed=0,
                            rank=0, world_size=world, num_workers=2)
        first = next(iter(loader))
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    print(json.dumps({"first_s": seconds, "traced_peak": peak,
                      "rss_growth": me.memory_info().rss - rss}))
    """
)


def _parquet(directory: Path) -> str:
    path = directory / "rows-1e8.parquet"
    schema = pa.schema([("x", pa.int32())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, 10**8, 10**7):
            column = np.arange(start, start + 10**7, dtype=np.int32)
            writer.write_table(pa.table({"x": column}), row_group_size=10**6)
    return str(path)


@click.command()
def main() -> None:
    """First batch and plan memory at 10^9 samples; a 10^8-row Parquet file."""
    cases = [("dataset", s, w) for s in ("True", "block") for w in (1, 64)]
    cases += [("packed-plan", "block", w) for w in (1, 64)]
    cases += [("parquet", s, w) for s in ("True", "block", "False") for w in (1, 64)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        where = _parquet(Path(tmp))
        for kind, shuffle, world in tqdm(cases, desc="plans"):
            out = subprocess.run([sys.executable, "-c", CASE, kind, shuffle, str(world), where],
                                 capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
            rows.append((kind, shuffle, world, json.loads(out.stdout.strip().splitlines()[-1])))
    lines = [
        "# Plans at scale",
        "",
        "`python benchmarks/bench_plans.py`: a fresh process per case; traced = peak Python "
        "allocations while building the loader and its first batch (the plan), RSS = the "
        "process's growth over the same span (for Parquet it includes the row groups read).",
        "",
        "| case | shuffle | world size | first batch (s) | traced peak (MiB) | RSS growth (MiB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "dataset": "map-style Dataset, 10^9 samples",
        "packed-plan": "packed windows' plan, 10^9 windows",
        "parquet": "one Parquet file, 10^8 rows",
    }
    for kind, shuffle, world, r in rows:
        lines.append(
            f"| {names[kind]} | {shuffle} | {world} | {r['first_s']:.3f} "
            f"| {r['traced_peak'] / 2**20:.1f} | {r['rss_growth'] / 2**20:.0f} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "plans.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
