"""What `iolib tune` measures: runs across epochs, the configurations to verify, and
what drives the result for a dataset (its measured service, step and CPU, and the
prior's predictions over workers and depth). `iolib.cli.tune` composes these.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from iolib.base.resources import cpu_count
from iolib.errors import ConfigError

__all__ = [
    "TuneRequest",
    "binding_stage",
    "checks",
    "choose",
    "cpu_count",
    "drivers",
    "prediction_notes",
    "run",
    "step_note",
    "summarize_runs",
    "why_missed",
]

# Below this, two utilizations are not told apart even when repeats agree closely.
NOISE_FLOOR = 0.02


@dataclass(frozen=True)
class TuneRequest:
    """What `iolib tune` was asked for, read once from the command line (click has
    already checked each value: ranges, sizes, paths)."""

    data: str
    out: str
    storage_options: dict[str, Any]
    column: str | None
    decode: bool
    image_size: int
    batch_size: int
    shuffle: Any
    max_workers: int
    target: float
    memory_budget: int | None
    batches: int
    verify_batches: int
    step_ms: float
    repeats: int = 3
    decoder: str = "auto"


def run(loader: Any, batches: int, step_ms: float) -> dict[str, Any]:
    """Consume `batches` batches, across as many epochs as that takes, with a simulated
    step. Utilization leaves out the run's first batch (a cold start no configuration
    shortens) and counts each later epoch's first, as a training job would feel it;
    `utilization_in_epoch` leaves every epoch's first batch out (what the tuner judges)."""
    done = epochs = 0
    step = wait = start_wait = start_step = 0.0
    slept: list[float] = []
    start = time.perf_counter()
    while done < batches:
        epochs, first = epochs + 1, True
        iterator = iter(loader)
        while done < batches:
            t0 = time.perf_counter()
            try:
                next(iterator)
            except StopIteration:
                break
            t1 = time.perf_counter()
            time.sleep(step_ms / 1e3)
            took = time.perf_counter() - t1
            slept.append(took)
            if not first:
                wait, step = wait + t1 - t0, step + took
            elif done > 0:
                start_wait, start_step = start_wait + t1 - t0, start_step + took
            first, done = False, done + 1
        if first:
            raise ConfigError("The dataset yielded no batch. Fix: check DATA and --batch-size.")
    every_step, every_wait = step + start_step, wait + start_wait
    wall_s = time.perf_counter() - start
    loader.close()  # first: the tuner's last decisions land in stats()
    stats = loader.stats()
    return {
        "stats": stats,
        "batches": done,
        "epochs": epochs,
        "utilization": every_step / max(every_step + every_wait, 1e-9),
        "utilization_in_epoch": step / max(step + wait, 1e-9),
        "memory_bytes": float(stats["peak_bytes_in_flight"]),
        "samples_per_s": stats["samples"] / wall_s if wall_s > 0 else 0.0,
        # The simulated step as the training thread slept it, and as the loader saw it
        # (the time between handing a batch over and being asked for the next).
        "slept_ms": 1e3 * sum(slept) / max(len(slept), 1),
        "loader_step_ms": float(stats.get("step_ms", 0.0)),
    }


def checks(
    tuner: Any, final: tuple[int, int], request: TuneRequest, batch_bytes: float
) -> list[tuple[int, int]]:
    """What to verify: the probe's final configuration, the least memory the tuner
    predicted to meet the target, one depth step less, one worker more, torch's
    default; at most --max-workers, no more workers than depth, within the budget."""
    from predictors.forecast import DEPTH_GRID

    budget = request.memory_budget

    w, d = final
    lower = max([g for g in DEPTH_GRID if g < d], default=d)
    wanted = [final, (min(w, lower), lower), (w + 1, d), (2, 4)]
    meets = [row for row in tuner.candidate_table() if row["lower_bound"] >= request.target]
    if meets:
        best = min(meets, key=lambda row: (row["predicted_memory_bytes"], row["workers"]))
        wanted.insert(1, (int(best["workers"]), int(best["depth"])))
    out = []
    for a, b in wanted:
        key = (min(a, request.max_workers, b), b)
        fits = budget is None or b * batch_bytes <= budget or key == final
        if fits and key not in out:
            out.append(key)
    return out


def drivers(probe: dict[str, Any], tuner: Any, request: TuneRequest) -> dict[str, Any]:
    """This dataset's measured service, step and CPU, and the prior's predictions over a
    small grid of workers and depth."""
    import math

    import pandas as pd

    from predictors.measure import Service

    stats, cpus = probe["stats"], cpu_count()
    stages = stats["stage_ms"]
    cpu = sum(stats["stage_cpu_ms"].values()) if stats["stage_cpu_ms"] else None
    read = stages.get("read", 0.0)
    decode = stages.get("decode", 0.0)
    transform = stages.get("transform", 0.0) + stages.get("collate", 0.0)
    service = max(read + decode + transform, 1e-3)
    step = max(stats["step_ms"], request.step_ms)
    # The tuner's own estimate when it planned (it holds each batch's service, so
    # late batches count); else the loader's stage medians.
    est = tuner.service() or Service(
        service_ms=service,
        spread=0.0,
        cpu_ms=cpu,
        step_ms=step,
        active=max(1, min(stats["workers"], stats["depth"])),
        samples=max(1, probe["batches"]),
        read_ms=read,
        decode_ms=decode,
        transform_ms=transform,
        wait_ms=max(service - (cpu or 0.0), 0.0),
        cpu_count=cpus,
    )
    workers = [w for w in (1, 2, 4, 8, 16, 32) if w <= request.max_workers]
    depths = [1, 2, 4, 8, 16, 32]
    grid = [(w, d) for w in workers for d in depths if w <= d]
    point, _ = tuner.forecaster.predict(grid, est, cpus)
    cores = max(tuner.forecaster.cores_share * cpus, 1.0)
    service, read, decode, transform = est.service_ms, est.read_ms, est.decode_ms, est.transform_ms
    step, cpu = est.step_ms, est.cpu_ms
    return {
        "service_ms": service,
        "read_ms": read,
        "decode_ms": decode,
        "transform_ms": transform,
        "step_ms": step,
        "cpu_ms": cpu,
        "cpu_count": cpus,
        "cpu_bound": cores * step / cpu if cpu else None,
        "workers_needed": max(1, math.ceil(request.target * service / step)),
        "grid": pd.DataFrame(
            [(w, d, u) for (w, d), u in zip(grid, point, strict=True)],
            columns=["workers", "depth", "utilization"],
        ),
        "estimate": est,
    }


STAGES = {"read_ms": "storage", "decode_ms": "decode", "transform_ms": "transform"}
FIXES = {
    "storage": "more workers (--max-workers), a cache, or storage closer to the job",
    "decode": "more workers or cores, a smaller --image-size, or decoding on the GPU",
    "transform": "cheaper transforms, or more workers or cores",
}


def binding_stage(drivers: dict[str, Any]) -> tuple[str, float]:
    """The stage that takes most of a batch's measured service: storage (the read),
    decode or transform, with its time (ms a batch)."""
    key = max(STAGES, key=lambda k: float(drivers.get(k) or 0.0))
    ms = float(drivers.get(key) or 0.0)
    return (STAGES[key], ms) if ms > 0 else ("no stage", 0.0)


def why_missed(drivers: dict[str, Any], request: TuneRequest, last: Any) -> str:
    """In words, what kept every measured configuration below the target: the tighter
    of the limits that bind, the cores (the workers' CPU) or too few workers for the
    stage that takes most of a batch's service (storage, decode or transform, from the
    measured breakdown; never storage by default)."""
    target = request.target
    cpu = drivers["cpu_bound"]
    cpu = cpu if cpu is not None and cpu < target else None
    few = drivers["workers_needed"] > request.max_workers
    reach = request.max_workers * drivers["step_ms"] / max(drivers["service_ms"], 1e-9)
    stage, ms = binding_stage(drivers)
    share = (
        f"{stage} takes {ms:.0f} ms of the {drivers['service_ms']:.0f} ms a batch's service"
        if ms > 0
        else "no stage measured any time (storage, decode and transform took 0 ms)"
    )
    cores = (
        None
        if cpu is None
        else (
            f"the workers' CPU ({drivers['cpu_ms']:.1f} ms a batch) on {drivers['cpu_count']} "
            f"cores allows at most {cpu:.2f}"
        )
    )
    if cores is not None and (not few or cpu <= reach):
        return f"CPU: {cores}. Fix: cheaper transforms or decode, or more cores"
    if few:
        text = (
            f"{share}; about {drivers['workers_needed']} busy workers would cover it at the "
            f"target, --max-workers allows {request.max_workers} (at most {min(reach, 1):.2f})"
        )
        if cores is not None:
            text += f", and beyond that {cores}"
        return f"{text}. Fix: {FIXES.get(stage, 'more workers (--max-workers)')}"
    if last is not None and not last.feasible:
        return f"{share}; the tuner: {last.reason}"
    return f"{share}, and the configurations measured fell short of their predictions"


def summarize_runs(
    runs: dict[tuple[int, int], list[dict[str, Any]]],
    predicted: dict[tuple[int, int], tuple[float, float]],
) -> list[dict[str, Any]]:
    """One row per configuration: its prediction (point, lower bound) and what its
    repeats measured (mean, lowest, highest, standard deviation), memory held and
    samples/s (medians)."""
    from statistics import fmean, median, stdev

    rows = []
    for key, done in runs.items():
        utils = [r["utilization"] for r in done]
        point, lower = predicted.get(key, (float("nan"), float("nan")))
        rows.append(
            {
                "workers": key[0],
                "depth": key[1],
                "predicted_utilization": point,
                "lower_bound": lower,
                "measured_utilization": fmean(utils),
                "measured_low": min(utils),
                "measured_high": max(utils),
                "measured_sd": stdev(utils) if len(utils) > 1 else float("nan"),
                "repeats": len(utils),
                "memory_bytes": median(r["memory_bytes"] for r in done),
                "samples_per_s": median(r["samples_per_s"] for r in done),
            }
        )
    return rows


def noise(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far apart two rows' mean utilizations may be by chance: twice the standard
    error of their difference over the repeats (at least NOISE_FLOOR; unknown with
    one repeat each: the floor)."""
    import math

    var = 0.0
    for row in (a, b):
        sd = row["measured_sd"]
        if math.isfinite(sd):
            var += sd**2 / row["repeats"]
    return max(2.0 * math.sqrt(var), NOISE_FLOOR)


def choose(rows: list[dict[str, Any]], target: float) -> tuple[dict[str, Any], bool, str | None]:
    """The recommendation among measured rows: the least memory (then fewest workers)
    whose mean meets the target; else the least memory whose mean is within the noise
    of the best measured. Returns the row, whether it meets the target, and a sentence
    when a cheaper configuration was preferred within the noise."""
    order = sorted(rows, key=lambda r: (r["memory_bytes"], r["workers"]))
    meets = [r for r in order if r["measured_utilization"] >= target]
    if meets:
        return meets[0], True, None
    best = max(order, key=lambda r: (r["measured_utilization"], -r["memory_bytes"]))
    pick = next(
        r
        for r in order
        if best["measured_utilization"] - r["measured_utilization"] <= noise(best, r)
    )
    note = None
    if pick is not best:
        note = (
            f"{pick['workers']}/{pick['depth']} is recommended over {best['workers']}/"
            f"{best['depth']}: it holds {pick['memory_bytes'] / 2**20:.0f} MiB instead of "
            f"{best['memory_bytes'] / 2**20:.0f} MiB, and the "
            f"{best['measured_utilization'] - pick['measured_utilization']:+.2f} of the other "
            f"is inside the noise (±{noise(best, pick):.2f} over the repeats)"
        )
    return pick, False, note


def prediction_notes(rows: list[dict[str, Any]]) -> list[str]:
    """Where the prediction and the measurement differ by more than twice the standard
    error of the repeats' mean (at least 0.05), in words (the prediction came from
    the probe's measured service)."""
    out = []
    for r in rows:
        point, got = r["predicted_utilization"], r["measured_utilization"]
        if point != point:  # nan: not predicted
            continue
        gap = got - point
        sd = r["measured_sd"] if r["measured_sd"] == r["measured_sd"] else 0.0
        if abs(gap) > max(2.0 * sd / r["repeats"] ** 0.5, 0.05):
            side = "above" if gap > 0 else "below"
            out.append(
                f"{r['workers']}/{r['depth']}: predicted {point:.2f}, measured {got:.2f} "
                f"({side} the prediction by {abs(gap):.2f})"
            )
    return out


def step_note(probe: dict[str, Any], step_ms: float) -> str | None:
    """Why the step measured differs from --step-ms, when it does by over 10 %."""
    loader, slept = probe.get("loader_step_ms", 0.0), probe.get("slept_ms", 0.0)
    if not loader or loader <= 1.1 * step_ms:
        return None
    text = f"The step measured {loader:.1f} ms a batch against --step-ms {step_ms:g}: "
    if slept > 1.1 * step_ms:
        return text + (
            f"the simulated step itself took {slept:.1f} ms, so the training thread was "
            "held up (the workers' CPU work on the same cores, or Python's lock held by "
            "thread workers). The predictions use the step as measured."
        )
    return text + (
        "the loader counts as step all the time between handing a batch over and being "
        "asked for the next (the loop's own work and any copy to the device besides the "
        "step). The predictions use the step as measured."
    )
