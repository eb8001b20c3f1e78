"""CPU, page faults and context switches of whole token epochs served from the cache,
one process, local files: the counts that survive a loaded machine, beside the rate.

A warm-up epoch cut after its first batch (the row groups are read and kept), then
`--epochs` whole epochs of the same loader (2 thread workers, batch 16, seq_len 2048, as
`bench_peers.py --workload tokens`); for each: wall s, M tokens/s, user and system CPU
s, minor faults, voluntary/involuntary switches (this process), the machine's huge-page
faults and compaction stalls (/proc/vmstat), and the calls to `trim_heap` with their
CPU. Prints one JSON line. Run it from another checkout's tree with `--iolib-path`:

    .venv/bin/python benchmarks/probe_token_epochs.py --epochs 3 --iolib-path /work/wt/base \\
        --data benchmarks/data/peers/tokens24000000-images2000-shard_mb64.0/tokens/iolib-pyarrow
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

import click


def _vmstat() -> dict:
    keep = ("thp_fault_alloc", "compact_stall")
    try:
        with open("/proc/vmstat") as f:
            return {k: int(v) for k, v in (line.split() for line in f) if k in keep}
    except OSError:
        return {}


def _pss_mb() -> int:
    try:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) // 1024 for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


@click.command()
@click.option("--data", type=click.Path(exists=True, file_okay=False), required=True)
@click.option("--epochs", default=3)
@click.option("--iolib-path", default="", help="A checkout whose iolib/ is imported.")
def main(data: str, epochs: int, iolib_path: str) -> None:
    if iolib_path:
        sys.path.insert(0, iolib_path)
    import torch

    torch.set_num_threads(1)
    import iolib
    import iolib.decode.heap as heap
    from iolib.text import PackedTokens

    looks = {"calls": 0, "cpu_s": 0.0}
    real = heap.trim_heap

    def counted(*args):  # the loader's workers call it positionally
        began = time.thread_time()
        try:
            return real(*args)
        finally:
            looks["calls"] += 1
            looks["cpu_s"] += time.thread_time() - began

    heap.trim_heap = counted
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.wait(0.1):
            peak[0] = max(peak[0], _pss_mb())

    threading.Thread(target=sample, daemon=True).start()
    windows = PackedTokens(f"{data}/*.parquet", column="tokens", seq_len=2048, eos_id=0)
    loader = iolib.DataLoader(windows, batch_size=16, shuffle=True, seed=0, num_workers=2)
    began = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - began
    del iterator
    out = []
    for _ in range(epochs):
        looks.update(calls=0, cpu_s=0.0)
        used, kernel, start = (
            resource.getrusage(resource.RUSAGE_SELF),
            _vmstat(),
            time.perf_counter(),
        )
        tokens = sum(int(b["input_ids"].numel()) for b in loader)
        wall = time.perf_counter() - start
        after, kernel_after = resource.getrusage(resource.RUSAGE_SELF), _vmstat()
        out.append({
            "wall_s": wall, "rate_m": tokens / wall / 1e6,
            "user_s": after.ru_utime - used.ru_utime, "sys_s": after.ru_stime - used.ru_stime,
            "minor_faults": after.ru_minflt - used.ru_minflt,
            "voluntary": after.ru_nvcsw - used.ru_nvcsw,
            "involuntary": after.ru_nivcsw - used.ru_nivcsw,
            **{k: kernel_after[k] - kernel.get(k, 0) for k in kernel_after},
            "trim_heap_calls": looks["calls"], "trim_heap_cpu_s": looks["cpu_s"],
        })  # fmt: skip
    stop.set()
    where = os.path.dirname(iolib.__file__)
    print(json.dumps({"iolib": where, "first_batch_s": first, "peak_pss_mb": peak[0],
                      "load": os.getloadavg()[0], "epochs": out}))  # fmt: skip


if __name__ == "__main__":
    main()
