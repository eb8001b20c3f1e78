"""The base of sources whose samples depend on the loader's seed and the epoch.

Why a base: packed windows and token-budget batches both draw a per-epoch order from
(seed, epoch) and keep it under a lock; neither the lock nor those per-epoch arrays may
cross a pickle (process workers rebuild them), and `with_seed` gives the loader a copy
bound to its seed that shares what was read.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from iolib.errors import ConfigError
from iolib.forks import reset_after_fork
from iolib.plan import EpochOrder, LaneOrder, default_blocks, lane_sizes
from iolib.sources.base import Source

_LANE_STREAM = 0x4C414E45  # "LANE": each lane's sample order


def check_lanes(lanes: int | str) -> int | str:
    if lanes != "auto" and (isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1):
        raise ConfigError(f"`lanes` must be 'auto' or an integer >= 1. Found: {lanes!r}.")
    return lanes


def chunked_lane_order(
    total: int,
    lanes: int,
    granule: int,
    per_chunk: int,
    seed: int,
    epoch: int,
    shuffle: str,
    chunks: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None,
) -> LaneOrder:
    """`total` samples dealt to `lanes` contiguous shares, `granule` of each in turn; each
    share ordered as the whole would be: shuffled within chunks of `per_chunk`, chunks
    in a random order (for "block"), or as `shuffle` says. `chunks(lane)`, where given,
    says a lane's chunk sizes and their order instead."""
    orders = []
    for lane, size in enumerate(lane_sizes(total, lanes).tolist()):
        words = [_LANE_STREAM, seed, lane]
        lane_seed = int(np.random.SeedSequence(words).generate_state(1, np.uint64)[0] >> 1)
        blocks, block_order = (), None
        if shuffle == "block":
            blocks, block_order = (
                (default_blocks(size, per_chunk), None) if chunks is None else chunks(lane)
            )
        orders.append(EpochOrder(size, seed=lane_seed, epoch=epoch, shuffle=shuffle,
                                 blocks=blocks, window=1, block_order=block_order))  # fmt: skip
    return LaneOrder(orders, granule)


class SeededSource(Source):
    """A source bound to a seed, with per-epoch state rebuilt in each process."""

    seed: int
    #: Attributes that stay in their process (rebuilt, or read again, after unpickling).
    _RUNTIME: tuple[str, ...] = ("_lock", "_epochs")

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._epochs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        reset_after_fork(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a parent thread may have held it at the fork

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._RUNTIME}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(dict.fromkeys(self._RUNTIME), **state)
        self._init_runtime()

    def with_seed(self, seed: int) -> SeededSource:
        """This source under the loader's seed (what was read is shared)."""
        if seed == self.seed:
            return self
        clone = copy.copy(self)
        clone.seed = int(seed)
        clone._init_runtime()
        return clone
