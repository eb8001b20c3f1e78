"""Dimensionless features of a plan, for a model of the physical prior's error.

The shipped trees learned raw inputs (bytes, milliseconds, core counts) of four real
workloads and did worse than the queueing prior on a fifth. What can carry over from
one workload to another is a ratio: the service over the step, the workers' CPU over
the cores, how late the late batches come, the depth against that lateness. So the
features here are computed from the same `Service` estimate the forecaster reads (no
outcome of the candidate), and the target is the forecaster's own error at the
candidate: measured utilization less the prior's point prediction.

Measured in benchmarks/results/model-transfer.md (leave one scenario family out).

Example:
    >>> x = transfer_features(est, grid, point, cores_share=0.8)   # (len(grid), k)
"""

from __future__ import annotations

import math

import numpy as np

from predictors.measure import Service

__all__ = ["TRANSFER_FEATURES", "transfer_features"]

TRANSFER_FEATURES = (
    "log_service_over_step",  # one worker's service over the consumer's step
    "cpu_share",  # the workers' CPU over the service
    "log_cpu_over_cores_step",  # CPU per batch over what the cores give in one step
    "spread",  # the late batches' semi-deviation over the mean service
    "tail_p95",  # the 95th percentile of service over its mean
    "tail_max",  # the slowest service over its mean
    "log_headroom",  # the candidate's workers' rate over the consumer's
    "log_depth_cover",  # the candidate's depth in steps over the service
    "depth_over_spread",  # the candidate's depth against the lateness
    "log_active_ratio",  # how far the candidate is from where it was measured
    "prior_point",  # what the prior predicts there
)


def transfer_features(
    est: Service, grid: list[tuple[int, int]], point: np.ndarray, cores_share: float = 0.8
) -> np.ndarray:
    """One row of `TRANSFER_FEATURES` per candidate of `grid` (no outcome read)."""
    workers = np.array([w for w, _ in grid], dtype=float)
    depth = np.array([d for _, d in grid], dtype=float)
    active = np.minimum(workers, depth)
    cores = max(cores_share * est.cpu_count, 1.0)
    cpu = min(est.cpu_ms or 0.0, est.service_ms)
    service = est.wait_ms + cpu * np.maximum(1.0, active / cores)
    relative = np.asarray(est.relative or (1.0,), dtype=float)
    step = max(est.step_ms, 1e-6)
    n = len(grid)

    def const(value: float) -> np.ndarray:
        return np.full(n, value, dtype=float)

    columns = [
        const(math.log(max(est.service_ms, 1e-6) / step)),
        const(cpu / max(est.service_ms, 1e-6)),
        const(math.log1p(cpu / (cores * step))),
        const(est.spread),
        const(float(np.quantile(relative, 0.95))),
        const(float(relative.max())),
        np.log(np.maximum(active * step / service, 1e-6)),
        np.log(depth * step / np.maximum(service, 1e-6)),
        depth / (1.0 + est.spread * max(float(relative.max()), 1.0)),
        np.log(active / max(est.active, 1)),
        np.asarray(point, dtype=float),
    ]
    return np.column_stack(columns)
