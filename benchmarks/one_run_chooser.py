"""The memory goal's yardstick at a fifth of the cost: the one-run chooser of
`scenario_limits.py` on a range that `scenarios.py` already ran.

The restated memory goal (issue 31) compares the tuner with a static chooser that
knows one full run of every candidate and takes the least memory whose run measured
at least the target plus a margin. `scenario_limits.py` computes it beside the
ten-run choosers, running every candidate eleven times; this runs each twice (the
first long-run seed and the run seed), which gives the same one-run picks, and reads
the oracle and the tuner from the range's scenarios-<name>.json. On 90,000-90,019 it
reproduces every "one run" row of scenario-limits-heldout9.md.

    python benchmarks/one_run_chooser.py heldout14

Writes benchmarks/results/scenario-limits-<name>-one-run.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.scenario_limits import LONG_RUN_SEEDS, MARGINS, MEMORY_RATIO, RUN_SEED, clairvoyant
from benchmarks.scenarios import MAX_WORKERS, RESULTS, draw, static_windows
from predictors.forecast import Forecaster


def candidates(row: dict[str, Any], run_seed: int = RUN_SEED) -> tuple[list[dict[str, Any]], float]:
    """Every candidate with one long run and the run seed's last third, and the
    oracle's own configuration in that window."""
    s = draw(row["family"], row["seed"])
    one = s.workload.memory_factor * s.workload.batch_bytes
    forecaster = Forecaster(target=s.target, budget=s.budget, max_workers=MAX_WORKERS)
    rows = [
        {
            "memory": d * one,
            "workers": w,
            "runs": [static_windows(s, w, d, LONG_RUN_SEEDS[0])[0]],
            "run": static_windows(s, w, d, run_seed)[1],
        }
        for w, d in forecaster.grid(one, s.workload.cpu_count)
    ]
    o = row["oracle"]
    return rows, static_windows(s, o["workers"], o["depth"], run_seed)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="a range scenarios.py wrote: results/scenarios-NAME.json")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument(
        "--run-seed", type=int, default=RUN_SEED, help="the run seed the range was scored on"
    )
    args = parser.parse_args()
    data = json.loads((RESULTS / f"scenarios-{args.name}.json").read_text())
    steady = [r for r in data["rows"] if "oracle" in r and r["oracle"]["feasible"]]
    with ProcessPoolExecutor(args.jobs) as pool:
        swept = list(pool.map(candidates, steady, [args.run_seed] * len(steady)))
    n, target = len(steady), 0.9
    lines = [
        f"# The one-run chooser on {args.name} (SYNTHETIC)",
        "",
        f"`python benchmarks/one_run_chooser.py {args.name} --run-seed {args.run_seed}`, "
        "on the rows of "
        f"scenarios-{args.name}.json; {n} scenarios where the oracle meets the target, "
        "scored in the tuners' window (the run seed's last third).",
        "",
        "| chooser | target met | memory within 1.25x |",
        "| --- | --- | --- |",
    ]
    for margin in MARGINS:
        picks = [clairvoyant(c, target + margin, 1) for c, _ in swept]
        met = sum(p["run"] >= target for p in picks)
        ratios = [p["memory"] / r["oracle"]["memory"] for p, r in zip(picks, steady, strict=True)]
        within = sum(x <= MEMORY_RATIO for x in ratios)
        lines.append(f"| one run +{margin:g} | {met} / {n} | {within} / {n} |")
    oracle_met = sum(u >= target for _, u in swept)
    lines.append(f"| oracle | {oracle_met} / {n} | {n} / {n} |")
    tuner = [r["learned"] for r in steady]
    met = sum(t["utilization"] >= target for t in tuner)
    within = sum(
        t["memory"] / r["oracle"]["memory"] <= MEMORY_RATIO
        for t, r in zip(tuner, steady, strict=True)
    )
    lines.append(f"| learned tuner | {met} / {n} | {within} / {n} |")
    path = RESULTS / f"scenario-limits-{args.name}-one-run.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[6:]))
    print(path)


if __name__ == "__main__":
    main()
