"""What `iolib tune` measures: runs across epochs, the configurations to verify, and
what drives the result for a dataset (its measured service, step and CPU, and the
prior's predictions over workers and depth). `iolib.tune_command` composes these.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from iolib.errors import ConfigError

__all__ = ["TuneRequest", "checks", "cpu_count", "drivers", "run", "why_missed"]


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


def run(loader: Any, batches: int, step_ms: float) -> dict[str, Any]:
    """Consume `batches` batches, across as many epochs as that takes, with a simulated
    step. Utilization leaves out the run's first batch (a cold start no configuration
    shortens) and counts each later epoch's first, as a training job would feel it;
    `utilization_in_epoch` leaves every epoch's first batch out (what the tuner judges)."""
    done = epochs = 0
    step = wait = start_wait = start_step = 0.0
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


def why_missed(drivers: dict[str, Any], request: TuneRequest, last: Any) -> str:
    """In words, what kept every measured configuration below the target."""
    bound = drivers["cpu_bound"]
    if bound is not None and bound < request.target:
        return (
            f"the workers' CPU ({drivers['cpu_ms']:.1f} ms a batch) on {drivers['cpu_count']} "
            f"cores allows at most {bound:.2f}: cheaper transforms or decode, or more cores"
        )
    if drivers["workers_needed"] > request.max_workers:
        return (
            f"storage: about {drivers['workers_needed']} busy workers would cover "
            f"{drivers['service_ms']:.0f} ms a batch, --max-workers allows {request.max_workers}"
        )
    if last is not None and not last.feasible:
        return last.reason
    return "the configurations measured fell short of their predictions (variable service)"


def cpu_count() -> int:
    """The CPUs the probe plans for (`iolib.resources.cpu_count`, imported when asked)."""
    from iolib.resources import cpu_count as count

    return count()
