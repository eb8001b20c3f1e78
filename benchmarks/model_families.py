"""Where the learned model is worse than the queueing prior: cross-validation leaving
one (workload, storage) group out, one workload out, and one storage profile out, on
the shipped sweeps. Its verdict is the `correction_weight` the tuner reads.

    python benchmarks/model_families.py

Writes benchmarks/results/model-families.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from predictors.baselines import QueueingModel
from predictors.model import Predictor, correction_weight, evaluate, read_observations

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = [
    ROOT / "predictors/data/sweep/observations.parquet",
    ROOT / "predictors/data/sweep2/observations.parquet",
]
COLUMNS = ["rows", "r2_throughput", "mdape_throughput", "mae_stall", "p80_util_error"]


def main() -> None:
    frame = read_observations(SWEEPS)
    models = {"learned": Predictor, "queueing": QueueingModel}
    lines = [
        "# The learned model against the queueing prior, by family left out",
        "",
        "`python benchmarks/model_families.py` on the shipped sweeps "
        f"({len(frame)} iolib observations; real runs, 2 CPUs). `mae_stall` is the mean "
        "absolute error on utilization; every score is on what the model never saw.",
        "",
    ]
    family_runs = []
    for by in ("group", "workload", "storage_profile"):
        ev = evaluate(frame, models, by=by)
        if by != "group":
            family_runs.append(ev)
        lines += [f"## Left out: one {by.replace('_', ' ')} at a time", ""]
        lines += ["| model | " + " | ".join(COLUMNS) + " |", "|" + " --- |" * (len(COLUMNS) + 1)]
        for name, row in ev.summary.iterrows():
            cells = [f"{row[c]:.3f}" if c != "rows" else f"{int(row[c])}" for c in COLUMNS]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        worse = ev.per_group.pivot(index="group", columns="model", values="mae_stall")
        worse = worse[worse["learned"] > worse["queueing"]]
        lines += [
            "",
            "Worse than the prior on: "
            + (
                ", ".join(
                    f"{g} ({r.learned:.3f} against {r.queueing:.3f})" for g, r in worse.iterrows()
                )
                or "none"
            ),
            "",
        ]
    weight = correction_weight(family_runs)
    lines += [
        f"**correction_weight = {weight:.2f}**: 1 - learned / queueing error at the worst "
        "family left out, within [0, 1]. The tuner scales the learned correction by it; "
        "at 0 it plans from the measured prior alone.",
        "",
    ]
    out = ROOT / "benchmarks/results/model-families.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
