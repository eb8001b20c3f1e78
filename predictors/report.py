"""The tuning report: Markdown and HTML, with PNG plots, from plain numbers.

Written for a reader who has never heard of the model: what to set, what it will do,
how sure we are, and how we know. Input is plain data (dicts and DataFrames), so the
loader side (`iolib tune`) only has to collect numbers.

Example:
    >>> paths = write_report("out/", recommendation, candidates, importances, step_ms=50)
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["render_markdown", "write_report"]


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:,.0f} MiB"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def render_markdown(
    recommendation: dict[str, Any],
    candidates: pd.DataFrame,
    importances: pd.Series | None = None,
    *,
    step_ms: float,
    target: float,
    plots: dict[str, str] | None = None,
) -> str:
    """The report as Markdown.

    `recommendation`: workers, depth, reason, feasible, bottleneck, and predicted_/measured_
    utilization, throughput_sps, memory_bytes (measured_* may be None when not verified).
    `candidates`: workers, depth, predicted_utilization and optionally measured_utilization.
    """
    r = recommendation
    w, d = int(r["workers"]), int(r["depth"])
    lines = [
        "# Data-loading tuning report",
        "",
        f"Goal: keep the training step ({step_ms:g} ms per batch) busy at least "
        f"{target:.0%} of the time, holding as little memory as possible.",
        "",
        "## Recommendation",
        "",
        f"**{w} workers, prefetch depth {d}** (depth: batches being built or waiting).",
        "",
        f"Why: {r.get('reason', '')}",
        "",
    ]
    if not r.get("feasible", True):
        lines += [
            f"**The target is out of reach** with this memory budget; the slowest stage is "
            f"**{r.get('bottleneck')}**. This is the best configuration found; to go further, "
            "speed up that stage (faster storage or caching for storage, fewer/cheaper "
            "transforms or more cores for decode and transform; for cpu, the reads "
            "themselves: more cores, or a cheaper column type to parse).",
            "",
        ]
    lines += [
        "| | predicted | measured |",
        "| --- | --- | --- |",
        f"| GPU utilization | {_num(r.get('predicted_utilization'))} | "
        f"{_num(r.get('measured_utilization'))} |",
        f"| samples/s | {_num(r.get('predicted_throughput_sps'), '{:,.0f}')} | "
        f"{_num(r.get('measured_throughput_sps'), '{:,.0f}')} |",
        f"| memory held | {_mib(r.get('predicted_memory_bytes'))} | "
        f"{_mib(r.get('measured_memory_bytes'))} |",
        "",
        "## How to apply it",
        "",
        "```python",
        f"loader = DataLoader(dataset, batch_size=..., num_workers={w}, prefetch={d})",
        "# or let the loader keep adjusting on its own:",
        f'loader = DataLoader(dataset, batch_size=..., prefetch="auto", '
        f"target_utilization={target})",
        "```",
        "",
        "## How the prediction was made",
        "",
        "A model trained on measured runs of other datasets and storage predicts, for each "
        "candidate (workers, depth), how often the training step would wait for data. "
        "It uses only numbers measured before running (sample size, decode cost, storage "
        "latency and bandwidth, batch size, step time, cores), never the result itself. "
        "A short measured run then checks the recommendation.",
        "",
    ]
    if plots and "candidates" in plots:
        lines += [f"![predicted vs measured]({plots['candidates']})", ""]
    shown = candidates.sort_values(["depth", "workers"]).head(40)
    cols = [
        c
        for c in (
            "workers",
            "depth",
            "predicted_utilization",
            "measured_utilization",
            "predicted_memory_bytes",
        )
        if c in shown
    ]
    lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for _, row in shown.iterrows():
        lines.append(
            "| "
            + " | ".join(
                _mib(row[c])
                if c.endswith("bytes")
                else _num(row[c], "{:g}")
                if c in ("workers", "depth")
                else _num(row[c])
                for c in cols
            )
            + " |"
        )
    lines.append("")
    if importances is not None and len(importances):
        lines += [
            "## What drives the prediction",
            "",
            "How much the model's accuracy drops when one input is scrambled "
            "(permutation importance; larger matters more):",
            "",
        ]
        if plots and "importances" in plots:
            lines += [f"![feature importances]({plots['importances']})", ""]
        lines += ["| input | importance |", "| --- | --- |"]
        lines += [f"| {k} | {v:.3f} |" for k, v in importances.head(10).items()]
        lines.append("")
    return "\n".join(lines)


def _plots(
    out: Path, candidates: pd.DataFrame, importances: pd.Series | None, target: float
) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = {}
    fig, ax = plt.subplots(figsize=(5, 4))
    if "measured_utilization" in candidates:
        ax.scatter(candidates["measured_utilization"], candidates["predicted_utilization"], s=18)
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set_xlabel("measured utilization")
    else:
        for depth, part in candidates.groupby("depth"):
            ax.plot(
                part["workers"], part["predicted_utilization"], marker="o", label=f"depth {depth}"
            )
        ax.set_xlabel("workers")
        ax.legend(fontsize=7)
    ax.axhline(target, color="r", lw=1, label="target")
    ax.set_ylabel("predicted utilization")
    ax.set_title("Candidates: predicted vs measured")
    fig.tight_layout()
    fig.savefig(out / "candidates.png", dpi=100)
    plt.close(fig)
    made["candidates"] = "candidates.png"
    if importances is not None and len(importances):
        top = importances.head(10)[::-1]
        fig, ax = plt.subplots(figsize=(5, 4))
        ax.barh(top.index, top.to_numpy())
        ax.set_xlabel("permutation importance")
        fig.tight_layout()
        fig.savefig(out / "importances.png", dpi=100)
        plt.close(fig)
        made["importances"] = "importances.png"
    return made


def write_report(
    out_dir: str | Path,
    recommendation: dict[str, Any],
    candidates: pd.DataFrame,
    importances: pd.Series | None = None,
    *,
    step_ms: float,
    target: float,
) -> dict[str, Path]:
    """Write report.md, report.html and the PNG plots into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = _plots(out, candidates, importances, target)
    md = render_markdown(
        recommendation, candidates, importances, step_ms=step_ms, target=target, plots=plots
    )
    (out / "report.md").write_text(md)
    body = "\n".join(_md_line_to_html(line) for line in md.splitlines())
    (out / "report.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>Tuning report</title>"
        "<style>body{font-family:sans-serif;max-width:50em;margin:auto}"
        "td,th{padding:2px 8px}</style>\n" + body
    )
    return {
        "markdown": out / "report.md",
        "html": out / "report.html",
        **{k: out / v for k, v in plots.items()},
    }


def _md_line_to_html(line: str) -> str:
    """A deliberately small Markdown subset: headings, images, table rows, code, text."""
    if line.startswith("#"):
        level = len(line) - len(line.lstrip("#"))
        return f"<h{level}>{html.escape(line[level:].strip())}</h{level}>"
    if line.startswith("!["):
        src = line[line.index("(") + 1 : -1]
        return f"<img src='{html.escape(src)}' alt=''>"
    if line.startswith("|"):
        if set(line) <= set("|- "):
            return ""
        cells = "".join(
            f"<td>{html.escape(c.strip().strip('*'))}</td>" for c in line.strip("|").split("|")
        )
        return f"<table><tr>{cells}</tr></table>"
    if line.startswith("```"):
        return ""
    return f"<p>{html.escape(line).replace('**', '')}</p>" if line else ""
