"""Reading observations: the summary table printed by `iolib bench`, and PNG plots."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

LEGEND = (
    "samples/s, MB/s (stored bytes): after the first batch; median (min-max) over repeats. "
    "stall: share of time waiting in next(); util: step/(step+stall) (0 when --step-ms 0); "
    "p50/p99: wait per batch; 1st s: time to first batch; RSS: peak over the process tree; "
    "inflight: peak bytes held by the loader (torch: depth x batch); "
    "vs torch: samples/s ratio at equal workers."
)
KEY = ("workload", "storage_profile", "batch_size", "step_ms", "shuffle", "cache", "workers")


def _group(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in (*KEY, "loader", "config_id")), []).append(r)
    return groups


def _fmt_range(values: list[float], fmt: str) -> str:
    values = [v for v in values if v == v]  # drop NaN
    if not values:
        return "-"
    med = format(float(np.median(values)), fmt)
    if len(values) == 1:
        return med
    return f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def summary_table(rows: list[dict[str, Any]]) -> str:
    """One line per configuration: median (min-max over repeats), and iolib/torch ratios."""
    head = ["workload", "storage", "loader", "wk", "depth", "samples/s", "MB/s", "stall",
            "util", "p50 ms", "p99 ms", "1st s", "RSS MB", "CPU%", "inflight MB",
            "vs torch"]  # fmt: skip
    torch_sps: dict[tuple, float] = {}
    groups = _group(rows)
    for (*key, loader, _), rs in groups.items():
        if loader == "torch":
            torch_sps[tuple(key)] = float(np.median([r["throughput_sps"] for r in rs]))
    lines = []
    for (*key, loader, _), rs in groups.items():
        r0 = rs[0]
        ratio = "-"
        base = torch_sps.get(tuple(key))
        if loader == "iolib" and base:
            ratio = f"{np.median([r['throughput_sps'] for r in rs]) / base:.1f}x"
        lines.append([
            r0["workload"], r0["storage_profile"], loader, str(r0["workers"]), str(r0["depth"]),
            _fmt_range([r["throughput_sps"] for r in rs], ".0f"),
            _fmt_range([r["mb_per_s"] for r in rs], ".1f"),
            _fmt_range([r["stall_fraction"] for r in rs], ".2f"),
            _fmt_range([r["utilization"] for r in rs], ".2f"),
            _fmt_range([r["p50_batch_ms"] for r in rs], ".1f"),
            _fmt_range([r["p99_batch_ms"] for r in rs], ".1f"),
            _fmt_range([r["first_batch_s"] for r in rs], ".2f"),
            _fmt_range([r["peak_rss_bytes"] / 2**20 for r in rs], ".0f"),
            _fmt_range([r["cpu_percent"] for r in rs], ".0f"),
            _fmt_range([r["memory_bytes"] / 2**20 for r in rs], ".1f"),
            ratio,
        ])  # fmt: skip
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], out_dir: str) -> list[str]:
    """Throughput and utilization against depth (one line per loader x workers), one PNG
    per (workload, storage profile)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    panels = sorted({(r["workload"], r["storage_profile"]) for r in rows})
    for workload, profile in panels:
        sel = [r for r in rows if (r["workload"], r["storage_profile"]) == (workload, profile)]
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for loader, workers in sorted({(r["loader"], r["workers"]) for r in sel}):
            pts = [r for r in sel if (r["loader"], r["workers"]) == (loader, workers)]
            depths = sorted({r["depth"] for r in pts})
            for ax, col in zip(axes, ("throughput_sps", "utilization"), strict=True):
                ys = [np.median([r[col] for r in pts if r["depth"] == d]) for d in depths]
                style = "-o" if loader == "iolib" else "--s"
                ax.plot(depths, ys, style, label=f"{loader}, {workers} workers")
        for ax, label in zip(axes, ("samples/s", "utilization = step/(step+stall)"), strict=True):
            ax.set_xlabel("prefetch depth (batches)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        axes[0].set_yscale("log")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{workload} on {profile}")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{workload}_{profile}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
