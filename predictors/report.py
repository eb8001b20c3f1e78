"""The tuning report: Markdown and HTML, with a PNG plot, from plain numbers.

Written for a reader who has never heard of the model: what to set, what it measured,
whether the target was met (and if not, why), and what drives the result for this
dataset. The report is built once as sections of paragraphs and tables, then written
both as Markdown and as HTML (escaped, one `<table>` per table), so neither is parsed
from the other.

Example:
    >>> paths = write_report("out/", recommendation, measured, drivers, step_ms=50, target=0.9)
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Section", "build_sections", "render_html", "render_markdown", "write_report"]


@dataclass
class Section:
    """A heading, paragraphs, and tables (a header row, then rows of text cells)."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[list[str], list[list[str]]]] = field(default_factory=list)
    code: str | None = None
    image: str | None = None


def _mib(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x / 2**10:,.0f} KiB" if x < 2**20 else f"{x / 2**20:,.1f} MiB"


def _workers(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None or not math.isfinite(float(x)) else fmt.format(x)


def _verdict(r: dict[str, Any], target: float) -> str:
    w, d, util = r["workers"], r["depth"], r["measured_utilization"]
    if r["meets_target"]:
        return (
            f"**{_workers(w)}, prefetch depth {d}**: measured {util:.2f} against the target "
            f"{target:.2f}, the least memory of the configurations measured to meet it."
        )
    why = r.get("why_missed") or "no configuration measured reached it"
    return (
        f"**Target missed: {target:.2f} was not met.** The configuration recommended is "
        f"**{_workers(w)}, prefetch depth {d}** at {util:.2f}. Why: {why}."
    )


def _snippet(r: dict[str, Any], target: float) -> str:
    """The loader as measured: every setting the runs used, then the tuned alternative."""
    args = dict(r.get("loader_args") or {"batch_size": "..."})
    fixed = {**args, "num_workers": str(r["workers"]), "prefetch": str(r["depth"])}
    auto = {**args, "prefetch": '"auto"', "target_utilization": f"{target}"}

    def call(values: dict[str, str]) -> str:
        inner = "".join(f"    {k}={v},\n" for k, v in values.items())
        return f"loader = DataLoader(\n    dataset,\n{inner})"

    head = "from iolib.decode.images import ImagePipeline\n\n" if "decode" in args else ""
    return head + call(fixed) + "\n# or let the loader keep adjusting on its own:\n" + call(auto)


def _range(row: Any) -> str:
    low, high = getattr(row, "measured_low", None), getattr(row, "measured_high", None)
    repeats = int(getattr(row, "repeats", 1) or 1)
    if repeats < 2 or low is None or high is None:
        return "-"
    return f"{low:.2f}–{high:.2f} ({repeats} runs)"


def build_sections(
    recommendation: dict[str, Any],
    measured: pd.DataFrame,
    drivers: dict[str, Any],
    *,
    step_ms: float,
    target: float,
    plot: str | None = None,
) -> list[Section]:
    """The report's content. `measured`: one row per configuration run (workers, depth,
    predicted_utilization, measured_utilization, memory_bytes, samples_per_s); rows with
    a missing value are left out, never shown as nan."""
    r = recommendation
    w, d = int(r["workers"]), int(r["depth"])
    top = Section(
        "Recommendation",
        [
            f"Goal: keep a training step of {step_ms:g} ms busy at least {target:.0%} of the "
            "time, holding as little memory as possible.",
            _verdict(r, target),
            f"Probe: {r['probe_batches']} batches over {r['probe_epochs']} epoch(s); each "
            f"configuration below then ran {r['verify_batches']} batches on its own"
            + (f", {r['repeats']} times, interleaved." if r.get("repeats", 1) > 1 else "."),
            *([f"Decoder: {r['decoder']}."] if r.get("decoder") else []),
            *([r["cheaper_within_noise"] + "."] if r.get("cheaper_within_noise") else []),
            *([r["step_note"]] if r.get("step_note") else []),
            *([f'Next prefetch="auto" run: {r["next_run"]}.'] if r.get("next_run") else []),
        ],
        code=_snippet(r, target),
    )
    columns = [
        "workers",
        "depth",
        "predicted_utilization",
        "measured_utilization",
        "memory_bytes",
        "samples_per_s",
    ]
    shown = measured.dropna(subset=columns).sort_values(["memory_bytes", "workers"])
    rows = [
        [
            f"{int(row.workers)}",
            f"{int(row.depth)}",
            _num(row.predicted_utilization),
            _num(row.measured_utilization)
            + (" (recommended)" if (row.workers, row.depth) == (w, d) else ""),
            _range(row),
            _mib(row.memory_bytes),
            _num(row.samples_per_s, "{:,.0f}"),
        ]
        for row in shown.itertuples()
    ]
    header = ["workers", "depth", "predicted", "measured", "spread", "memory held", "samples/s"]
    notes = r.get("prediction_notes") or []
    said = (
        "Prediction against measurement: off by more than the noise for "
        + "; ".join(notes)
        + ". The prediction comes from the probe's measured service; where it is off, "
        "the measurement decides."
        if notes
        else "Prediction against measurement: within the noise for every configuration."
    )
    runs = Section(
        "What was measured",
        [
            "Each configuration ran on its own; utilization is the step's share of the "
            "time (step / (step + wait)) over every batch but the run's first, each "
            "epoch's first batch included (it waits for an empty pipeline unless "
            "persistent workers read it ahead). `measured` is the mean over the runs, "
            "`spread` the lowest and highest run.",
            said,
        ],
        [(header, rows)],
        image=plot,
    )
    return [top, runs, _drivers_section(drivers, target), *_tuner_section(r)]


def _tuner_section(r: dict[str, Any]) -> list[Section]:
    """The probe's tuner: its last decision in words (what the prior predicted, what
    the model changed and how sure it was), and every decision when given."""
    reason, decisions = r.get("tuner_reason"), r.get("decisions") or []
    if not reason and not decisions:
        return []
    section = Section("What the tuner decided during the probe")
    if r.get("tuner_model"):
        section.paragraphs.append(f"Model: {r['tuner_model']}.")
    if reason:
        section.paragraphs.append(f"Last decision: {reason}")
    rows = [
        [
            str(d.get("batch", "-")),
            f"{d['workers']} / {d['depth']}",
            _num(d.get("predicted", {}).get("prior_utilization")),
            _num(d.get("predicted", {}).get("model_change"), "{:+.3f}"),
            _num(d.get("predicted", {}).get("model_sd"), "{:.3f}"),
            _num(d.get("predicted", {}).get("lower_bound")),
        ]
        for d in decisions
    ]
    if rows:
        header = ["batch", "workers / depth", "prior", "model change", "model sd", "lower bound"]
        section.tables.append((header, rows))
    return [section]


def _drivers_section(drivers: dict[str, Any], target: float) -> Section:
    """What this dataset's numbers say, and how the prediction moves with the knobs."""
    s = drivers
    facts = [
        f"One batch takes a worker {s['service_ms']:.1f} ms (storage {s['read_ms']:.1f}, "
        f"decode {s['decode_ms']:.1f}, transform {s['transform_ms']:.1f}); the step is "
        f"{s['step_ms']:.1f} ms.",
        f"So about {s['workers_needed']} busy worker(s) cover the service at {target:.2f} "
        "(Little's law: workers x step / service).",
    ]
    if s.get("cpu_ms") is not None:
        bound = s.get("cpu_bound")
        facts.append(
            f"Of each batch, {s['cpu_ms']:.1f} ms is the workers' CPU, on {s['cpu_count']} "
            "cores: "
            + (
                f"the cores allow at most {bound:.2f}, however many workers."
                if bound is not None and bound < 1
                else "the cores are not what limits."
            )
        )
    section = Section("What drives the result for this dataset", facts)
    grid = s.get("grid")
    if grid is not None and len(grid):
        depths = sorted(set(int(x) for x in grid["depth"]))
        workers = sorted(set(int(x) for x in grid["workers"]))
        table = {
            (int(a), int(b)): u
            for a, b, u in grid[["workers", "depth", "utilization"]].itertuples(index=False)
        }
        rows = [[str(wk), *(_num(table.get((wk, dp))) for dp in depths)] for wk in workers]
        section.paragraphs.append(
            "Predicted utilization by workers (rows) and prefetch depth (columns), from the "
            "measured service, step and CPU (`-`: more workers than depth, which would idle):"
        )
        section.tables.append((["workers \\ depth", *map(str, depths)], rows))
    return section


def render_markdown(sections: list[Section], title: str = "Data-loading tuning report") -> str:
    lines = [f"# {title}", ""]
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        for text in sec.paragraphs:
            lines += [text, ""]
        if sec.code:
            lines += ["```python", sec.code, "```", ""]
        if sec.image:
            lines += [f"![{sec.title}]({sec.image})", ""]
        for header, rows in sec.tables:
            lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


def _inline(text: str) -> str:
    """Escaped text with **bold** and `code` spans."""
    out, parts = [], html.escape(text).split("**")
    for i, part in enumerate(parts):
        code = part.split("`")
        part = "".join(f"<code>{c}</code>" if j % 2 else c for j, c in enumerate(code))
        out.append(f"<strong>{part}</strong>" if i % 2 else part)
    return "".join(out)


def render_html(sections: list[Section], title: str = "Data-loading tuning report") -> str:
    parts = [
        "<!doctype html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:52em;margin:auto}"
        "table{border-collapse:collapse}td,th{padding:2px 8px;border:1px solid #ccc}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    for sec in sections:
        parts.append(f"<h2>{html.escape(sec.title)}</h2>")
        parts += [f"<p>{_inline(text)}</p>" for text in sec.paragraphs]
        if sec.code:
            parts.append(f"<pre><code>{html.escape(sec.code)}</code></pre>")
        if sec.image:
            parts.append(f"<img src='{html.escape(sec.image)}' alt='{html.escape(sec.title)}'>")
        for header, rows in sec.tables:
            head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
            body = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                for row in rows
            )
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _plot(out: Path, measured: pd.DataFrame, target: float) -> str | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = measured.dropna(subset=["measured_utilization", "memory_bytes"])
    if rows.empty:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.scatter(rows["memory_bytes"] / 2**20, rows["measured_utilization"], s=24)
    for row in rows.itertuples():
        ax.annotate(
            f"{int(row.workers)}/{int(row.depth)}",
            (row.memory_bytes / 2**20, row.measured_utilization),
            fontsize=7,
        )
    ax.axhline(target, color="r", lw=1)
    ax.set_xlabel("memory held (MiB)")
    ax.set_ylabel("measured utilization")
    ax.set_title("Configurations measured (workers/depth)")
    fig.tight_layout()
    fig.savefig(out / "measured.png", dpi=100)
    plt.close(fig)
    return "measured.png"


def write_report(
    out_dir: str | Path,
    recommendation: dict[str, Any],
    measured: pd.DataFrame,
    drivers: dict[str, Any],
    *,
    step_ms: float,
    target: float,
) -> dict[str, Path]:
    """Write report.md, report.html and measured.png into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plot = _plot(out, measured, target)
    sections = build_sections(
        recommendation, measured, drivers, step_ms=step_ms, target=target, plot=plot
    )
    (out / "report.md").write_text(render_markdown(sections))
    (out / "report.html").write_text(render_html(sections))
    paths = {"markdown": out / "report.md", "html": out / "report.html"}
    if plot:
        paths["plot"] = out / plot
    return paths
