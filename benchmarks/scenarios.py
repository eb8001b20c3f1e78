"""Randomized workloads the tuner was never tuned on, and how it does on them.

A scenario is drawn from a family (its parameters at random from `seed`) and run on
the SYNTHETIC simulated loader (`benchmarks.tuner_lab.synthetic`). Its oracle is a measured sweep:
every (workers, depth) the tuner may choose, three runs each, and the least memory whose
mean utilization met the target (and, as `reliable`, the least that met it in every
run). Develop on `--seeds dev` and `validation`; report on a held-out range nobody
looked at while changing the controller (each is run once, then it is seen: the
next report takes the next range).

    python benchmarks/scenarios.py --seeds dev --per-family 4
    python benchmarks/scenarios.py --seeds heldout8 --per-family 20

Writes benchmarks/results/scenarios-<seeds>.md and .json.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.tuner_lab.synthetic import SimulatedLoader, SimWorkload, run_tuner
from predictors.baselines import HillClimbTuner, QueueingModel, StaticDefaultTuner
from predictors.config import CONSTANTS, TunerConfig
from predictors.forecast import Forecaster
from predictors.tuner import QueueingTuner

RESULTS = Path(__file__).parent / "results"
FAMILIES = (
    "storage-threads",
    "storage-processes",
    "cpu-decode",
    "heavy-tail",
    "bursty",
    "short-steps",
    "large-batches",
    "tight-budget",
    "shift",
)
SEEDS = {
    "dev": 0,
    "validation": 500,
    "dev2": 600,  # a second development range (issue 31, round two)
    "heldout": 10_000,
    "heldout2": 20_000,
    "heldout3": 30_000,
    "heldout4": 40_000,
    "heldout5": 50_000,
    "heldout6": 60_000,
    "heldout7": 70_000,
    "heldout8": 80_000,
    "heldout9": 90_000,  # chosen after the prior-alone default and the online model
    "heldout14": 140_000,  # chosen after issue 32 moved the lab and the own-change trial
    "heldout17": 170_000,  # chosen after the cores' share learned in the run (issue 31)
    "heldout23": 230_000,  # chosen after the unreachable-plan recheck (issue 31, round ten)
}
MAX_WORKERS = 16


@dataclass(frozen=True)
class Scenario:
    family: str
    seed: int
    workload: SimWorkload
    target: float
    budget: float
    batches: int
    slowdown: tuple[int, int, float] | None = None


def draw(family: str, seed: int) -> Scenario:
    """One scenario of `family`, its parameters drawn from `seed`."""
    rng = np.random.default_rng([FAMILIES.index(family), seed])
    u = rng.uniform
    cpu = int(rng.choice([2, 4, 8]))
    latency, decode, batch, rows, size = u(1, 20), u(0.0, 0.02), 64, 16, u(2e3, 2e4)
    extra: dict[str, Any] = {"cores": 0.8 * cpu}  # threads by default: Python's lock
    ratio = u(1.5, 8.0)  # one worker's service over the step
    if family == "storage-processes":
        extra["cores"] = cpu
    elif family == "cpu-decode":
        latency, decode, size, rows = u(0.05, 0.5), u(0.5, 3.0), u(5e4, 2e5), 1
        ratio = u(1.0, 1.2 * cpu)
        extra["cores"] = cpu
    elif family == "heavy-tail":
        extra.update(tail_prob=u(0.03, 0.15), tail_shape=u(1.5, 3.0))
    elif family == "bursty":
        extra.update(burst_prob=u(0.02, 0.08), burst_factor=u(2.0, 5.0))
    elif family == "short-steps":
        decode = u(0.01, 0.05)
    elif family == "shift":
        ratio = u(0.3, 1.2)  # tenfold slower still within 16 workers
    elif family == "large-batches":
        batch, size, rows = int(rng.choice([512, 1024, 2048])), u(2e3, 5e4), 256
    workload = SimWorkload(
        f"{family}-{seed}",
        "sim",
        bytes_per_sample=size,
        decode_ms_per_sample=decode,
        storage_latency_ms=latency,
        storage_bandwidth_mbps=u(500, 3000),
        batch_size=batch,
        step_ms=1.0,
        rows_per_read=rows,
        cpu_count=cpu,
        jitter=u(0.1, 0.4),
        **extra,
    )
    service = _service(workload)
    step = u(1.0, 3.0) if family == "short-steps" else service / ratio
    workload = SimWorkload(**{**asdict(workload), "step_ms": float(step)})
    one = workload.memory_factor * workload.batch_bytes
    budget = one * (rng.integers(2, 9) if family == "tight-budget" else 64)
    if family == "shift":
        return Scenario(family, seed, workload, 0.9, budget, 330, (110, 220, 10.0))
    return Scenario(family, seed, workload, 0.9, float(budget), 240)


def _service(w: SimWorkload) -> float:
    requests = math.ceil(w.batch_size / w.rows_per_read)
    read = w.storage_latency_ms * requests + w.batch_bytes / (w.storage_bandwidth_mbps * 1e3)
    return read + w.batch_size * w.decode_ms_per_sample


def static_windows(s: Scenario, workers: int, depth: int, seed: int) -> tuple[float, float]:
    """Utilization of a static configuration over the last two thirds of one run (the
    oracle's window) and over its last third (the tuners' window)."""
    loader = SimulatedLoader(s.workload, workers, depth, seed=seed)
    records = [loader.next_batch() for _ in range(s.batches)]

    def util(part: list[Any]) -> float:
        step = sum(r.step_ms for r in part)
        return step / (step + sum(r.stall_ms for r in part))

    return util(records[s.batches // 3 :]), util(records[2 * s.batches // 3 :])


def static_run(s: Scenario, workers: int, depth: int, seed: int) -> tuple[float, float]:
    """Utilization over the last two thirds, and memory bound, of a static configuration."""
    memory = depth * s.workload.memory_factor * s.workload.batch_bytes
    return static_windows(s, workers, depth, seed)[0], memory


ORACLE_SEEDS = (1, 2, 3)


def oracle(s: Scenario) -> dict[str, Any]:
    """The least memory (then fewest workers) whose mean over three runs measured >=
    target, among every candidate the tuner may choose; else the highest utilization.
    `reliable`: the least memory that met the target in every one of the runs (a
    configuration that meets it on average by 0.005 misses it on half the seeds, so a
    tuner that must meet the target nearly always cannot match it)."""
    forecaster = Forecaster(target=s.target, budget=s.budget, max_workers=MAX_WORKERS)
    one = s.workload.memory_factor * s.workload.batch_bytes
    rows = []
    for w, d in forecaster.grid(one, s.workload.cpu_count):
        utils = [static_run(s, w, d, seed)[0] for seed in ORACLE_SEEDS]
        rows.append((d * one, w, d, statistics.fmean(utils), min(utils)))
    rows.sort()
    meets = [r for r in rows if r[3] >= s.target]
    best = meets[0] if meets else max(rows, key=lambda r: (r[3], -r[0]))
    reliable = next((r for r in rows if r[4] >= s.target), None)
    return {
        "memory": best[0],
        "workers": best[1],
        "depth": best[2],
        "utilization": best[3],
        "feasible": bool(meets),
        "reliable_memory": reliable[0] if reliable else None,
    }


def time_weighted_utilization(part: Any) -> float:
    """Time-weighted: the steps over the steps and stalls (a mean of per-batch ratios
    counts a burst of ready batches as much as the long wait before it)."""
    step = part["step_ms"].sum()
    return float(step / max(step + part["stall_ms"].sum(), 1e-9))


def _rolling(trace: Any) -> Any:
    """Utilization over the last 8 batches, at each batch."""
    busy = (trace["step_ms"] + trace["stall_ms"]).rolling(8).sum()
    return trace["step_ms"].rolling(8).sum() / busy


def recovery_batches(trace: Any, s: Scenario) -> int | None:
    """Batches from the first dip below the target during the slowdown to the first
    batch back above it (0: no dip; None: never back before the slowdown ended)."""
    begin, end, _ = s.slowdown
    low = _rolling(trace).loc[begin:end]
    dipped = low[low < s.target]
    if not len(dipped):
        return 0
    back = low.loc[dipped.index[0] :]
    back = back[back >= s.target]
    return int(back.index[0] - dipped.index[0]) if len(back) else None


def _metrics(trace: Any, s: Scenario) -> dict[str, Any]:
    third = trace.iloc[2 * s.batches // 3 :]
    rolling = _rolling(trace)
    reached = rolling[rolling >= s.target]
    out = {
        "utilization": time_weighted_utilization(third),
        "memory": float(third["bound_bytes"].max()),
        "peak_memory": float(trace["bound_bytes"].max()),
        "batches_to_target": int(reached.index[0]) if len(reached) else None,
    }
    if s.slowdown:
        begin, end, _ = s.slowdown
        out["recovery_batches"] = recovery_batches(trace, s)
        out["memory_during"] = float(trace.loc[begin:end, "bound_bytes"].max())
        out["memory_after"] = float(trace.loc[end + 60 :, "bound_bytes"].max())
        out["utilization_during"] = time_weighted_utilization(trace.loc[begin + 30 : end])
    return out


def _torch_default(s: Scenario) -> StaticDefaultTuner:
    """torch's default (a worker per core, 2 batches each), within the same memory
    budget: a static choice that ignored the budget would be no fair comparison."""
    room = int(s.budget // (s.workload.memory_factor * s.workload.batch_bytes))
    workers = max(1, min(s.workload.cpu_count, room))
    return StaticDefaultTuner(workers, prefetch_factor=max(1, min(2, room // workers)))


def evaluate(s: Scenario, model: Any, seed: int = 7, **tuner_options: Any) -> dict[str, Any]:
    """`seed`: the run seed (every tuner and the oracle's configuration run on it);
    `tuner_options`: `TunerConfig` settings or `TunerConstants` fields for the tuner."""
    settings = {f.name for f in fields(TunerConfig)}
    constants = replace(CONSTANTS, **{k: v for k, v in tuner_options.items() if k not in settings})
    tuners = {
        "learned": QueueingTuner(
            model,
            target_utilization=s.target,
            memory_budget_bytes=s.budget,
            max_workers=MAX_WORKERS,
            constants=constants,
            **{k: v for k, v in tuner_options.items() if k in settings},
        ),
        "hill-climb": HillClimbTuner(memory_budget_bytes=s.budget, max_workers=MAX_WORKERS),
        "torch-default": _torch_default(s),
    }
    out: dict[str, Any] = {"family": s.family, "seed": s.seed}
    for name, tuner in tuners.items():
        trace = run_tuner(tuner, s.workload, s.batches, slowdown=s.slowdown, seed=seed)
        out[name] = _metrics(trace, s)
    if s.slowdown is None:
        out["oracle"] = oracle(s)
        # The oracle's configuration on the seed the tuners ran on: how far a static
        # choice made with hindsight on two runs holds on a third.
        w, d = out["oracle"]["workers"], out["oracle"]["depth"]
        out["oracle"]["utilization_on_run_seed"] = float(static_run(s, w, d, seed)[0])
    return out


def summarize(rows: list[dict[str, Any]], target: float = 0.9) -> dict[str, Any]:
    """The issue's targets, each as a count over the scenarios it applies to."""
    steady = [r for r in rows if "oracle" in r and r["oracle"]["feasible"]]
    met = [r["learned"]["utilization"] >= target for r in steady]
    met_tol = [r["learned"]["utilization"] >= target - 0.01 for r in steady]
    ratio = [r["learned"]["memory"] / r["oracle"]["memory"] for r in steady]
    reliable = [
        r["learned"]["memory"] / r["oracle"]["reliable_memory"]
        for r in steady
        if r["oracle"].get("reliable_memory")
    ]

    def faster(r: dict[str, Any]) -> bool:
        mine, hill = r["learned"]["batches_to_target"], r["hill-climb"]["batches_to_target"]
        return mine is not None and (hill is None or mine < hill)

    torch_gap = [
        min(r["learned"]["utilization"], target) - min(r["torch-default"]["utilization"], target)
        for r in rows
        if "oracle" in r
    ]
    shifts = [r for r in rows if r["family"] == "shift"]
    return {
        "scenarios": len(rows),
        "oracle_feasible": len(steady),
        "meets_target": (sum(met), len(met)),
        "meets_target_within_0.01": (sum(met_tol), len(met_tol)),
        "memory_within_1.25x_oracle": (sum(x <= 1.25 for x in ratio), len(ratio)),
        "memory_ratio_median": statistics.median(ratio) if ratio else None,
        "memory_within_1.25x_reliable_oracle": (
            sum(x <= 1.25 for x in reliable),
            len(reliable),
        ),
        "memory_ratio_median_reliable": statistics.median(reliable) if reliable else None,
        "faster_than_hill_climb": (sum(map(faster, steady)), len(steady)),
        "oracle_config_meets_target_on_run_seed": (
            sum(r["oracle"].get("utilization_on_run_seed", 1.0) >= target for r in steady),
            len(steady),
        ),
        "worst_gap_to_torch_default": min(torch_gap) if torch_gap else None,
        "within_0.02_of_torch_default": (sum(g >= -0.02 for g in torch_gap), len(torch_gap)),
        "shift_recovered_within_20": (
            sum((r["learned"]["recovery_batches"] or 999) <= 20 for r in shifts),
            len(shifts),
        ),
        "shift_memory_released": (
            sum(r["learned"]["memory_after"] < r["learned"]["memory_during"] for r in shifts),
            len(shifts),
        ),
    }


def write(rows: list[dict[str, Any]], name: str, command: str) -> Path:
    RESULTS.mkdir(exist_ok=True)
    summary = summarize(rows)
    (RESULTS / f"scenarios-{name}.json").write_text(
        json.dumps({"command": command, "summary": summary, "rows": rows}, indent=1)
    )
    lines = [
        f"# Tuner on randomized scenarios: {name} seeds (SYNTHETIC simulator)",
        "",
        f"`{command}`",
        "",
        "| target | result |",
        "| --- | --- |",
    ]
    for key, value in summary.items():
        shown = (
            f"{value[0]} / {value[1]}"
            if isinstance(value, tuple)
            else (f"{value:.3f}" if isinstance(value, float) else str(value))
        )
        lines.append(f"| {key} | {shown} |")
    lines += [
        "",
        "By family (learned): target met where the oracle can, memory within 1.25x of the "
        "oracle, faster to the target than the hill-climber, within 0.02 of torch's default:",
        "",
        "| family | met | memory | faster | torch |",
        "| --- | --- | --- | --- | --- |",
    ]
    keys = (
        "meets_target",
        "memory_within_1.25x_oracle",
        "faster_than_hill_climb",
        "within_0.02_of_torch_default",
    )
    for family in dict.fromkeys(r["family"] for r in rows):
        part = summarize([r for r in rows if r["family"] == family])
        cells = " | ".join(f"{part[k][0]} / {part[k][1]}" for k in keys)
        lines.append(f"| {family} | {cells} |")
    lines += [
        "",
        "| family | seed | learned util | hill util | torch util | oracle util | "
        "mem / oracle | batches to target (learned / hill) |",
        "|" + " --- |" * 8,
    ]
    for r in rows:
        o = r.get("oracle")
        ratio = f"{r['learned']['memory'] / o['memory']:.2f}" if o else "-"
        extra = (
            f" recovery {r['learned'].get('recovery_batches')}"
            if "recovery_batches" in r["learned"]
            else ""
        )
        lines.append(
            f"| {r['family']} | {r['seed']} | {r['learned']['utilization']:.3f} | "
            f"{r['hill-climb']['utilization']:.3f} | {r['torch-default']['utilization']:.3f} | "
            f"{o['utilization']:.3f}{'' if o['feasible'] else ' (infeasible)'} | "
            if o
            else f"| {r['family']} | {r['seed']} | {r['learned']['utilization']:.3f} | "
            f"{r['hill-climb']['utilization']:.3f} | {r['torch-default']['utilization']:.3f} | - | "
        )
        lines[-1] += (
            f"{ratio} | {r['learned']['batches_to_target']} / "
            f"{r['hill-climb']['batches_to_target']}{extra} |"
        )
    path = RESULTS / f"scenarios-{name}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


@functools.cache
def _model(which: str) -> Any:
    """One load per process, not one per scenario."""
    from benchmarks.tuner_lab.model import load_default

    if which == "default":  # what prefetch="auto" plans with
        return None
    return load_default() if which == "shipped" else QueueingModel()


def _evaluate(job: tuple[str, int, str, int, dict[str, Any]]) -> dict[str, Any]:
    family, seed, which, run_seed, options = job
    return evaluate(draw(family, seed), _model(which), run_seed, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", choices=sorted(SEEDS), default="dev")
    parser.add_argument("--per-family", type=int, default=4)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--model", choices=["default", "shipped", "queueing"], default="default")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--out", help="results name (default: the seed range's)")
    parser.add_argument("--first", type=int, default=0, help="first seed offset in the range")
    parser.add_argument(
        "--run-seed", type=int, default=7, help="the simulator's noise path (7: every report)"
    )
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=NUMBER",
        help="TunerConfig or TunerConstants fields",
    )
    args = parser.parse_args()

    options = {k: float(v) for k, v in (item.split("=", 1) for item in args.set)}
    jobs = [
        (family, SEEDS[args.seeds] + args.first + k, args.model, args.run_seed, options)
        for family in args.families
        for k in range(args.per_family)
    ]
    start = time.time()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(tqdm(pool.map(_evaluate, jobs), total=len(jobs), desc="scenarios"))
    command = "python benchmarks/scenarios.py " + " ".join(sys.argv[1:])
    path = write(rows, args.out or args.seeds, command)
    print(json.dumps(summarize(rows), indent=1))
    print(f"{path} ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
