"""Paired differences per 100 warm runs, with 95% intervals, from a
`tuner_history_study.py` results file: each design against cold, the model against the
probing history, and each against the one-run chooser, on meets (target met over the
last third) and memory wins (memory within 1.25x of the oracle). Paired by scenario and
run-seed set on the same seeds; the interval is a percentile bootstrap over scenarios
(their warm runs resampled together), 10,000 draws.

    python benchmarks/tuner_history_intervals.py benchmarks/results/tuner-history-heldout-s8.json
"""

from __future__ import annotations

import json
import sys

import numpy as np

TARGET = 0.9  # as `tuner_history_study.summarize` counts
MEMORY_RATIO = 1.25
DESIGNS = ("history", "probe", "model", "gp")


def per_scenario(rows: list[dict], name: str) -> np.ndarray:
    """(scenarios, 2): meets and memory wins of `name` over each scenario's warm runs."""
    out = []
    for r in rows:
        met = mem = 0
        for res in r["sets"]:
            for m in res[name]:
                met += m["utilization"] >= TARGET
                mem += m["memory"] / r["oracle"]["memory"] <= MEMORY_RATIO
        out.append((met, mem))
    return np.array(out, dtype=float)


def main(path: str) -> None:
    with open(path) as f:
        rows = [r for r in json.load(f)["rows"] if r["oracle"]["feasible"]]
    runs = sum(len(res["cold"]) for res in rows[0]["sets"])  # warm runs a scenario
    n = len(rows) * runs
    rng = np.random.default_rng(0)
    draws = rng.integers(0, len(rows), size=(10_000, len(rows)))
    print(f"{path}: {len(rows)} scenarios whose oracle meets, {n} warm runs")
    pairs = [(d, "cold") for d in DESIGNS] + [("model", "probe")]
    pairs += [(d, "chooser") for d in (*DESIGNS, "cold")]
    for name, base in pairs:
        diff = per_scenario(rows, name) - per_scenario(rows, base)
        mean = diff.sum(axis=0) * 100 / n
        boot = diff[draws].sum(axis=1) * 100 / n
        lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
        print(
            f"{name} vs {base}: meets {mean[0]:+.1f} ({lo[0]:+.1f} to {hi[0]:+.1f}), "
            f"memory {mean[1]:+.1f} ({lo[1]:+.1f} to {hi[1]:+.1f}) per 100"
        )


if __name__ == "__main__":
    main(sys.argv[1])
