"""Which sample, in which order, on which rank: the epoch plan and its cursor.

Everything here is a pure function of integers, so it can be tested exhaustively and
pinned by golden values. Nothing depends on workers, timing or storage.

The global order of epoch ``e`` is a permutation drawn from ``rng.order_rng(seed, e)``;
it does not depend on the world size. Each *global step* takes ``world_size *
batch_size`` consecutive samples of that order, starting at the cursor ``position``
(global samples consumed); rank ``r`` takes the ``r``-th slice of ``batch_size``.

Worked example: 10 samples, batch_size 2, world_size 2, no shuffle, drop_last False.
Steps take 4 samples: [0 1 | 2 3], [4 5 | 6 7], then 2 samples remain for 2 ranks,
split evenly: rank 0 gets [8], rank 1 gets [9]. Every rank gets 3 batches.
If fewer samples remain than ranks (say 1 left for 2 ranks), the last step is padded
with the epoch's first samples so every rank still gets the same number of batches
(as torch's DistributedSampler does); `RankSchedule.padded` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from iolib.errors import ConfigError, require_non_negative_int, require_positive_int
from iolib.rng import order_rng

ShuffleMode = Literal["none", "global", "block"]
SHUFFLE_MODES: tuple[str, ...] = ("none", "global", "block")
DEFAULT_BLOCK_ROWS = 1024  # block size for sources that have no row groups


def normalize_shuffle(shuffle: object) -> ShuffleMode:
    """Map torch-style booleans and iolib's mode names to a mode name."""
    if shuffle is None or shuffle is False:
        return "none"
    if shuffle is True:
        return "global"
    if isinstance(shuffle, str) and shuffle in SHUFFLE_MODES:
        return shuffle  # type: ignore[return-value]
    raise ConfigError(f"`shuffle` must be False, True, 'global' or 'block'. Found: {shuffle!r}.")


def default_blocks(num_samples: int, block_rows: int = DEFAULT_BLOCK_ROWS) -> tuple[int, ...]:
    """Contiguous blocks of `block_rows` samples (the last one shorter)."""
    full, rest = divmod(num_samples, block_rows)
    return (block_rows,) * full + ((rest,) if rest else ())


def epoch_order(
    num_samples: int,
    *,
    seed: int,
    epoch: int,
    shuffle: ShuffleMode = "none",
    blocks: tuple[int, ...] = (),
    window: int = 8,
) -> np.ndarray:
    """The global sample order of one epoch, as an int64 array.

    ``block`` mode permutes the blocks (row groups), then shuffles samples within each
    run of ``window`` consecutive blocks of that permuted order: a window's reads hit
    at most ``window`` row groups, which keeps remote Parquet reads sequential-ish.

    >>> epoch_order(6, seed=0, epoch=0).tolist()
    [0, 1, 2, 3, 4, 5]
    """
    require_non_negative_int("num_samples", num_samples)
    if shuffle == "none":
        return np.arange(num_samples, dtype=np.int64)
    rng = order_rng(seed, epoch)
    if shuffle == "global":
        return rng.permutation(num_samples).astype(np.int64, copy=False)
    if shuffle != "block":
        raise ConfigError(f"Unknown shuffle mode {shuffle!r}; use one of {SHUFFLE_MODES}.")
    require_positive_int("window", window)
    blocks = blocks or default_blocks(num_samples)
    if sum(blocks) != num_samples:
        raise ConfigError(
            f"Block sizes add up to {sum(blocks)} but the dataset has {num_samples} samples."
        )
    starts = np.concatenate([[0], np.cumsum(blocks)[:-1]]).astype(np.int64)
    block_order = rng.permutation(len(blocks))
    pieces = []
    for w in range(0, len(block_order), window):
        members = block_order[w : w + window]
        idx = np.concatenate(
            [np.arange(starts[b], starts[b] + blocks[b], dtype=np.int64) for b in members]
        )
        pieces.append(rng.permutation(idx))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class RankSchedule:
    """One rank's batches of one epoch, from a cursor: positions into the epoch order.

    total: samples in the epoch; start: global samples already consumed (the cursor).
    Batch ``k`` of this schedule is ``positions(k)``; after delivering ``k`` batches the
    cursor is ``position_after(k)``, the same on every rank (ranks move in lock-step).
    """

    total: int
    start: int
    batch_size: int
    world_size: int = 1
    rank: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        require_positive_int("batch_size", self.batch_size)
        require_positive_int("world_size", self.world_size)
        require_non_negative_int("rank", self.rank)
        if self.rank >= self.world_size:
            raise ConfigError(
                f"`rank` must be below `world_size` ({self.world_size}). Found: {self.rank}."
            )
        if not 0 <= self.start <= self.total:
            raise ConfigError(f"Cursor {self.start} lies outside the epoch (0..{self.total}).")

    @property
    def step(self) -> int:
        """Samples one global step takes across all ranks."""
        return self.batch_size * self.world_size

    @property
    def _full_steps(self) -> int:
        return (self.total - self.start) // self.step

    @property
    def _tail(self) -> int:
        return 0 if self.drop_last else (self.total - self.start) % self.step

    def __len__(self) -> int:
        return self._full_steps + (1 if self._tail else 0)

    @property
    def padded(self) -> int:
        """Samples repeated to give every rank a last batch (0 unless tail < world_size)."""
        return max(0, self.world_size - self._tail) if self._tail else 0

    def positions(self, k: int) -> np.ndarray:
        """Positions (into the epoch order) of this rank's batch ``k``."""
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} outside 0..{len(self) - 1}")
        base = self.start + k * self.step
        if k < self._full_steps:
            first = base + self.rank * self.batch_size
            return np.arange(first, first + self.batch_size, dtype=np.int64)
        # The tail: split evenly, sizes differ by at most one, lower ranks get the extra.
        tail, ranks = self._tail, self.world_size
        size, extra = divmod(tail, ranks)
        if size == 0:  # fewer samples than ranks: rank r >= tail repeats epoch sample r - tail
            if self.rank < tail:
                return np.array([base + self.rank], dtype=np.int64)
            return np.array([(self.rank - tail) % self.total], dtype=np.int64)
        first = base + self.rank * size + min(self.rank, extra)
        return np.arange(first, first + size + (self.rank < extra), dtype=np.int64)

    def position_after(self, k: int) -> int:
        """The global cursor once every rank has delivered ``k`` batches."""
        if k <= self._full_steps:
            return self.start + k * self.step
        return self.total if not self.drop_last else self.start + self._full_steps * self.step


def batches_per_epoch(
    num_samples: int, batch_size: int, world_size: int = 1, drop_last: bool = False
) -> int:
    """Batches each rank gets in a full epoch (what ``len(loader)`` returns)."""
    return len(RankSchedule(num_samples, 0, batch_size, world_size, 0, drop_last))
