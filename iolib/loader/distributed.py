"""Rank and world size: from the arguments, torch.distributed, or torchrun's environment.

Determinism needs no collective: every rank computes the same global order from the
seed and takes its own slice, so nothing is exchanged between ranks.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from iolib.errors import ConfigError, require_positive_int


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world_size): explicit arguments win, then an initialized process group,
    then RANK/WORLD_SIZE from torchrun, else a single process (0, 1)."""
    if rank is None and world_size is None:
        rank, world_size = _from_torch() or _from_env() or (0, 1)
    elif rank is None or world_size is None:
        raise ConfigError(
            f"Give both `rank` and `world_size`, or neither. Found: rank={rank!r}, "
            f"world_size={world_size!r}."
        )
    if not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"`world_size` must be a positive integer. Found: {world_size!r}.")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ConfigError(f"`rank` must be in 0..{world_size - 1}. Found: {rank!r}.")
    return rank, world_size


def _from_torch() -> tuple[int, int] | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


def _from_env() -> tuple[int, int] | None:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        try:
            return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        except ValueError as exc:
            raise ConfigError(
                f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                "must be integers (set by torchrun)."
            ) from exc
    return None


class PipelineRank(NamedTuple):
    """Where a process sits in a pipeline-parallel job: its stage, and the data-parallel
    replica (the loader's rank) among `replicas` (the loader's world size)."""

    stage: int
    replica: int
    replicas: int


def pipeline_rank(
    num_stages: int, rank: int | None = None, world_size: int | None = None
) -> PipelineRank:
    """This process's stage and replica, with consecutive ranks forming one replica's
    pipeline: rank = replica * num_stages + stage (rank and world size resolved as in
    `resolve_rank`). Other layouts: compute the replica yourself; what matters is that
    every stage of a replica gives the loader the same rank and world size.

    >>> pipeline_rank(2, rank=5, world_size=8)
    PipelineRank(stage=1, replica=2, replicas=4)
    """
    require_positive_int("num_stages", num_stages)
    rank, world_size = resolve_rank(rank, world_size)
    if world_size % num_stages:
        raise ConfigError(
            f"The world size ({world_size}) must be a multiple of `num_stages` "
            f"({num_stages}): each replica runs one process per stage."
        )
    return PipelineRank(rank % num_stages, rank // num_stages, world_size // num_stages)
