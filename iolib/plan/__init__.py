"""Which sample, in which order, on which rank: the epoch plan and its cursor.

Everything here is a pure function of integers, so it can be tested exhaustively and
pinned by golden values. Nothing depends on workers, timing or storage.

The global order of epoch ``e`` is a bijection keyed by ``rng.order_rng(seed, e)``
(`EpochOrder`): computed per position, never stored, so a plan of 10^9 samples costs a
few arrays of blocks; it does not depend on the world size. Each *global step* takes ``world_size *
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

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from iolib.errors import ConfigError, require_non_negative_int, require_positive_int
from iolib.plan.permute import feistel, round_keys
from iolib.plan.rng import order_rng

ShuffleMode = Literal["none", "global", "block"]
SHUFFLE_MODES: tuple[str, ...] = ("none", "global", "block")
DEFAULT_BLOCK_ROWS = 1024  # block size for sources that have no row groups
KEPT_WINDOW = 2**16  # a window this small is materialised when looked up (512 KiB)
KEPT_WINDOWS = 4  # ... and this many are kept: consecutive batches share a window
MAX_DEFAULT_BLOCKS = 2**16  # beyond 2^26 samples blocks grow, so a plan stays O(65,536)
# The shuffle window of sources that stream (decoded bytes shuffled together): a fixed
# number, never a share of the machine's memory or of `cache_bytes`, so that the order,
# and a checkpoint of it, are the same on every machine and at every cache size.
DEFAULT_SHUFFLE_WINDOW = 512 * 2**20


def default_blocks(num_samples: int, block_rows: int = DEFAULT_BLOCK_ROWS) -> np.ndarray:
    """Contiguous blocks of `block_rows` samples (the last one shorter), as an array; at
    most MAX_DEFAULT_BLOCKS of them (larger blocks for larger datasets)."""
    block_rows = max(block_rows, -(-num_samples // MAX_DEFAULT_BLOCKS))
    full, rest = divmod(num_samples, block_rows)
    sizes = np.full(full + (1 if rest else 0), block_rows, dtype=np.int64)
    if rest:
        sizes[-1] = rest
    return sizes


def window_groups(sizes: np.ndarray | list[int], window: int | None) -> int | None:
    """Row groups (of decoded `sizes`) that one shuffle window of `window` bytes holds: as
    many of the largest as fit, at least one; None where the whole data fits in one
    window (or there is no window), which is then shuffled whole.

    >>> window_groups([10, 30, 20], 40), window_groups([10, 30, 20], 60)
    (1, None)
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if window is None or int(sizes.sum()) <= window:
        return None
    return max(1, int(window) // max(int(sizes.max(initial=0)), 1))


class _Order(ABC):
    """What every epoch order offers: ``order[positions]`` (an int, a slice or an int
    array, negative positions counting from the end) and the whole order as an array.
    Subclasses compute `_at(positions)` for valid, non-negative positions."""

    num_samples: int

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, positions: int | slice | np.ndarray) -> np.ndarray:
        if isinstance(positions, slice):
            positions = np.arange(self.num_samples)[positions]
        scalar = np.ndim(positions) == 0
        p = np.atleast_1d(np.asarray(positions, dtype=np.int64))
        if p.size and (p.min() < -self.num_samples or p.max() >= self.num_samples):
            raise IndexError(f"positions outside 0..{self.num_samples - 1}")
        out = self._at(np.where(p < 0, p + self.num_samples, p))
        return out[0] if scalar else out

    @abstractmethod
    def _at(self, p: np.ndarray) -> np.ndarray: ...

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        """The whole order (O(samples): for tests and small datasets)."""
        whole = self._at(np.arange(self.num_samples, dtype=np.int64))
        return whole if dtype is None else whole.astype(dtype)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()


class EpochOrder(_Order):
    """The sample order of one epoch, computed on demand: ``order[positions]`` maps
    positions in the epoch to sample indices, for an int, a slice or an int array.

    Memory is O(blocks), never O(samples): a global shuffle is a keyed bijection
    (`iolib.plan.permute`), a block shuffle permutes the blocks (a small array) and then
    samples within each window of blocks by the same bijection, keyed per window.

    >>> EpochOrder(6, seed=0, epoch=0)[np.arange(6)].tolist()
    [0, 1, 2, 3, 4, 5]
    """

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int,
        epoch: int,
        shuffle: ShuffleMode = "none",
        blocks: tuple[int, ...] | np.ndarray = (),
        window: int = 8,
        block_order: np.ndarray | None = None,
    ) -> None:
        """block_order: which block comes i-th, where the source must know it (packed
        windows deal the window that straddles two chunks to the later one); by
        default drawn from (seed, epoch)."""
        require_non_negative_int("num_samples", num_samples)
        self.num_samples, self.shuffle = int(num_samples), shuffle
        if shuffle not in SHUFFLE_MODES:
            raise ConfigError(f"Unknown shuffle mode {shuffle!r}; use one of {SHUFFLE_MODES}.")
        if shuffle == "none":
            return
        rng = order_rng(seed, epoch)
        self._keys = round_keys(*rng.integers(0, 2**63 - 1, size=2).tolist())
        if shuffle == "global":
            return
        require_positive_int("window", window)
        sizes = np.asarray(blocks if len(blocks) else default_blocks(num_samples), np.int64)
        if int(sizes.sum()) != num_samples:
            raise ConfigError(
                f"Block sizes add up to {int(sizes.sum())} but the dataset has {num_samples} "
                "samples."
            )
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        if block_order is None:
            self._block_order = rng.permutation(sizes.size)
        else:
            self._block_order = np.asarray(block_order, dtype=np.int64)
            if not np.array_equal(np.sort(self._block_order), np.arange(sizes.size)):
                raise ConfigError(f"`block_order` is not a permutation of {sizes.size} blocks.")
        permuted = sizes[self._block_order]
        # Where each permuted block starts in the epoch, and where each window starts.
        self._pstarts = np.concatenate([[0], np.cumsum(permuted)]).astype(np.int64)
        self._wstarts = self._pstarts[::window].copy()
        if self._wstarts[-1] != num_samples:
            self._wstarts = np.append(self._wstarts, num_samples)
        self._starts = starts

    def _at(self, p: np.ndarray) -> np.ndarray:
        if self.shuffle == "none":
            return p
        if self.shuffle == "global":
            if self.num_samples <= KEPT_WINDOW:
                return self._window(0, self.num_samples, None)[p]
            return feistel(p, self.num_samples, self._keys)
        w = np.searchsorted(self._wstarts, p, side="right") - 1
        first = self._wstarts[w]
        if (w == w[0]).all() and self._wstarts[w[0] + 1] - first[0] <= KEPT_WINDOW:
            # One window, as consecutive batches mostly are: its permutation, kept.
            size = int(self._wstarts[w[0] + 1] - first[0])
            local = self._window(int(w[0]), size, int(w[0]))[p - first]
        else:
            local = feistel(p - first, self._wstarts[w + 1] - first, self._keys, tweak=w)
        target = first + local
        j = np.searchsorted(self._pstarts, target, side="right") - 1
        return self._starts[self._block_order[j]] + (target - self._pstarts[j])

    def _window(self, number: int, size: int, tweak: int | None) -> np.ndarray:
        """The bijection over one window, materialised once and kept (a few windows of at
        most KEPT_WINDOW samples: bounded memory; the values are the bijection's own)."""
        kept = self.__dict__.setdefault("_kept", {})
        found = kept.get(number)
        if found is None:
            found = feistel(np.arange(size), size, self._keys, 0 if tweak is None else tweak)
            kept[number] = found
            while len(kept) > KEPT_WINDOWS:
                kept.pop(next(iter(kept)), None)
        return found


def epoch_order(
    num_samples: int,
    *,
    seed: int,
    epoch: int,
    shuffle: ShuffleMode = "none",
    blocks: tuple[int, ...] = (),
    window: int = 8,
) -> np.ndarray:
    """The global sample order of one epoch, materialised as an int64 array (O(samples):
    the loader itself uses `EpochOrder`, which computes positions on demand).

    ``block`` mode permutes the blocks (row groups), then shuffles samples within each
    run of ``window`` consecutive blocks of that permuted order: a window's reads hit
    at most ``window`` row groups, which keeps remote Parquet reads sequential-ish.

    >>> epoch_order(6, seed=0, epoch=0).tolist()
    [0, 1, 2, 3, 4, 5]
    """
    order = EpochOrder(
        num_samples, seed=seed, epoch=epoch, shuffle=shuffle, blocks=blocks, window=window
    )
    return np.asarray(order)


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
    # Derived in __post_init__: samples one global step takes across all ranks, full steps
    # from the cursor, samples left after them for a last batch (0 under drop_last).
    step: int = field(init=False, repr=False, compare=False)
    _full_steps: int = field(init=False, repr=False, compare=False)
    _tail: int = field(init=False, repr=False, compare=False)
    _len: int = field(init=False, repr=False, compare=False)

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
        # Derived once: the loader asks for them every batch.
        step = self.batch_size * self.world_size
        full, rest = divmod(self.total - self.start, step)
        tail = 0 if self.drop_last else rest
        for name, value in (("step", step), ("_full_steps", full), ("_tail", tail),
                            ("_len", full + (1 if tail else 0))):  # fmt: skip
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return self._len

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

    @property
    def full_batches(self) -> int:
        """Batches of `batch_size` before the tail (`rows` covers them)."""
        return self._full_steps

    def rows(self, k: int, count: int) -> np.ndarray:
        """Positions of full batches k .. k + count - 1 as rows of a [count, batch_size]
        array: many batches looked up in one call."""
        if not 0 <= k <= k + count <= self._full_steps:
            raise IndexError(f"batches {k}..{k + count - 1} outside 0..{self._full_steps - 1}")
        firsts = self.start + np.arange(k, k + count, dtype=np.int64) * self.step
        return (firsts + self.rank * self.batch_size)[:, None] + np.arange(self.batch_size)

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


class LaneOrder(_Order):
    """Samples dealt to `lanes` lanes, a granule (one rank's batch) at a time, each lane a
    contiguous 1/lanes of the samples with its own order (`lane_orders`).

    Why: at world size == lanes, each global step takes one granule of every lane, and
    rank r's slice is a granule of lane r: rank r reads only lane r's share of a
    streamed corpus (about 1/world of its bytes), where one shared order would make
    every rank read every row group. The order depends on `lanes`, not on the world size,
    so a run resumed at another world size with the same lanes continues exactly (as
    Mosaic streaming's "canonical nodes").

    Worked example: 10 samples, 2 lanes ([0..4], [5..9]), granule 2, identity within
    lanes: positions 0-7 are granules of lanes 0, 1, 0, 1: 0 1 5 6 2 3 7 8; what is
    left of each lane follows, lane by lane: 4 9.
    """

    def __init__(self, lane_orders: list[EpochOrder], granule: int) -> None:
        require_positive_int("granule", granule)
        self.lanes, self.granule = lane_orders, granule
        sizes = np.array([len(o) for o in lane_orders], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.rounds = (int(sizes.min()) if sizes.size else 0) // granule
        self.regular = len(lane_orders) * granule * self.rounds
        left = sizes - self.rounds * granule
        self.tail_starts = self.regular + np.concatenate([[0], np.cumsum(left)]).astype(np.int64)
        self.num_samples = int(sizes.sum())

    def _at(self, p: np.ndarray) -> np.ndarray:
        count, g = len(self.lanes), p // self.granule
        lane = np.where(p < self.regular, g % count, 0)
        within = (g // count) * self.granule + p % self.granule
        tail = p >= self.regular
        if tail.any():
            lane[tail] = np.searchsorted(self.tail_starts, p[tail], side="right") - 1
            within[tail] = self.rounds * self.granule + p[tail] - self.tail_starts[lane[tail]]
        out = np.empty_like(p)
        for number in np.unique(lane).tolist():
            at = lane == number
            out[at] = self.starts[number] + self.lanes[number][within[at]]
        return out


def lane_sizes(num_samples: int, lanes: int) -> np.ndarray:
    """Samples in each of `lanes` contiguous lanes: equal, the first ones one more."""
    base, extra = divmod(num_samples, lanes)
    return np.array([base + (lane < extra) for lane in range(lanes)], dtype=np.int64)


# -- what a source tells the plan, and the orders made from it -------------------------
_LANE_STREAM = 0x4C414E45  # "LANE": each lane's sample order
_DOCUMENT_STREAM = 0x444F4353  # "DOCS": a token stream's row-group and document order
_CHUNK_STREAM = 0x43484E4B  # "CHNK": the order of an epoch's chunks of a token stream


def stream_rng(seed: int, epoch: int, *more: int) -> np.random.Generator:
    """The generator of a token stream's orders (row groups, documents, chunks) for
    (seed, epoch, more...): Philox keyed by the words, independent of the loader's."""
    words = [_DOCUMENT_STREAM, seed, epoch, *more]
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(words)))


@dataclass(frozen=True, eq=False)
class TokenStream:
    """A stream of packed windows as the plan sees it: row groups of `tokens` stream
    tokens each (documents and their eos), drawn in a random order per epoch (where
    `shuffled`), cut into windows of `seq_len`; a windowed shuffle mixes chunks of
    `groups_per_chunk` whole row groups."""

    tokens: np.ndarray
    seq_len: int
    groups_per_chunk: int
    shuffled: bool = True

    @property
    def windows(self) -> int:
        return int(self.tokens.sum()) // self.seq_len


@dataclass(frozen=True, eq=False)
class Layout:
    """What a source tells the plan about its samples, once, as a value: the plan (and
    nothing in the source) turns it and the loader's options into an order.

    blocks: contiguous blocks in sample order (row groups, or a windowed source's
        chunks), for shuffle="block"; () for `default_blocks`.
    modes: (loader's mode, mode run, window) where a shuffled loader (True or "block")
        runs another order over this source: a windowed shuffle of data larger than its
        window. shuffle="global" spelled out is never changed.
    lanes: contiguous shares the samples are dealt from, a granule of each in turn
        ("auto": the loader's world size).
    granule: samples a lane deals at a time (None: the loader's batch size).
    stream: a token stream whose chunks (of whole row groups) are the blocks of a
        windowed shuffle, per lane and epoch (`stream_lane_chunks`).
    epoch_samples: the samples themselves depend on the epoch (a per-epoch document
        order): read as epoch 0 when the loader does not shuffle, so every pass is the
        same (as torch's unshuffled loader's).
    refusal: why a shuffle over the whole data or its windows cannot run (a cache too
        small for it), raised when a loader asks for shuffle=True (or a mode of `modes`).
    """

    blocks: tuple[int, ...] | np.ndarray = ()
    modes: tuple[tuple[str, str, int], ...] = ()
    lanes: int | str = 1
    granule: int | None = 1
    stream: TokenStream | None = None
    epoch_samples: bool = False
    refusal: str | None = None


@dataclass(frozen=True)
class OrderChoice:
    """The order a loader runs over a source: a mode, its window and the lanes, resolved
    once from the source's `Layout` and the loader's options (`choose_order`).

    source_windowed: the source's layout turned the loader's shuffle into a windowed one
    (`Layout.modes`): the source shuffles by windows, and reads the next one ahead."""

    shuffle: str
    window: int
    lanes: int
    granule: int
    source_windowed: bool = False


def choose_order(
    layout: Layout,
    shuffle: str,
    window: int,
    *,
    batch_size: int,
    world_size: int,
    windowed_ok: bool = True,
) -> OrderChoice:
    """The mode, window, lanes and granule a loader's plan runs over a source: the
    loader's own, unless the source's layout says a shuffled loader runs windowed
    (`Layout.modes`); "auto" lanes become the world size."""
    source_windowed = False
    if windowed_ok and shuffle != "none":
        windowed = shuffle == "global" or any(asked == shuffle for asked, _, _ in layout.modes)
        if layout.refusal is not None and windowed:
            raise ConfigError(layout.refusal)
        for asked, run, run_window in layout.modes:
            if asked == shuffle:
                shuffle, window = run, run_window or window  # 0: the loader's window
                source_windowed = run == "block"
                break
    lanes = int(world_size) if layout.lanes == "auto" else int(layout.lanes)
    granule = int(batch_size) if layout.granule is None else int(layout.granule)
    return OrderChoice(shuffle, int(window), lanes, granule, source_windowed)


def plan_order(
    layout: Layout, num_samples: int, seed: int, epoch: int, choice: OrderChoice
) -> EpochOrder | LaneOrder:
    """Epoch `epoch`'s order over a source of `layout`, as `choice` says: a pure
    function of integers (and the layout's arrays)."""
    shuffle, lanes = choice.shuffle, choice.lanes
    chunks = None
    if shuffle == "block" and layout.stream is not None:
        chunks = stream_chunks(layout.stream, seed, epoch, lanes)
    if lanes == 1:
        if chunks is not None:
            sizes, order = chunks(0)
            return EpochOrder(num_samples, seed=seed, epoch=epoch, shuffle="block",
                              blocks=sizes, window=1, block_order=order)  # fmt: skip
        return EpochOrder(num_samples, seed=seed, epoch=epoch, shuffle=shuffle,  # type: ignore[arg-type]
                          blocks=layout.blocks if shuffle == "block" else (),
                          window=choice.window)  # fmt: skip
    per_chunk = int(layout.blocks[0]) if len(layout.blocks) else 1
    return chunked_lane_order(num_samples, lanes, choice.granule, per_chunk, seed, epoch,
                              shuffle, chunks)  # fmt: skip


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
        orders.append(EpochOrder(size, seed=lane_seed, epoch=epoch, shuffle=shuffle,  # type: ignore[arg-type]
                                 blocks=blocks, window=1, block_order=block_order))  # fmt: skip
    return LaneOrder(orders, granule)


def stream_order(stream: TokenStream, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(row-group order, prefix sums of their stream tokens) of epoch `epoch`."""
    order = np.arange(stream.tokens.size)
    if stream.shuffled:
        order = stream_rng(seed, epoch).permutation(stream.tokens.size)
    cum = np.zeros(order.size + 1, dtype=np.int64)
    np.cumsum(stream.tokens[order], out=cum[1:])
    return order, cum


def stream_chunk_edges(
    cum: np.ndarray, seq_len: int, windows: int, lanes: int, groups_per_chunk: int
) -> list[tuple[int, int, np.ndarray, np.ndarray]]:
    """Per lane: its windows [a, b), the positions (in the epoch's row-group order, whose
    prefix sums are `cum`) at which its chunks after the first begin, and the window that
    straddles each such edge. Chunks are whole row groups, `groups_per_chunk` at most, so
    a chunk's windows read only its row groups, except that straddling window; an edge
    that would leave a chunk without a window of its own is dropped (chunks merge)."""
    end, per, edges, a = int(cum[-1]), groups_per_chunk, [], 0
    for size in lane_sizes(windows, lanes).tolist():
        b = a + size
        first = int(np.searchsorted(cum, a * seq_len, side="right") - 1)
        last = int(np.searchsorted(cum, min(b * seq_len, end - 1), side="right") - 1)
        groups = max(last - first + 1, 1)
        cuts = np.linspace(0, groups, -(-groups // per) + 1).round().astype(np.int64)
        positions, straddlers, before = [], [], a - 1
        for position in (first + cuts[1:-1]).tolist():
            window = (int(cum[position]) - 1) // seq_len
            if before + 2 <= window <= b - 2:  # each chunk keeps a window of its own
                positions.append(position)
                straddlers.append(window)
                before = window
        edges.append((a, b, np.array(positions, np.int64), np.array(straddlers, np.int64)))
        a = b
    return edges


def stream_lane_chunks(
    edges: tuple[int, int, np.ndarray, np.ndarray], seed: int, epoch: int, lane: int
) -> tuple[np.ndarray, np.ndarray]:
    """A lane's chunk sizes (in windows) and the order they are read in. The window that
    straddles two chunks goes to whichever of them is read later, which cuts it from a
    piece of the other kept when that one was read: no row group is read twice."""
    a, b, _, straddlers = edges
    order = stream_rng(seed, epoch, _CHUNK_STREAM, lane).permutation(straddlers.size + 1)
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    bounds = straddlers + (rank[1:] < rank[:-1])  # the straddler stays with the later
    return np.diff(np.concatenate([[a], bounds, [b]])).astype(np.int64), order


def stream_chunks(
    stream: TokenStream, seed: int, epoch: int, lanes: int
) -> Callable[[int], tuple[np.ndarray, np.ndarray]]:
    """lane -> (its chunk sizes in windows, their order) for a windowed epoch."""
    _, cum = stream_order(stream, seed, epoch)
    edges = stream_chunk_edges(cum, stream.seq_len, stream.windows, lanes, stream.groups_per_chunk)
    return lambda lane: stream_lane_chunks(edges[lane], seed, epoch, lane)


def stream_edge_pieces(
    order: np.ndarray,
    cum: np.ndarray,
    edges: list[tuple[int, int, np.ndarray, np.ndarray]],
    seq_len: int,
) -> dict[int, list[tuple[int, int]]]:
    """For each row group at a chunk's edge, the tokens (from its segment's start) of the
    straddling window that it holds: the tail of a chunk's last row group, the head of
    the next one's first. What a reader keeps so that no row group is read twice."""
    end, pieces = int(cum[-1]), {}
    for _, _, positions, straddlers in edges:
        for position, window in zip(positions.tolist(), straddlers.tolist(), strict=True):
            lo, edge = window * seq_len, int(cum[position])
            hi = min(lo + seq_len + 1, end)
            if cum[position - 1] <= lo:  # the tail lies in one row group
                base = int(cum[position - 1])
                pieces.setdefault(int(order[position - 1]), []).append((lo - base, edge - base))
            if hi <= cum[position + 1]:  # and the head
                pieces.setdefault(int(order[position]), []).append((0, hi - edge))
    return pieces
