"""Where the first batch of packed token windows spends its time, on the store of
`bench_peers.py` (moto's S3 server behind the throttling proxy: 40 ms to first byte,
5 MB/s a connection, 20 MB/s in all), with its tokens corpus (`iolib index` beside it).

Prints, from the source's construction: when the index was loaded, when the iterator
started, when the first batch came, the proxy's counters at each point, and the MB that
had arrived every 0.2 s while the first batch was awaited (so the link's part of the
wait can be told from decoding's); then which row groups the first batches need.

    /work/peers-venv/bin/python benchmarks/probe_first_token_batch.py \\
        --data benchmarks/data/peers/tokens24000000-images2000-shard_mb64.0/tokens/iolib-pyarrow
    ... --shuffle-window 40000000     # a window below the corpus: chunks of row groups
    ... --timeline                    # when each ranged load, decode and build ended
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_peers as bp  # noqa: E402


@click.command()
@click.option("--data", type=click.Path(exists=True, file_okay=False), required=True,
              help="The folder of the tokens Parquet files (bench_peers.py's data).")  # fmt: skip
@click.option("--shuffle-window", default=0, help="PackedTokens(shuffle_window=) (0: default).")
@click.option("--seed", default=0)
@click.option("--workers", default=2)
@click.option("--batch", default=16)
@click.option("--seq-len", default=2048)
@click.option("--timeline", is_flag=True,
              help="Print when each ranged load, row-group fetch (load and decode), segment "
              "build and batch read began and ended (s, per thread).")  # fmt: skip
def main(
    data: str, shuffle_window: int, seed: int, workers: int, batch: int, seq_len: int,
    timeline: bool,
):  # fmt: skip
    events = _timers() if timeline else None
    try:
        _probe(data, shuffle_window, seed, workers, batch, seq_len)
    finally:
        for event in sorted(events or [], key=lambda e: e[2])[:40]:
            print(*event)


def _timers() -> list:
    """Wrap the reads' steps with timers: (what, thread, began s, ended s) each call."""
    import functools
    import threading

    from iolib.sources import parquet_fetch, ranges
    from iolib.text import packed_reader

    began, events = time.perf_counter(), []

    def wrap(owner: type, name: str, what: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            at = time.perf_counter() - began
            try:
                return fn(*args, **kwargs)
            finally:
                events.append((what, threading.current_thread().name, round(at, 2),
                               round(time.perf_counter() - began, 2)))  # fmt: skip

        setattr(owner, name, timed)

    wrap(ranges.RangedFile, "load", "ranged load")
    wrap(parquet_fetch.RowGroupFetcher, "fetch", "fetch (load + decode)")
    wrap(packed_reader.TokenReader, "_load", "row group (fetch + build)")
    wrap(packed_reader.TokenReader, "read", "batch read")
    return events


def _probe(data: str, shuffle_window: int, seed: int, workers: int, batch: int, seq_len: int):
    with bp.throttled_store(0.04, 5.0, 20.0) as store:
        bp.upload(store["direct"], data, "tokens/probe")
        bp.index_beside(store["direct"], "tokens/probe")
        os.environ["IOLIB_CACHE_DIR"] = tempfile.mkdtemp()
        import iolib
        from iolib.text import PackedTokens

        def stats() -> dict:
            return bp.proxy_call(store["proxy"], "stats")

        bp.proxy_call(store["proxy"], "reset")
        options = {"endpoint_url": store["proxy"], "key": "testing", "secret": "testing"}
        window = {"shuffle_window": shuffle_window} if shuffle_window else {}
        marks, began = [], time.perf_counter()

        def mark(what: str) -> None:
            marks.append((what, time.perf_counter() - began, stats()))

        source = PackedTokens(f"s3://{bp.BUCKET}/tokens/probe/*.parquet", column="tokens",
                              seq_len=seq_len, eos_id=0, storage_options=options,
                              document_ids=True, **window)  # fmt: skip
        mark("constructed")
        len(source)
        mark("index loaded")
        loader = iolib.DataLoader(source, batch_size=batch, shuffle=True, seed=seed,
                                  num_workers=workers)  # fmt: skip
        it = iter(loader)
        mark("iterator")
        seen, stop = [], threading.Event()

        def poll() -> None:
            while not stop.wait(0.2):
                seen.append((round(time.perf_counter() - began, 2), stats()["bytes"] / 1e6))

        threading.Thread(target=poll, daemon=True).start()
        first = next(it)
        mark("first batch")
        stop.set()
        starts = source.parquet.row_starts()
        needs = [first] + [next(it) for _ in range(3)]
        del it
        for what, at, counted in marks:
            print(f"{what:13s} {at:6.2f} s  {json.dumps(counted)}")
        arrivals = [x for i, x in enumerate(seen) if i == 0 or x[1] != seen[i - 1][1]]
        print("MB arrived (s, MB):", [(t, round(mb, 1)) for t, mb in arrivals])
        for k, b in enumerate(needs):
            docs = np.unique(b["document_ids"].numpy())
            groups = np.unique(np.searchsorted(starts, docs[docs >= 0], side="right") - 1)
            print(f"batch {k} reads row groups {groups.tolist()} of {starts.size - 1}")
        print("stored bytes of each row group's file:",
              [p.stat().st_size for p in sorted(Path(data).glob("*.parquet"))])  # fmt: skip


if __name__ == "__main__":
    main()
