"""Rank and world size: from the arguments, torch.distributed, or torchrun's environment.

Determinism needs no collective: every rank computes the same global order from the
seed and takes its own slice, so nothing is exchanged between ranks.
"""

from __future__ import annotations

import os

from iolib.errors import ConfigError


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
