"""What `iolib bench` prints and draws from observations: the summary table, the verdict
and PNG plots."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

LEGEND = (
    "samples/s, MB/s (stored bytes): after the first batch; median (min-max) over repeats. "
    "stall: share of time waiting in next(); util: step/(step+stall), the share of time a GPU "
    "would compute (- with --step-ms 0: no step, nothing to keep busy); "
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
            _fmt_range([r["utilization"] for r in rs], ".2f") if r0["step_ms"] > 0 else "-",
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


# Below this many repeats there is no spread to judge a ratio by.
MIN_REPEATS_FOR_SPREAD = 3
UNITS = {"images": "images/s", "tokens": "sequences/s"}
PROFILE_WORDS = {"local": "local disk", "memory": "memory", "nvme": "a simulated NVMe SSD",
                 "nas": "a simulated NAS", "object-store": "a simulated object store (S3-like)",
                 "custom": "the custom throttle", "s3": "moto's S3 server"}  # fmt: skip


def _spread(values: list[float]) -> tuple[float, float, float]:
    return float(np.median(values)), float(min(values)), float(max(values))


def _num(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _costs(iolib: list[dict[str, Any]], torch: list[dict[str, Any]]) -> str:
    """What the throughput does not say: peak memory of the process tree, the time to the
    first batch and the bytes read, iolib's against torch's (medians of the repeats)."""

    def med(rows: list[dict[str, Any]], name: str) -> float:
        return float(np.median([r[name] for r in rows]))

    mem = [med(rows, "peak_rss_bytes") / 2**20 for rows in (iolib, torch)]
    first = [med(rows, "first_batch_s") for rows in (iolib, torch)]
    text = (
        f" Peak memory {mem[0]:,.0f} MiB for iolib against {mem[1]:,.0f} MiB for torch; "
        f"first batch after {first[0]:.2f} s against {first[1]:.2f} s"
    )
    if all(r.get("tree_read_bytes", -1) >= 0 for r in iolib + torch):
        read = [med(rows, "tree_read_bytes") / 1e6 for rows in (iolib, torch)]
        text += f"; {read[0]:,.0f} MB read against {read[1]:,.0f} MB"
    return text + "."


def verdict(rows: list[dict[str, Any]], baseline: str | None = None) -> str:
    """A paragraph a first-time reader can act on: per workload and storage, iolib's
    throughput against torch's with the spread over repeats, what a GPU step would see,
    and a warning where the spread makes the ratio unreliable. `baseline` says what
    torch's Dataset read (harness.TORCH_READS), so no ratio stands without its baseline."""
    sentences = []

    def key(r: dict[str, Any]) -> tuple:
        return (r["workload"], r["storage_profile"], r["step_ms"], r["workers"], r["batch_size"])

    for workload, profile, step, workers, batch in sorted({key(r) for r in rows}):
        sel = [r for r in rows if key(r) == (workload, profile, step, workers, batch)]
        by = {lo: [r for r in sel if r["loader"] == lo] for lo in ("iolib", "torch")}
        if not by["iolib"] or not by["torch"]:
            continue
        unit = UNITS.get(workload.split("-")[0], "samples/s")
        io_, to = (_spread([r["throughput_sps"] for r in by[lo]]) for lo in ("iolib", "torch"))
        ratio = io_[0] / to[0] if to[0] else float("inf")
        where = PROFILE_WORDS.get(profile, profile)
        text = (
            f"On {where}, iolib delivered {ratio:.1f}x torch's {unit} ({workload}, "
            f"{workers} worker{'s' if workers != 1 else ''}, batch {batch}: iolib "
            f"{_num(io_[0])} [{_num(io_[1])}-{_num(io_[2])}], torch {_num(to[0])} "
            f"[{_num(to[1])}-{_num(to[2])}], median [min-max] of {len(by['iolib'])} runs)"
        )
        if step > 0:
            iu, tu = (float(np.median([r["utilization"] for r in by[lo]])) for lo in by)
            text += (
                f"; with a {step:g} ms training step a GPU would be busy {iu:.0%} of the time "
                f"fed by iolib vs {tu:.0%} by torch"
            )
            if min(iu, tu) >= 0.95:
                text += " (both keep up: the step, not the loader, sets the pace here)"
            else:
                text += (
                    " (the loader, not the step, sets the pace here: a batch takes "
                    f"{step / max(iu, 1e-9):.0f} ms with iolib against {step / max(tu, 1e-9):.0f} "
                    "ms with torch)"
                )
        else:
            text += "; with no training step (--step-ms 0) this is the loaders flat out"
        text += "." + _costs(by["iolib"], by["torch"])
        repeats = min(len(by["iolib"]), len(by["torch"]))
        if repeats < MIN_REPEATS_FOR_SPREAD:
            text += (
                f" Only {repeats} run(s) each: no spread was measured, and on a shared machine "
                "a ratio can move by 2x between identical runs; use --repeats 3 or more."
            )
        elif io_[1] <= to[2] and to[1] <= io_[2]:
            text += (
                " The two ranges overlap, so the difference is within run-to-run noise: "
                "read this ratio as unreliable (more --repeats or --batches narrow it)."
            )
        sentences.append(text)
    if not sentences:
        return ""
    if baseline:
        sentences.insert(
            0, f"Baseline: torch's DataLoader over {baseline}; shard-streaming loaders "
            "(MosaicML streaming, litdata, WebDataset) are not measured here."
        )  # fmt: skip
    return "Verdict: " + " ".join(sentences)


def _worker_label(loader: str, workers: int) -> str:
    return f"{loader}, {workers} worker{'s' if workers != 1 else ''}"


def plot(rows: list[dict[str, Any]], out_dir: str) -> list[str]:
    """Throughput and utilization against depth (one line per loader x workers), one PNG
    per (workload, storage profile); bars where every series has a single depth, a log
    axis only where the values span more than 10x, no utilization without a step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    panels = sorted({(r["workload"], r["storage_profile"]) for r in rows})
    for workload, profile in panels:
        sel = [r for r in rows if (r["workload"], r["storage_profile"]) == (workload, profile)]
        with_step = any(r["step_ms"] > 0 for r in sel)
        columns = ("throughput_sps", "utilization") if with_step else ("throughput_sps",)
        fig, axes = plt.subplots(1, len(columns), figsize=(5 * len(columns), 4), squeeze=False)
        axes = axes[0]
        series = sorted({(r["loader"], r["workers"]) for r in sel})
        single = all(len({r["depth"] for r in sel if (r["loader"], r["workers"]) == key}) == 1
                     for key in series)  # fmt: skip
        unit = UNITS.get(workload.split("-")[0], "samples/s")
        for ax, col in zip(axes, columns, strict=True):
            values = []
            for k, (loader, workers) in enumerate(series):
                pts = [r for r in sel if (r["loader"], r["workers"]) == (loader, workers)]
                depths = sorted({r["depth"] for r in pts})
                ys = [float(np.median([r[col] for r in pts if r["depth"] == d])) for d in depths]
                lows = [min(r[col] for r in pts if r["depth"] == d) for d in depths]
                highs = [max(r[col] for r in pts if r["depth"] == d) for d in depths]
                err = [np.subtract(ys, lows), np.subtract(highs, ys)]
                values += lows + highs
                label = _worker_label(loader, workers)
                if single:
                    ax.bar(k, ys[0], yerr=[[err[0][0]], [err[1][0]]], capsize=4, label=label,
                           color="tab:blue" if loader == "iolib" else "tab:gray")  # fmt: skip
                else:
                    style = "-o" if loader == "iolib" else "--s"
                    ax.errorbar(depths, ys, yerr=err, fmt=style, capsize=3, label=label)
            positive = [v for v in values if v > 0]
            if col == "throughput_sps" and positive and max(positive) > 10 * min(positive):
                ax.set_yscale("log")
            if single:
                ax.set_xticks(range(len(series)), [_worker_label(*s) for s in series])
            else:
                ax.set_xlabel("prefetch depth (batches in flight or ready)")
            ax.set_ylabel(unit if col == "throughput_sps" else "GPU busy (step / (step + stall))")
            if col == "utilization":
                ax.set_ylim(0, 1.05)
            ax.grid(alpha=0.3, axis="y")
        axes[0].legend(fontsize=8)
        steps = sorted({r["step_ms"] for r in sel})
        fig.suptitle(f"{workload} on {PROFILE_WORDS.get(profile, profile)}; step "
                     f"{', '.join(f'{s:g}' for s in steps)} ms; bars/points: median, "
                     "whiskers: min-max over repeats", fontsize=9)  # fmt: skip
        fig.tight_layout()
        path = os.path.join(out_dir, f"{workload}_{profile}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
