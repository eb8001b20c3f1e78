"""The tuner on real (unsimulated) loaders, against torch's default and the hill-climber:

- a map-style torch Dataset whose reads wait on "remote storage" (a sleep per sample,
  almost no CPU), process workers, a step several times shorter than a batch's reads
  (the case of issue #23);
- Parquet token rows through the throttled `nas` storage profile, thread workers;
- JPEG images in Parquet decoded by DALI on the CPU (`ImagePipeline(device="cpu")`).

    python benchmarks/tuner_real.py            # about 5 minutes on 2 cores
    python benchmarks/tuner_real.py --repeats 5   # runs in a row with a run history

`--repeats N` (issue 41): four workloads (Parquet tokens on the throttled `nas`
profile, JPEGs decoded by DALI on the CPU, a map-style Dataset with process workers,
Parquet tokens on moto S3 behind the `object-store` throttle), each run N times in a
row by three designs on the same storage seeds: the cold tuner, the run history
alone (`QueueingTuner(warm=..., explore=False)`) and the history's model
(`explore=True`, its plan fitted before the run starts), each design keeping its own
history; an oracle from a measured static grid sweep of the same workload. Results:
benchmarks/results/tuner-real-repeats.md and .json.

Utilization is time-weighted over the last third of each run (the first batch left
out); memory is the peak held in batches in flight or ready. With `--repeats`, a case
whose sweep finds no configuration meeting the target on this machine gets a longer step
(the best one's batch time, with 15% to spare: `--spare`) and a second sweep: a target
nothing reaches would judge no tuner (`--keep-step` turns this off). Results:
benchmarks/results/tuner-real.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).absolute().parent.parent))

from benchmarks.tuner_experiments import (
    batches_to_target,
    make_images,
    make_tokens,
    run,
    source_for,
    utilization,
)
from benchmarks.tuner_history_study import block_utilization, held_configurations
from iolib import DataLoader
from predictors.baselines import HillClimbTuner, StaticDefaultTuner
from predictors.tuner import QueueingTuner

TARGET = 0.9


class RemoteReads(Dataset):
    """Each sample waits `latency_s` on storage (a sleep: no CPU, the GIL released)."""

    def __init__(self, n: int = 20_000, latency_s: float = 0.001) -> None:
        self.n, self.latency_s = n, latency_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.latency_s)
        return torch.full((256,), index, dtype=torch.float32)


def _tuners(max_workers: int) -> dict[str, dict[str, Any]]:
    return {
        "learned": {"prefetch": "auto", "num_workers": max_workers, "target_utilization": TARGET},
        "torch-default": {"prefetch": StaticDefaultTuner(), "num_workers": max_workers},
        "hill-climb": {
            "prefetch": HillClimbTuner(max_workers=max_workers),
            "num_workers": max_workers,
        },
    }


def _cases(tmp: Path) -> dict[str, dict[str, Any]]:
    from iolib.decode.images import ImagePipeline

    tokens, images = make_tokens(tmp), make_images(tmp)
    return {
        "map-style Dataset, process workers (32 x 1 ms reads, 6 ms step)": {
            "make": lambda: RemoteReads(),
            "loader": {"batch_size": 32, "worker_mode": "process"},
            "step_ms": 6.0,
            "batches": 300,
            "max_workers": 16,
        },
        "map-style Dataset, thread workers (32 x 1 ms reads, 6 ms step)": {
            "make": lambda: RemoteReads(),
            "loader": {"batch_size": 32, "worker_mode": "thread"},
            "step_ms": 6.0,
            "batches": 300,
            "max_workers": 16,
        },
        "Parquet tokens on nas, threads (4 ms step)": {
            "make": lambda: source_for(tokens, "nas", "real-nas", 0),
            "loader": {"batch_size": 64},
            "step_ms": 4.0,
            "batches": 300,
            "max_workers": 16,
        },
        "images in Parquet, DALI on the CPU (60 ms step)": {
            "make": lambda: source_for(images, None, "real-img", 0),
            "loader": {"batch_size": 64, "decode": ImagePipeline(backend="dali", device="cpu")},
            "step_ms": 60.0,
            "batches": 80,
            "max_workers": 4,
        },
        # Decode-bound: the cores, not the workers, limit; DALI's pool does the work.
        "images in Parquet, DALI on the CPU (15 ms step)": {
            "make": lambda: source_for(images, None, "real-img", 0),
            "loader": {"batch_size": 64, "decode": ImagePipeline(backend="dali", device="cpu")},
            "step_ms": 15.0,
            "batches": 150,
            "max_workers": 4,
        },
    }


class Recording:
    """A tuner that keeps every state it decides on (the run's history is made from them)."""

    def __init__(self, tuner: QueueingTuner) -> None:
        self.tuner, self.states = tuner, []

    def decide(self, state: Any) -> Any:
        self.states.append(state)
        return self.tuner.decide(state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tuner, name)


def run_records(run_id: str, states: list[Any], target: float) -> list[Any]:
    """The run's configurations held for 4 settled batches or more (epoch starts left
    out), as RunRecords."""
    import numpy as np

    from predictors.history import RunRecord

    out = []
    for held in held_configurations(states, settle=2, min_batches=0):
        part = [s for s in held if not s.epoch_start]
        if len(part) < 4:
            continue
        util, se = block_utilization(part)
        one = part[0].batch_memory_bytes or part[0].bytes_per_batch
        out.append(
            RunRecord(
                workload="bench",
                run_id=run_id,
                rank=0,
                started=time.time(),
                source="bench",
                workers=part[0].workers,
                depth=part[0].depth,
                batch_size=part[0].batch_size,
                storage_ms=float(np.median([s.read_ms for s in part])),
                decode_ms=float(np.median([s.decode_ms for s in part])),
                cpu_ms=float(np.median([s.cpu_ms or 0.0 for s in part])),
                service_ms=[s.service_ms for s in part],
                utilization=util,
                utilization_se=float(se),
                memory_bytes=int(part[0].depth * one),
                step_ms=float(np.median([s.step_ms for s in part])),
                batches=len(part),
                target=target,
                met=util >= target,
                settled=True,
            )
        )
    return out


def one_run(
    case: dict[str, Any], make: Any, prefetch: Any, workers: int, seed: int, tag: str
) -> dict[str, Any]:
    """One run of a case: utilization over its last third, peak memory, batches to target."""
    result = run(
        lambda: DataLoader(
            make(seed, tag),
            history=False,  # each design's history is kept here, not on disk
            persistent_workers=True,
            num_workers=workers,
            prefetch=prefetch,
            **case["loader"],
        ),
        case["batches"],
        case["step_ms"],
    )
    return {
        "utilization": utilization(result, -(case["batches"] // 3)),
        "peak_mib": result["peak_bytes"] / 2**20,
        "batches_to_target": batches_to_target(result, TARGET),
        "final": [result["workers"][-1], result["depth"][-1]],
    }


REPEAT_CASES = (
    "Parquet tokens on nas, threads (4 ms step)",
    "images in Parquet, DALI on the CPU (60 ms step)",
    "map-style Dataset, process workers (32 x 1 ms reads, 6 ms step)",
    "Parquet tokens on moto S3 behind the object-store throttle (20 ms step)",
)
ORACLE_GRID = ((1, 1), (1, 2), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16))


def oracle_sweep(name: str, case: dict[str, Any], make: Any) -> list[dict[str, Any]]:
    """Static configurations from the cheapest up, stopping once one meets with room."""
    sweep = []
    for w, d in ORACLE_GRID:
        if w > case["max_workers"]:
            continue
        r = one_run(case, make, d, w, 0, f"oracle-{w}-{d}")
        sweep.append({"workers": w, "depth": d, **r})
        print(f"{name} oracle sweep {w}/{d}: {r['utilization']:.3f}", flush=True)
        if r["utilization"] >= TARGET + 0.03:
            break  # more only costs memory
    return sweep


def repeats(args: argparse.Namespace) -> None:
    """Each case run `args.repeats` times in a row by the cold tuner, the history alone
    and the history's model, paired on storage seeds; an oracle from a static sweep."""
    import json
    import os

    from iolib.cli.bench.s3server import moto_s3
    from predictors.history import WarmStart

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, moto_s3("iolib-history") as s3:
        import s3fs

        cases = _cases(Path(tmp))
        tokens = Path(tmp) / "tokens.parquet"
        s3fs.S3FileSystem(**s3).put_file(str(tokens), "iolib-history/tokens.parquet")

        def s3_source(seed: int, tag: str) -> Any:
            from iolib.sources import ParquetSource

            throttle = {"profile": "object-store", "seed": seed, "tag": tag}
            options = {"throttled": throttle, "s3": {k: v for k, v in s3.items()}}
            url = "throttled::s3://iolib-history/tokens.parquet"
            return ParquetSource(url, storage_options=options, cache_bytes=1)

        cases[REPEAT_CASES[3]] = {
            "make": None,
            "source": s3_source,
            "loader": {"batch_size": 64},
            "step_ms": 20.0,
            "batches": 90,
            "max_workers": 16,
        }
        cases[REPEAT_CASES[0]]["source"] = lambda seed, tag: source_for(tokens, "nas", tag, seed)
        for name in REPEAT_CASES:
            if args.only not in name:
                continue
            case = cases[name]
            make = case.get("source") or (lambda seed, tag, c=case: c["make"]())

            sweep = oracle_sweep(name, case, make)
            meets = [r for r in sweep if r["utilization"] >= TARGET]
            if not meets and not args.keep_step:
                # A target no configuration reaches on this machine tests no tuner: the
                # step is lengthened until the best configuration of the sweep has
                # `--spare` to spare (a loader-bound pipeline's utilization is step /
                # batch time).
                best = max(r["utilization"] for r in sweep)
                old_step = case["step_ms"]
                case["step_ms"] = round((1 + args.spare) * old_step / max(best, 0.05), 1)
                print(
                    f"{name}: no configuration met {TARGET} (best {best:.3f}); step "
                    f"{old_step} -> {case['step_ms']} ms, sweep again",
                    flush=True,
                )
                sweep = oracle_sweep(name, case, make)
                meets = [r for r in sweep if r["utilization"] >= TARGET]
            oracle = min(meets, key=lambda r: (r["depth"], r["workers"])) if meets else None
            kw = {"target_utilization": TARGET, "max_workers": case["max_workers"]}
            first = Recording(QueueingTuner(**kw))
            run1 = one_run(case, make, first, case["max_workers"], 1, "cold-0")
            print(f"{name} run 1 cold     {run1['utilization']:.3f} util", flush=True)
            start = run_records("run1", first.states, TARGET)
            history: dict[str, list[Any]] = {"history": list(start), "model": list(start)}
            runs: dict[str, list[dict[str, Any]]] = {"cold": [], "history": [], "model": []}
            for k in range(1, args.repeats):
                seed = k + 1
                for design in ("cold", "history", "model"):
                    warm = None
                    if design != "cold":
                        warm = WarmStart.from_records(
                            history[design], TARGET, max_workers=case["max_workers"]
                        )
                    tuner = QueueingTuner(**kw, warm=warm, explore=design == "model")
                    tuner.wait_for_model(120)  # the plan is fitted before the run begins
                    recording = Recording(tuner)
                    r = one_run(case, make, recording, case["max_workers"], seed, f"{design}-{k}")
                    plan = tuner.history_model
                    r.update(
                        start=list(tuner.start),
                        model=plan,
                        set_aside=tuner.warm_set_aside,
                        load=os.getloadavg()[0],
                    )
                    runs[design].append(r)
                    if design != "cold":
                        history[design] += run_records(f"run{k + 1}", recording.states, TARGET)
                    print(
                        f"{name} run {k + 1} {design:8s} {r['utilization']:.3f} util, "
                        f"{r['peak_mib']:.1f} MiB, start {r['start']}, final {r['final']}, "
                        f"to target {r['batches_to_target']}, load {r['load']:.1f}"
                        + (
                            f", weight {plan['weight']:.2f} ({plan['weight_why']}), probe "
                            f"{plan['probe']}, predicted {plan['predicted_utilization']:.2f} "
                            f"measured {plan['measured_utilization']}"
                            if plan
                            else ""
                        ),
                        flush=True,
                    )
            row = {"case": name, "step_ms": case["step_ms"], "oracle": oracle, "sweep": sweep}
            row.update(run1=run1, runs=runs)
            row["summary"] = summarize_case(row)
            rows.append(row)
            print_summary(name, row["summary"])
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{args.name}-repeats.json"
    out.write_text(json.dumps(rows, default=float, indent=1))
    print(out)


def summarize_case(row: dict[str, Any]) -> dict[str, Any]:
    """Per design over runs 2-N: meets, memory within 1.25x of the oracle's peak (None
    without an oracle), the model's weight per run; and paired run by run, model
    against the history alone and each against cold: more meets, and memory wins
    (both meet, or neither, and the first held less peak memory)."""
    runs, oracle = row["runs"], row["oracle"]
    out: dict[str, Any] = {}
    for design, results in runs.items():
        within = (
            sum(r["peak_mib"] <= 1.25 * oracle["peak_mib"] for r in results) if oracle else None
        )
        out[design] = {
            "runs": len(results),
            "meets": sum(r["utilization"] >= TARGET for r in results),
            "memory_within_1.25x": within,
        }
    out["model_weight"] = [
        None if r.get("model") is None else round(r["model"]["weight"], 3) for r in runs["model"]
    ]
    out["model_probes"] = sum(bool(r.get("model") and r["model"]["probe"]) for r in runs["model"])
    out["model_fell_back"] = sum(
        bool(r.get("model") and r["model"]["fell_back"]) for r in runs["model"]
    )

    def paired(a: str, b: str) -> dict[str, int]:
        meets = wins = losses = 0
        for x, y in zip(runs[a], runs[b], strict=True):
            mx, my = x["utilization"] >= TARGET, y["utilization"] >= TARGET
            meets += int(mx) - int(my)
            if mx == my:
                wins += x["peak_mib"] < y["peak_mib"]
                losses += x["peak_mib"] > y["peak_mib"]
        return {"meets": meets, "memory_wins": wins, "memory_losses": losses}

    out["model_vs_history"] = paired("model", "history")
    out["history_vs_cold"] = paired("history", "cold")
    out["model_vs_cold"] = paired("model", "cold")
    return out


def print_summary(name: str, summary: dict[str, Any]) -> None:
    print(f"== {name}", flush=True)
    for design in ("cold", "history", "model"):
        d = summary[design]
        print(
            f"   {design:8s} meets {d['meets']}/{d['runs']}, memory within 1.25x of the "
            f"oracle {d['memory_within_1.25x']}",
            flush=True,
        )
    print(
        f"   model weight per run {summary['model_weight']}, probes "
        f"{summary['model_probes']}, fell back {summary['model_fell_back']}",
        flush=True,
    )
    for pair in ("model_vs_history", "history_vs_cold", "model_vs_cold"):
        p = summary[pair]
        print(
            f"   {pair.replace('_', ' ')}: meets {p['meets']:+d}, memory wins "
            f"{p['memory_wins']}, losses {p['memory_losses']} (paired runs)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--only", default="", help="Run the cases whose name holds this.")
    parser.add_argument("--name", default="tuner-real", help="Results file name (no suffix).")
    parser.add_argument("--repeats", type=int, default=0, help="Runs in a row with a history.")
    parser.add_argument(
        "--keep-step",
        action="store_true",
        help="With --repeats: keep a case's step even where no configuration meets the "
        "target (by default the step is lengthened until the best one would).",
    )
    parser.add_argument(
        "--spare",
        type=float,
        default=0.15,
        help="With --repeats, where the step is lengthened: the fraction of the best "
        "configuration's batch time to spare (small: the configurations just cheaper than "
        "the best fall just short of the target, where a model has something to learn).",
    )
    args = parser.parse_args()
    if args.repeats:
        repeats(args)
        return
    lines = [
        "# The tuner on real loaders (2-core machine, shared with other jobs)",
        "",
        "`python benchmarks/tuner_real.py`. Utilization over the last third (time-weighted), "
        f"target {TARGET}; memory: peak held in batches; batches to reach the target "
        "(rolling 10).",
        "",
        "| case | tuner | utilization | peak MiB | batches to target | final workers / depth |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, case in _cases(Path(tmp)).items():
            if args.only not in name:
                continue
            for tuner, options in _tuners(case["max_workers"]).items():
                try:
                    result = run(
                        lambda c=case, o=options: DataLoader(
                            c["make"](), persistent_workers=True, **c["loader"], **o
                        ),
                        case["batches"],
                        case["step_ms"],
                    )
                except Exception as exc:  # a loader failure is a result too
                    row = f"| {name} | {tuner} | failed: {type(exc).__name__}: {exc} | | | |"
                    lines.append(row)
                    print(row, flush=True)
                    continue
                third = -(case["batches"] // 3)
                util = utilization(result, third)
                reached = batches_to_target(result, TARGET)
                row = (
                    f"| {name} | {tuner} | {util:.3f} | {result['peak_bytes'] / 2**20:.1f} | "
                    f"{reached if reached is not None else '-'} | "
                    f"{result['workers'][-1]} / {result['depth'][-1]} |"
                )
                lines.append(row)
                print(row, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"{args.name}.md"
    out.write_text("\n".join(lines) + "\n")
    print(out)


if __name__ == "__main__":
    main()
