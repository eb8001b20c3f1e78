"""The base of sources whose samples depend on the loader's seed and the epoch.

Why a base: packed windows and token-budget batches both draw a per-epoch order from
(seed, epoch) and keep it under a lock; neither the lock nor those per-epoch arrays may
cross a pickle (process workers rebuild them), and `with_seed` gives the loader a copy
bound to its seed that shares what was read.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np

from iolib.base.forks import reset_after_fork
from iolib.errors import ConfigError
from iolib.sources import Source


def check_lanes(lanes: int | str) -> int | str:
    if lanes != "auto" and (isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1):
        raise ConfigError(f"`lanes` must be 'auto' or an integer >= 1. Found: {lanes!r}.")
    return lanes


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
