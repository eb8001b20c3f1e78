"""Soak: several epochs with the learned tuner on, throttled storage with injected faults.

Measures the process's RSS (with any worker processes) over time and the loader's bytes
in flight, and checks that every epoch delivers each sample exactly once. Writes
``benchmarks/results/soak.md`` and ``soak.png`` (RSS and bytes in flight over time).

    python benchmarks/soak.py --minutes 3
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iolib import DataLoader
from iolib.base.resources import parse_bytes
from iolib.sources import ParquetSource
from iolib.storage import RetryPolicy, wrap_url

FAULTS = {"error_rate": 0.02, "truncate_rate": 0.01, "slow_rate": 0.01, "slow_ms": 200}
THROTTLE = {"latency_ms": 20.0, "bandwidth_mbps": 50.0, "jitter": 0.3}


def write_dataset(root: Path, rows: int, seq_len: int, files: int, group: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for f in range(files):
        ids = np.arange(bounds[f], bounds[f + 1], dtype=np.int64)
        tokens = (ids[:, None] * 31 + np.arange(seq_len)).astype(np.int32) % 50_000
        table = pa.table({
            "id": ids,
            "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), seq_len),
        })  # fmt: skip
        pq.write_table(table, root / f"part-{f:03d}.parquet", row_group_size=group)


def rss_bytes() -> int:
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total


class Sampler(threading.Thread):
    """RSS every `period` seconds, in the background."""

    def __init__(self, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.period, self.samples = period, []
        self.start_time = time.monotonic()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.monotonic() - self.start_time, rss_bytes()))
            self.stop.wait(self.period)


def run(args: SimpleNamespace) -> dict:
    budget = parse_bytes(args.memory_budget)
    with tempfile.TemporaryDirectory(prefix="iolib-soak-") as tmp:
        root = Path(tmp) / "data"
        write_dataset(root, args.rows, args.seq_len, args.files, args.row_group)
        url, options = wrap_url(f"file://{root}", None, "throttled", {**THROTTLE, "seed": 0})
        url, options = wrap_url(url, options, "faulty", {**FAULTS, "seed": 1, "shared": True})
        timeout = None if args.timeout_s <= 0 else args.timeout_s
        policy = RetryPolicy(attempts=8, base_delay_s=0.01, max_delay_s=0.2, timeout_s=timeout)
        # A row-group cache far smaller than the dataset: every epoch reads from storage.
        source = ParquetSource(url, storage_options=options, retry=policy,
                               cache_bytes=int(args.cache_mib * 2**20))  # fmt: skip
        loader = DataLoader(source, batch_size=args.batch_size, shuffle="block", seed=0,
                            shuffle_window=args.window,
                            num_workers=args.max_workers,
                            prefetch="auto" if args.prefetch == "auto" else int(args.prefetch),
                            target_utilization=0.9, memory_budget=budget)  # fmt: skip
        sampler = Sampler()
        sampler.start()
        deadline = time.monotonic() + 60 * args.minutes
        epochs, inflight, lost, repeated, epoch_ends = [], [], 0, 0, []
        window_max, window_end = 0, 0.0  # bytes in flight: the max of each 0.5 s window
        while time.monotonic() < deadline or not epochs:
            loader.set_epoch(len(epochs))
            seen: Counter = Counter()
            started = time.monotonic()
            for batch in loader:
                seen.update(batch["id"].tolist())
                time.sleep(args.step_ms / 1000)  # the training step
                now = time.monotonic() - sampler.start_time
                window_max = max(window_max, loader.stats()["bytes_in_flight"])
                if now >= window_end:  # a bounded record, so the soak measures iolib, not itself
                    inflight.append((now, window_max))
                    window_max, window_end = 0, now + sampler.period
            lost += args.rows - len(seen)
            repeated += sum(c - 1 for c in seen.values())
            stats = loader.stats()
            epochs.append({"epoch": len(epochs), "seconds": time.monotonic() - started,
                           "workers": stats["workers"], "depth": stats["depth"]})  # fmt: skip
            epoch_ends.append(time.monotonic() - sampler.start_time)
        sampler.stop.set()
        sampler.join()
        final = loader.stats()
        loader.close()
    return dict(args=args, budget=budget, rss=sampler.samples, inflight=inflight,
                epochs=epochs, epoch_ends=epoch_ends, lost=lost, repeated=repeated,
                stats=final)  # fmt: skip


def summarise(r: dict) -> dict:
    t = np.array([s[0] for s in r["rss"]])
    rss = np.array([s[1] for s in r["rss"]], dtype=float) / 2**20
    warm = r["epoch_ends"][0]  # after the first epoch: caches full, tuner settled
    after = t >= warm
    slope = float(np.polyfit(t[after], rss[after], 1)[0] * 60) if after.sum() > 2 else 0.0
    return {
        "rss_warm_mib": float(rss[after][0]) if after.any() else float(rss[-1]),
        "rss_end_mib": float(rss[-1]),
        "rss_max_mib": float(rss.max()),
        "rss_slope_mib_per_min": slope,
        "peak_in_flight_mib": r["stats"]["peak_bytes_in_flight"] / 2**20,
        "max_sampled_in_flight_mib": max((b for _, b in r["inflight"]), default=0) / 2**20,
        "budget_mib": r["budget"] / 2**20,
    }


def write_report(r: dict, s: dict, out: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([x for x, _ in r["rss"]], [y / 2**20 for _, y in r["rss"]], label="RSS (MiB)")
    ax.plot([x for x, _ in r["inflight"]], [y / 2**20 for _, y in r["inflight"]],
            label="bytes in flight (MiB)", alpha=0.6)  # fmt: skip
    ax.axhline(s["budget_mib"], color="red", linestyle="--", label="memory budget")
    for end in r["epoch_ends"]:
        ax.axvline(end, color="grey", alpha=0.3)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.legend()
    ax.set_title("iolib soak: RSS and bytes in flight (grey: epoch ends)")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=100)
    st, a = r["stats"], r["args"]
    tuner = st.get("tuner") or {}
    lines = [
        "# Soak: epochs with the tuner on, throttled storage with faults",
        "",
        f"Command: `{command}`",
        "",
        f"Dataset: {a.rows} rows x {a.seq_len} int32 tokens in {a.files} Parquet files, row "
        f"groups of {a.row_group}; batch {a.batch_size}, step {a.step_ms} ms, shuffle=block "
        f"(window {a.window}), "
        f"prefetch='auto', target_utilization=0.9, memory_budget={a.memory_budget}, "
        f"row-group cache {a.cache_mib:g} MiB (the dataset is "
        f"{a.rows * a.seq_len * 4 / 2**20:.0f} MiB: every epoch reads from storage).",
        f"Storage: `faulty::throttled::file://` with {FAULTS} and {THROTTLE}.",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| epochs | {len(r['epochs'])} |",
        f"| batches | {st['batches']} |",
        f"| samples | {st['samples']} |",
        f"| samples lost / repeated | {r['lost']} / {r['repeated']} |",
        f"| retries (transient faults survived) | {st['retries']} |",
        f"| skipped | {st['skipped']} |",
        f"| RSS after warm-up (end of epoch 0) | {s['rss_warm_mib']:.0f} MiB |",
        f"| RSS at the end | {s['rss_end_mib']:.0f} MiB |",
        f"| RSS max | {s['rss_max_mib']:.0f} MiB |",
        f"| RSS slope after warm-up | {s['rss_slope_mib_per_min']:+.1f} MiB/min |",
        f"| peak bytes in flight | {s['peak_in_flight_mib']:.1f} MiB "
        f"(budget {s['budget_mib']:.0f} MiB) |",
        f"| final workers / depth | {st['workers']} / {st['depth']} |",
        f"| utilization (last 64 batches) | {st['utilization']:.2f} |",
        f"| tuner | {tuner.get('tuner')}, {len(tuner.get('decisions', []))} decisions; "
        f"last reason: {str(tuner.get('reason'))[:160]} |",
        "",
        "| epoch | seconds | workers | depth |",
        "| --- | --- | --- | --- |",
        *[f"| {e['epoch']} | {e['seconds']:.1f} | {e['workers']} | {e['depth']} |"
          for e in r["epochs"]],
        "",
        "![RSS and bytes in flight](soak.png)",
        "",
    ]  # fmt: skip
    (out / "soak.md").write_text("\n".join(lines))


@click.command(help=__doc__.splitlines()[0])
@click.option("--minutes", type=float, default=3.0, help="run time (default 3)")
@click.option("--rows", type=int, default=20_000, show_default=True)
@click.option("--seq-len", type=int, default=1024, show_default=True)
@click.option(
    "--cache-mib", type=float, default=32.0, show_default=True, help="row-group cache bound"
)
@click.option("--files", type=int, default=4, show_default=True)
@click.option("--row-group", type=int, default=500, show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--window", type=int, default=4, show_default=True, help="shuffle window, row groups")
@click.option("--step-ms", type=float, default=5.0, show_default=True)
@click.option("--max-workers", type=int, default=4, show_default=True)
@click.option("--memory-budget", default="256MiB", show_default=True)
@click.option("--prefetch", default="auto", help="'auto' (the tuner) or a depth")
@click.option("--timeout-s", type=float, default=30.0, help="per request; 0: none")
@click.option("--out", default=str(Path(__file__).parent / "results"), show_default=True)
def main(**options: object) -> None:
    """Run the soak; exit status 1 if a sample was lost or memory went over budget."""
    args = SimpleNamespace(**options)
    command = "python benchmarks/soak.py " + " ".join(sys.argv[1:])
    result = run(args)
    summary = summarise(result)
    write_report(result, summary, Path(args.out), command.strip())
    print(Path(args.out, "soak.md").read_text())
    ok = result["lost"] == 0 and summary["peak_in_flight_mib"] <= summary["budget_mib"]
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
