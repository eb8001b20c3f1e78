"""Markdown tables of the run-history studies (issue 41), from their JSON results.

    python benchmarks/tuner_history_report.py sim benchmarks/results/tuner-history-heldout42.json
    python benchmarks/tuner_history_report.py real benchmarks/results/tuner-real-*-repeats.json

Prints the tables that benchmarks/results/tuner-history.md holds.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

TARGET = 0.9
RATIO = 1.25


def sim(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    s = data["summary"]
    lines = [
        f"`{data['command']}`: {s['scenarios']} scenarios whose oracle meets the target, "
        f"{s['cold']['warm_runs']} warm runs (runs 2-5, two run-seed sets).",
        "",
        "| design | met | memory within 1.25x of the oracle | target by batch 10 "
        "| worst gap to torch | run 5: memory within 1.25x |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in ("cold", "history", "probe", "gp", "model", "chooser"):
        r = s[name]
        n = r["warm_runs"]
        by10 = (
            "-"
            if name == "chooser"
            else f"{r['target_by_batch_10']} ({r['target_by_batch_10'] / n:.0%})"
        )
        lines.append(
            f"| {name} | {r['met']:.0f} | {r['memory_within_1.25x']} | {by10} | "
            f"{r['worst_gap_to_torch']:+.3f} | {r['run5_memory_within_1.25x'][0]} / "
            f"{r['run5_memory_within_1.25x'][1]} |"
        )
    probes = {}
    for name in ("probe", "gp", "model"):
        runs = [
            m
            for row in data["rows"]
            if row["oracle"]["feasible"]
            for res in row["sets"]
            for m in res[name]
        ]
        probes[name] = (
            sum(bool(m["probe"]) for m in runs),
            sum(bool(m["fell_back"]) for m in runs),
            sum(m["weight"] > 0 for m in runs),
            statistics.fmean(m["weight"] for m in runs),
        )
    lines += ["", "| design | probes | fell back | runs with weight > 0 | mean weight |"]
    lines.append("| --- | ---: | ---: | ---: | ---: |")
    for name, (p, f, w, mean) in probes.items():
        lines.append(f"| {name} | {p} | {f} | {w} | {mean:.2f} |")
    return lines


def real(paths: list[Path]) -> list[str]:
    lines = [
        "| workload | oracle (sweep) | design | met (runs 2-5) | memory within 1.25x "
        "| median utilization | median peak MiB | target by batch 10 | weight per run "
        "| probes / fell back | predicted / measured at the start |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for path in paths:
        for row in json.loads(path.read_text()):
            o = row["oracle"]
            oracle = (
                f"{o['workers']}/{o['depth']}: {o['utilization']:.2f}, {o['peak_mib']:.1f} MiB"
                if o
                else "none met: "
                + ", ".join(
                    f"{r['workers']}/{r['depth']} {r['utilization']:.2f}" for r in row["sweep"][-2:]
                )
            )
            for design, runs in row["runs"].items():
                met = sum(r["utilization"] >= TARGET for r in runs)
                within = sum(r["peak_mib"] <= RATIO * o["peak_mib"] for r in runs) if o else "-"
                by10 = sum((r["batches_to_target"] or 999) <= 10 for r in runs)
                plans = [r.get("model") for r in runs]
                weights = ", ".join(f"{p['weight']:.2f}" for p in plans if p) or "-"
                probes = sum(bool(p and p["probe"]) for p in plans)
                fell = sum(bool(p and p["fell_back"]) for p in plans)
                pm = (
                    "; ".join(
                        f"{p['predicted_utilization']:.2f}/"
                        + (
                            "-"
                            if p["measured_utilization"] is None
                            else f"{p['measured_utilization']:.2f}"
                        )
                        for p in plans
                        if p
                    )
                    or "-"
                )
                lines.append(
                    f"| {row['case']} | {oracle} | {design} | {met} / {len(runs)} | {within} | "
                    f"{statistics.median(r['utilization'] for r in runs):.3f} | "
                    f"{statistics.median(r['peak_mib'] for r in runs):.1f} | {by10} | {weights} | "
                    f"{probes if design == 'model' else '-'} / "
                    f"{fell if design == 'model' else '-'} "
                    f"| {pm} |"
                )
                oracle = ""
    loads = [
        r["load"]
        for path in paths
        for row in json.loads(path.read_text())
        for runs in row["runs"].values()
        for r in runs
    ]
    lines += ["", f"Load average (1 min) during the runs: {min(loads):.1f} to {max(loads):.1f}."]
    return lines


def main() -> None:
    kind, *paths = sys.argv[1:]
    out = sim(Path(paths[0])) if kind == "sim" else real([Path(p) for p in paths])
    print("\n".join(out))


if __name__ == "__main__":
    main()
