"""The DataLoader's argument checks: torch's rules, iolib's additions, clear errors.

Pure functions of the arguments, kept apart so loader.py reads as composition.
"""

from __future__ import annotations

from typing import Any

import torch

from iolib.errors import ConfigError, require_positive_int
from iolib.sources.torchds import TorchDatasetSource
from iolib.tuning import parse_bytes


def check_samplers(
    sampler: Any, batch_sampler: Any, batch_size: Any, drop_last: bool, shuffle: str
) -> None:
    if (sampler is not None or batch_sampler is not None) and shuffle != "none":
        raise ConfigError(
            "`shuffle` must be False with a `sampler` or `batch_sampler` (as in torch): "
            "the sampler decides the order."
        )
    if batch_sampler is not None:
        if sampler is not None or drop_last or batch_size not in (1, None):
            raise ConfigError(
                "`batch_sampler` is mutually exclusive with batch_size, shuffle, sampler "
                "and drop_last (as in torch): leave those at their defaults."
            )
        return
    if batch_size is None:
        raise ConfigError(
            "`batch_size=None` (unbatched samples) is not supported: iolib plans whole "
            "batches. Use batch_size=1 and index [0], or torch's DataLoader."
        )
    require_positive_int("batch_size", batch_size)


def resolve_seed(seed: int | None, generator: torch.Generator | None) -> int:
    if seed is None:
        seed = generator.initial_seed() if generator is not None else 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"`seed` must be a non-negative integer. Found: {seed!r}.")
    return seed


def resolve_mode(mode: str, source: Any) -> str:
    if mode == "auto":
        return "process" if isinstance(source, TorchDatasetSource) else "thread"
    if mode not in ("thread", "process"):
        raise ConfigError(f"`worker_mode` must be 'auto', 'thread' or 'process'. Found: {mode!r}.")
    return mode


def resolve_tuner(prefetch: Any, target: Any, budget: Any) -> dict[str, Any] | None:
    """prefetch="auto" (the learned tuner) or a tuner object (anything with decide())."""
    if prefetch is None or isinstance(prefetch, int):
        return None
    if prefetch != "auto" and not hasattr(prefetch, "decide"):
        raise ConfigError(
            "`prefetch` must be a positive integer (batches in flight or ready), 'auto' "
            f"(the learned tuner) or a tuner with a decide() method. Found: {prefetch!r}."
        )
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise ConfigError(
            "`target_utilization` must be a number strictly between 0 and 1 (the share "
            f"of time the GPU should compute, e.g. 0.9). Found: {target!r}."
        )
    return {"tuner": prefetch, "target": float(target), "budget": parse_bytes(budget)}


def resolve_depth(prefetch: Any, prefetch_factor: int | None, workers: int) -> int:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(f"`num_workers` must be a non-negative integer. Found: {workers!r}.")
    if prefetch is not None:
        return require_positive_int("prefetch", prefetch)
    if prefetch_factor is not None:
        require_positive_int("prefetch_factor", prefetch_factor)
    return (prefetch_factor or 2) * max(workers, 1)
