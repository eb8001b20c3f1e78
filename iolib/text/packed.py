"""Packed token windows for language-model pretraining: `PackedTokens`, streamed.

Documents (rows of a `list<int>` token column) are concatenated in an order drawn per
epoch, each followed by `eos_id`, and the stream is cut into windows of `seq_len`
tokens; sample k of epoch e is window k. Packing lives in the plan, not in a stateful
buffer: window k is a pure function of (seed, e, seq_len, data), so worker counts,
prefetch depth, resume points and world sizes cannot change it.

Memory is bounded by `cache_bytes`, not by the corpus; the order by `shuffle_window`,
never by `cache_bytes`. The stream of epoch e is the
row groups in a permuted order (a small array), each contributing its non-empty
documents in a shuffled order; a per-row-group index of token counts (computed once,
`iolib.text.tokenindex`) gives the prefix sums that locate window k's row groups. Only
those row groups are read, a batch's in parallel and the next batches' ahead, and a
bounded cache keeps the decoded ones. The loader's shuffle then orders the windows:
within chunks of whole row groups that fit `shuffle_window` (the cache holds two: this
one, and the next read while this one is cut), chunks in a random order; a corpus that
fits the window is one chunk, a full shuffle. The window that straddles two chunks goes
to the one read later, cut from a piece of the other kept when it was read: each row
group is read once an epoch.

Worked example: documents [a a a], [b], [c c c c] in one row group with eos E, seq_len
4, no document shuffle: the stream is a a a E b E c c c c E (11 tokens), windows
[a a a E] [b E c c] and the last partial [c c E] is dropped; position_ids are
[0 1 2 3] [0 1 0 1].
"""

from __future__ import annotations

import hashlib
import logging
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import cachetools
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from iolib.errors import ConfigError, DataError
from iolib.forks import reset_after_fork
from iolib.plan import (
    DEFAULT_SHUFFLE_WINDOW,
    Layout,
    TokenStream,
    default_blocks,
    stream_chunk_edges,
    stream_edge_pieces,
    stream_order,
    stream_rng,
    window_groups,
)
from iolib.redact import Redactor
from iolib.resources import parse_bytes
from iolib.sources.parquet import ParquetSource
from iolib.sources.parquet_fetch import decode_slots
from iolib.storage import count_bytes, is_local, open_filesystem, take_counters
from iolib.storage.counters import count_retries
from iolib.text import tokenindex
from iolib.text.kernels import loops
from iolib.text.seeded import SeededSource, check_lanes

IGNORE_INDEX = -100  # torch's cross_entropy default ignore_index
DEFAULT_CACHE_BYTES = 1 << 30  # per process: two default shuffle windows
FETCH_THREADS = 8  # row-group reads in flight from a remote store (`_read_threads`)
MIN_GROUPS_HELD = 4  # two chunks of two row groups: this one, and the next read ahead
READAHEAD_BATCHES = 64  # batches past the next chunk's first whose row groups may be read
BEHIND_BATCHES = 4  # batches before this one that other workers may still be reading
RETRY_BATCHES = 8  # batches a read-ahead that found no room waits before it looks again
log = logging.getLogger(__name__)


class Segment:
    """One row group's part of an epoch's stream: its non-empty documents in the epoch's
    order, each followed by eos (`tokens`); where each document starts (with the length
    as the last entry: document j's eos is at ``starts[j + 1] - 1``, so that eos_id may
    also be an ordinary token) and its row across the dataset. It holds exactly the
    bytes `PackedTokens` budgets for it: its tokens and 16 a document."""

    def __init__(
        self, tokens: np.ndarray, starts: np.ndarray, rows: np.ndarray, offset: int = 0
    ) -> None:
        self.tokens, self.starts, self.rows = tokens, starts, rows
        self.offset = offset  # where tokens[0] is in the row group's stream (a piece's)
        self.nbytes = tokens.nbytes + starts.nbytes + rows.nbytes

    def piece(self, a: int, b: int) -> Segment:
        """Tokens [a, b) of this segment, kept for the window that straddles two chunks:
        its eos (``starts[1:] - 1``, as a segment's) and the rows of its documents."""
        ends = self.starts[1:] - 1
        inside = ends[(ends >= a) & (ends < b)] - a
        starts = np.concatenate([[0], inside + 1]).astype(np.int64)
        first = int(np.searchsorted(self.starts, a, side="right") - 1)
        rows = self.rows[first : first + starts.size].copy()
        return Segment(self.tokens[a:b].copy(), starts, rows, offset=a)

    @classmethod
    def build(
        cls, array: pa.ChunkedArray, first_row: int, eos: int, order: np.random.Generator | None
    ) -> Segment:
        """Copy the documents in, one slice each: no temporary larger than the row
        group's own values (a vectorised gather would take 8 bytes a token)."""
        array = array.combine_chunks()
        values = array.flatten().to_numpy(zero_copy_only=False)
        lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
        lengths = lengths.astype(np.int64)
        offsets = np.cumsum(lengths) - lengths  # into `values` (nulls add no values)
        docs = np.flatnonzero(lengths)
        if order is not None:
            docs = docs[order.permutation(docs.size)]
        starts = np.zeros(docs.size + 1, dtype=np.int64)
        np.cumsum(lengths[docs] + 1, out=starts[1:])
        tokens = np.empty(int(starts[-1]), dtype=values.dtype)
        loops.pack_documents(values, offsets[docs], lengths[docs], starts, tokens)
        tokens[starts[1:] - 1] = eos
        return cls(tokens, starts, docs + first_row)


class PackedTokens(SeededSource):
    """Fixed windows of `seq_len` tokens cut from the documents of a token column,
    concatenated (each followed by `eos_id`) in a per-epoch document order, streamed
    with memory bounded by `cache_bytes`.

    Example::

        from iolib import DataLoader
        from iolib.text import PackedTokens

        windows = PackedTokens("s3://bucket/corpus/*.parquet", column="input_ids",
                               seq_len=2048, eos_id=tokenizer.eos_token_id)
        loader = DataLoader(windows, batch_size=16, shuffle=True, seed=0)
        batch = next(iter(loader))   # input_ids, labels, position_ids: int64 [16, 2048]

    Each batch holds:

    - ``input_ids``: the window's tokens.
    - ``labels``: the next token of the same document at each position (already
      shifted: do not shift again), `ignore_index` (-100) at each eos, whose successor
      belongs to another document. ``cross_entropy(logits.flatten(0, 1),
      labels.flatten(), ignore_index=-100)``.
    - ``position_ids``: restart at 0 at each document and at each window's start (a
      document cut by a window boundary continues in the next window as a new
      sequence). `cu_seqlens(position_ids)` gives variable-length attention kernels
      their boundaries.
    - ``document_ids`` (with `document_ids=True`): the row of each token's document.

    Guarantees: every token of every non-empty document appears exactly once per epoch
    in ``input_ids`` (only the last partial window is dropped), in order; windows are a
    pure function of (seed, epoch, seq_len, data, shuffle_window), never of
    `cache_bytes`, workers or world size (with `lanes` given); the document order
    differs per epoch (unless `shuffle_documents=False`). Documents longer than
    `seq_len` are split, never dropped; empty and null documents add nothing (not even
    an eos).

    source: a ParquetSource, or its URL(s). column: the `list<int>` token column.
    shuffle_window: decoded bytes (an int, or a size like "256MiB") whose windows the
        loader's shuffle mixes together (default 512 MiB, fixed: the order depends on
        it): chunks of as many whole row groups as it holds, chunks in a random order;
        a corpus that fits is shuffled as a whole. Raising it mixes more widely and
        needs a larger cache.
    cache_bytes: decoded row groups kept per process (default 1 GiB): memory only, the
        windows are the same at any `cache_bytes` that runs. It must hold two chunks of
        the shuffle window (this one, and the next read ahead), or the whole corpus and
        three row groups where the corpus fits the window, and four of the largest row
        groups: a smaller one is refused when the loader starts, with both sizes.
    lanes: how many contiguous shares of the stream the windows are dealt from, one
        batch of each in turn ("auto", the default: the loader's world size). At world
        size == lanes, rank r reads only share r: about 1/world of the corpus's bytes.
        The order depends on it: to resume at another world size, pass the first run's
        world size (as Mosaic streaming's `num_canonical_nodes`).
    seed: only for use outside a loader; a DataLoader sets its own `seed`.
    """

    columnar = True

    # Per-process state: a process worker reads again rather than receive it by pipe.
    _RUNTIME = ("_lock", "_epochs", "_segments", "_flights", "_pool", "_io", "_plans", "_hint",
                "_recent", "_ahead", "_lanes_planned", "_ranges", "_pieces")  # fmt: skip

    def __init__(
        self,
        source: ParquetSource | str | list[str],
        *,
        column: str,
        seq_len: int,
        eos_id: int,
        shuffle_documents: bool = True,
        document_ids: bool = False,
        ignore_index: int = IGNORE_INDEX,
        storage_options: dict[str, Any] | None = None,
        seed: int = 0,
        cache_bytes: int | None = None,
        lanes: int | str = "auto",
        shuffle_window: int | str = DEFAULT_SHUFFLE_WINDOW,
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(f"`seq_len` must be an integer >= 1. Found: {seq_len!r}.")
        if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)):
            raise ConfigError(f"`eos_id` must be an integer token id. Found: {eos_id!r}.")
        if cache_bytes is not None and (
            isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 1
        ):
            raise ConfigError(f"`cache_bytes` must be a positive integer. Found: {cache_bytes!r}.")
        if not isinstance(source, ParquetSource):
            source = ParquetSource(source, storage_options=storage_options)
        # The reader of row groups: no cache of its own (this source keeps segments).
        self.parquet = source.uncached([column])
        self.column, self.seq_len, self.eos_id = column, seq_len, int(eos_id)
        self.shuffle_documents, self.document_ids = bool(shuffle_documents), bool(document_ids)
        self.ignore_index, self.seed = int(ignore_index), int(seed)
        self.cache_bytes = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
        self.shuffle_window = parse_bytes(shuffle_window, "shuffle_window")
        self.lanes = check_lanes(lanes)
        self._index: tokenindex.TokenIndex | None = None
        self._windowed_said = False
        self._init_runtime()

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._segments: cachetools.LRUCache = cachetools.LRUCache(
            self.cache_bytes, getsizeof=lambda seg: seg.nbytes
        )
        self._flights: dict[tuple[int, int], Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._io = [0, 0]  # bytes and retries read by helper threads, not yet counted
        self._plans: dict[int, Any] = {}  # epoch -> this rank's batches (from the plan)
        self._hint, self._hint_epoch = 0, -1  # the batch last found, and its epoch
        self._ahead = (-1, -1)  # (epoch, batch) whose row groups were last read ahead
        self._stalled = (-1, -1)  # (epoch, batch found) when reading ahead last found no room
        self._recent: dict[tuple[int, int], np.ndarray] = {}
        self._lanes_planned: dict[int, set[int]] = {}  # epoch -> lanes its plans deal to
        self._ranges: dict[tuple, dict] = {}  # (epoch, lanes) -> what edge row groups keep
        self._pieces: dict[tuple[int, int], list[Segment]] = {}  # (epoch, group) -> pieces
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """The parent's threads (and reads in flight) are gone in a forked worker."""
        super()._after_fork()
        self._flights, self._pool = {}, None

    def close(self) -> None:
        """Stop the read threads and drop the cached row groups."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            self._segments.clear()
            self._pieces.clear()
        self.parquet.close()

    # -- metadata ------------------------------------------------------------------------
    @property
    def index(self) -> tokenindex.TokenIndex:
        """Tokens and documents per row group: from beside the data, the local cache,
        or counted once (`iolib.text.tokenindex`)."""
        if self._index is None:
            with self._lock:
                if self._index is None:
                    self._check_column()
                    index = tokenindex.load_or_compute(self.parquet, self.column)
                    self._check_budget(index)  # refused every time, not only the first
                    self._index = index
        return self._index

    def _check_column(self) -> None:
        field = self.parquet.schema.field(self.column)
        kind = field.type
        is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if not (is_list and pa.types.is_integer(kind.value_type)):
            raise DataError(
                f"Column {self.column!r} of {self.parquet.describe()} is {kind}: "
                "PackedTokens needs a list of integer token ids (list<int32>, list<int64>...)."
            )
        if pa.types.is_uint64(kind.value_type):
            raise DataError(
                f"Column {self.column!r} of {self.parquet.describe()} holds uint64 token "
                "ids, which int64 tensors cannot hold above 2^63 - 1. Write the ids as int64 "
                "or int32 (every tokenizer's vocabulary fits)."
            )
        info = np.iinfo(np.dtype(kind.value_type.to_pandas_dtype()))
        if not info.min <= self.eos_id <= info.max:
            raise ConfigError(
                f"`eos_id` {self.eos_id} does not fit the column's {kind.value_type} "
                f"({info.min}..{info.max}). Use the tokenizer's end-of-document id."
            )

    @property
    def _itemsize(self) -> int:
        return np.dtype(
            self.parquet.schema.field(self.column).type.value_type.to_pandas_dtype()
        ).itemsize

    def _segment_bytes(self, index: tokenindex.TokenIndex) -> np.ndarray:
        """Memory of each row group's segment: its stream tokens, 16 bytes a document."""
        return index.stream * self._itemsize + 16 * index.documents + 8

    @property
    def _group_bytes(self) -> np.ndarray:
        """`_segment_bytes` of this source's index, computed once: reads ask it for
        every row group they start."""
        sizes = self.__dict__.get("_group_bytes_")
        if sizes is None:
            sizes = self.__dict__["_group_bytes_"] = self._segment_bytes(self.index)
        return sizes

    def _check_budget(self, index: tokenindex.TokenIndex) -> None:
        """Refuse a cache that cannot hold what the order reads together: four of the
        largest row groups, and two chunks of the shuffle window (or the whole corpus and
        three row groups, where it fits the window); the message names both sizes."""
        sizes = self._segment_bytes(index)
        largest = int(sizes.max(initial=0))
        need, why = (
            MIN_GROUPS_HELD * largest,
            (
                f"fewer than {MIN_GROUPS_HELD} of the largest row groups of {self.column!r} "
                f"({largest:,} bytes decoded): a chunk of two and the next one, read while this "
                "one is cut"
            ),
        )
        groups = window_groups(sizes, self.shuffle_window)
        chunks = 2 * (groups or 0) * largest
        whole = int(sizes.sum()) + (MIN_GROUPS_HELD - 1) * largest
        if groups is not None and chunks > need:
            need, why = (
                chunks,
                (
                    f"less than two chunks of shuffle_window={self.shuffle_window} ({groups} row "
                    f"groups each, {chunks:,} bytes decoded: this one and the next, read ahead)"
                ),
            )
        elif groups is None and whole > need:
            need, why = (
                whole,
                (
                    f"less than the corpus, which fits shuffle_window={self.shuffle_window} and "
                    f"is shuffled whole ({whole:,} bytes decoded with three row groups in flight)"
                ),
            )
        if need <= self.cache_bytes:
            return
        smaller = min(self.cache_bytes // 2, int(sizes.sum()) - 1)
        lower = (
            f", or lower shuffle_window to {smaller} or less (the order follows "
            "shuffle_window, never cache_bytes)"
            if MIN_GROUPS_HELD * largest <= self.cache_bytes and smaller > 0
            else " or write the data with smaller row groups"
        )
        raise ConfigError(
            f"{self.describe()}: `cache_bytes`={self.cache_bytes} holds {why}. Raise "
            f"`cache_bytes` to at least {need}{lower}."
        )

    def shuffle_window_groups(self) -> int:
        """Row groups whose windows the loader's shuffle mixes (a chunk): as many of the
        largest as `shuffle_window` holds; all where the corpus fits in it."""
        groups = window_groups(self._group_bytes, self.shuffle_window)
        return int(self._group_bytes.size) if groups is None else groups

    def blocks(self) -> np.ndarray:
        """Chunks of consecutive windows, each about one shuffle window of row groups:
        the loader shuffles windows within a chunk, and chunks among themselves."""
        index, windows = self.index, len(self)
        groups = max(index.tokens.size, 1)
        per_chunk = int(index.stream.sum()) * self.shuffle_window_groups() // groups
        return default_blocks(windows, max(1, per_chunk // self.seq_len))

    @property
    def _stream(self) -> TokenStream:
        """The stream as the plan sees it (row groups' stream tokens, chunking), once."""
        found = self.__dict__.get("_stream_")
        if found is None:
            found = self.__dict__["_stream_"] = TokenStream(
                self.index.stream, self.seq_len, self.shuffle_window_groups(),
                self.shuffle_documents,
            )  # fmt: skip
        return found

    def layout(self) -> Layout:
        """Windows dealt to lanes a batch at a time (lanes="auto": one per rank); a
        shuffled loader mixes them within chunks of whole row groups (the stream's), one
        chunk at a time, so that a batch's row groups fit the cache; a full shuffle where
        the corpus fits the window. The document order follows the epoch."""
        windowed = len(self.blocks()) > 1
        if windowed and not self._windowed_said:
            self._windowed_said = True
            log.info(
                "%s: the corpus is larger than shuffle_window (%d bytes decoded): windows "
                "are shuffled within %d-row-group chunks, chunks in a random order, where the "
                "loader shuffles (raise shuffle_window to shuffle more widely; docs/tokens.md).",
                self.describe(),
                self.shuffle_window,
                self.shuffle_window_groups(),
            )
        modes = (("global", "block", 1), ("block", "block", 1)) if windowed else (
            ("block", "global", 0),
        )  # fmt: skip
        return Layout(blocks=self.blocks(), modes=modes, lanes=self.lanes, granule=None,
                      stream=self._stream, epoch_samples=self.shuffle_documents)  # fmt: skip

    def fit_cache(self, row_groups: int) -> int:
        return self.cache_bytes  # the budget is the user's, not the loader's estimate

    def _horizon(self, epoch: int) -> int:
        """Batches ahead whose row groups may be read: a chunk's (this rank's batches of
        one chunk, from the plan's lanes and batch size) and some, so that the next chunk
        is read while this one is cut."""
        plan = self._plans.get(epoch)
        found = getattr(plan, "horizon", None)
        if found is None:
            blocks = self.blocks()
            per_chunk = int(blocks[0]) if len(blocks) > 1 else 0
            lanes, world, granule = _lanes_of(plan)
            share = max(1, lanes // max(world, 1))
            found = -(-per_chunk * share // max(granule, 1)) + READAHEAD_BATCHES
            if plan is not None:
                plan.horizon = found
        return found

    def _edge_pieces(self, epoch: int) -> dict[int, list[tuple[int, int]]]:
        """For each row group at a chunk's edge, the tokens of the straddling window that
        it holds (`plan.stream_edge_pieces`), for the lanes each plan of this epoch deals
        to (one source may serve several loaders)."""
        lanes = tuple(sorted(self._lanes_planned.get(epoch, {1})))
        found = self._ranges.get((epoch, lanes))
        if found is not None:
            return found
        order, cum = self._epoch(epoch)
        pieces: dict[int, list[tuple[int, int]]] = {}
        stream = self._stream
        for count in lanes:
            edges = stream_chunk_edges(cum, self.seq_len, len(self), count,
                                       stream.groups_per_chunk)  # fmt: skip
            for group, ranges in stream_edge_pieces(order, cum, edges, self.seq_len).items():
                pieces.setdefault(group, []).extend(ranges)
        with self._lock:
            self._ranges = {k: v for k, v in self._ranges.items() if k[0] >= epoch - 1}
            self._ranges[(epoch, lanes)] = pieces
        return pieces

    def __len__(self) -> int:
        """Windows per epoch: the same every epoch (the stream's length does not change)."""
        windows = self.__dict__.get("_windows")
        if windows is None:  # read() checks against it every batch: O(row groups) once
            windows = self.__dict__["_windows"] = int(self.index.stream.sum()) // self.seq_len
        return windows

    def fingerprint(self) -> str:
        words = f"{self.parquet.fingerprint()}|{self.column}|{self.seq_len}|{self.eos_id}"
        chunks = len(self.blocks())
        # The lanes are the plan's (resolved from "auto"): the loader adds them.
        words += f"|{self.shuffle_documents}|{chunks}"
        if chunks > 1:  # windowed: a checkpoint of the chunks cut in window space is refused
            words += f"|chunks of row groups|window {self.shuffle_window_groups()}"
        return hashlib.sha256(words.encode()).hexdigest()[:16]

    def redactor(self) -> Redactor:
        return self.parquet.redactor()

    def describe(self) -> str:
        return f"PackedTokens({self.parquet.describe()}, seq_len={self.seq_len})"

    def locate(self, index: int) -> str:
        return f"packed window {index} of {self.parquet.describe()}"

    def cache_stats(self) -> dict[str, int]:
        with self._lock:
            return {"cache_budget_bytes": self.cache_bytes,
                    "cache_held_bytes": int(self._segments.currsize)}  # fmt: skip

    # -- the plan ------------------------------------------------------------------------
    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(row-group order, prefix sums of their stream tokens) for `epoch`: O(row groups)."""
        key = (self.seed, epoch)
        found = self._epochs.get(key)
        if found is not None:
            return found
        order, cum = stream_order(self._stream, self.seed, epoch)
        with self._lock:
            self._epochs[key] = (order, cum)
            for old in [k for k in self._epochs if k[1] < epoch - 1]:
                del self._epochs[old]  # keep this epoch and the one before (read ahead)
            for old in [k for k in self._pieces if k[0] < epoch - 1]:
                del self._pieces[old]
        return order, cum

    def plan_epoch(self, epoch: int, batches: Any) -> None:
        """This rank's batches of windows: reads run ahead along them; the lanes of the
        plan they come from say which windows straddle chunks (what to keep of a row
        group at a chunk's edge)."""
        lanes, _, _ = _lanes_of(batches)
        with self._lock:
            self._plans = {e: b for e, b in self._plans.items() if e == epoch - 1}
            self._plans[epoch] = batches
            planned = self._lanes_planned
            self._lanes_planned = {e: v for e, v in planned.items() if e >= epoch - 1}
            self._lanes_planned.setdefault(epoch, set()).add(lanes)

    def _groups_of(self, windows: np.ndarray, epoch: int) -> np.ndarray:
        """Positions (in the epoch's row-group order) that windows' tokens come from,
        with the token after each window (its last label)."""
        _, cum = self._epoch(epoch)
        lo = windows * self.seq_len
        hi = np.minimum(lo + self.seq_len, cum[-1] - 1)
        first = np.searchsorted(cum, lo, side="right") - 1
        last = np.searchsorted(cum, hi, side="right") - 1
        if (last - first <= 1).all():  # a window in one or two segments: no gaps to fill
            return np.unique(np.concatenate([first, last]))
        counts = last - first + 1
        spans = np.repeat(first, counts) + (
            np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        )
        return np.unique(spans)

    # -- reads ---------------------------------------------------------------------------
    def _fetch(
        self,
        epoch: int,
        position: int,
        windows: np.ndarray,
        ahead: bool = False,
        keep: set | None = None,
    ) -> Segment | Future | None:
        """The segment at `position` of the epoch's row-group order if held, else a piece
        of it that holds all that `windows` need of it, else its read: shared if in
        flight (one read however many threads want it), else started; None when reading
        ahead finds no room, even after dropping the held segments not in `keep` (those
        the batches around this one read)."""
        order, _ = self._epoch(epoch)
        key = (epoch, int(order[position]))
        with self._lock:
            held = self._segments.get(key)
            if held is not None:
                return held
            flight = self._flights.get(key)
            if flight is not None:
                return flight
            pieces = self._pieces.get(key)
        if pieces:
            piece = self._covering(pieces, epoch, position, windows)
            if piece is not None:
                return piece
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                return flight
            if ahead and not self._room_for(key, keep):
                return None  # no room to read ahead: the batch that needs it will
            if self._pool is None:
                threads = self._read_threads()
                self._pool = ThreadPoolExecutor(threads, thread_name_prefix="iolib-tokens")
                weakref.finalize(self, self._pool.shutdown, wait=False)
            flight = self._flights[key] = self._pool.submit(self._load, key)
        return flight

    def _covering(
        self, pieces: list[Segment], epoch: int, position: int, windows: np.ndarray
    ) -> Segment | None:
        """The piece of the row group at `position` that holds every token (and next
        token) that `windows` take from it, if one does."""
        _, cum = self._epoch(epoch)
        lo = windows * self.seq_len
        hi = np.minimum(lo + self.seq_len + 1, cum[-1])
        base, top = int(cum[position]), int(cum[position + 1])
        touch = (lo < top) & (hi > base)
        if not touch.any():
            return None
        need_lo, need_hi = max(int(lo[touch].min()), base), min(int(hi[touch].max()), top)
        for piece in pieces:
            start = base + piece.offset
            if start <= need_lo and need_hi <= start + piece.tokens.size:
                return piece
        return None

    def _read_threads(self) -> int:
        """Row-group reads in flight: FETCH_THREADS from a remote store, whose rate per
        connection is far below its total; from local disk as many as decode at once: a
        read there is all decode, and more threads only hold more memory (each thread's
        allocator keeps what its reads freed)."""
        options = self.parquet.storage_options
        local = all(is_local(open_filesystem(url, options)[0]) for url in self.parquet.urls)
        return decode_slots() if local else FETCH_THREADS

    def _room_for(self, key: tuple[int, int], keep: set | None) -> bool:
        """Whether the cache has room to read `key` ahead, made by dropping held segments
        not in `keep`, oldest read first: when the next chunk's row groups are due the
        cache is full of the last chunk's, which it would otherwise keep until a batch
        has to wait for its reads. Under the lock."""
        size, budget = int(self._group_bytes[key[1]]), self.cache_bytes
        if self._segments.currsize + self._in_flight_bytes() + size <= budget:
            return True
        for old in [k for k in self._segments if k not in keep] if keep is not None else ():
            del self._segments[old]
            if self._segments.currsize + self._in_flight_bytes() + size <= budget:
                return True
        return False

    def _in_flight_bytes(self) -> int:
        """A read in flight counts as the segment it will be: the decoder's own buffers
        exist only while a decode slot (one a core) holds it, bounded by the cores, not by
        the reads queued (counted 3x, the next chunk was not read ahead in time)."""
        sizes = self._group_bytes
        return int(sum(sizes[group] for _, group in self._flights))

    def _load(self, key: tuple[int, int]) -> Segment:
        epoch, group = key
        try:
            table = tokenindex.unskippable(lambda: self.parquet.fetch_row_group(group))
            first_row = int(self.parquet.row_starts()[group])
            order = stream_rng(self.seed, epoch, group) if self.shuffle_documents else None
            segment = Segment.build(table.column(self.column), first_row, self.eos_id, order)
            del table
            # A corpus in one chunk has no edges: nothing to keep.
            pieces = [segment.piece(a, b) for a, b in self._edge_pieces(epoch).get(group, ())]
            with self._lock:
                self._segments[key] = segment
                if pieces:
                    self._pieces[key] = pieces
            return segment
        finally:
            read, retries = take_counters()
            with self._lock:
                self._io[0] += read
                self._io[1] += retries
                self._flights.pop(key, None)
                idle = not self._flights
            if idle:
                # Arrow's pool may keep freed pages (mimalloc, pyarrow's default, per read
                # thread). Returned when the reads pause (after each one, it cost ~15% more
                # CPU a batch).
                pa.default_memory_pool().release_unused()

    def _planned(self, epoch: int, k: int) -> tuple[np.ndarray, list[int], frozenset]:
        """Windows of batch k of the plan, the positions of their row groups and the
        keys of their segments (the batches read ahead are kept: each costs an order
        lookup, and they are asked for again to find this batch and to know which
        segments to keep)."""
        key = (epoch, k)
        found = self._recent.get(key)
        if found is None:
            windows = np.asarray(self._plans[epoch][k], dtype=np.int64)
            positions = self._groups_of(windows, epoch).tolist()
            order, _ = self._epoch(epoch)
            found = (windows, positions, frozenset((epoch, int(order[p])) for p in positions))
            with self._lock:
                self._recent[key] = found
                while len(self._recent) > self._horizon(epoch) + 4 * BEHIND_BATCHES:
                    del self._recent[next(iter(self._recent))]
        return found

    def _find(self, windows: np.ndarray, epoch: int) -> int | None:
        """Which batch of the plan `windows` are, found by its first window next to the
        last one found; None outside the plan (a read by hand, a sample retried alone)."""
        batches = self._plans.get(epoch)
        if batches is None or not windows.size:
            return None
        # A new epoch's search starts at its first batch, not at the last one's number.
        hint = self._hint if self._hint_epoch == epoch else -1
        total, first = len(batches), int(windows[0])
        for k in (hint + 1, hint, hint + 2, *range(hint + 3, hint + 64), *range(hint - 8, hint)):
            planned = self._planned(epoch, k)[0] if 0 <= k < total else None
            if planned is not None and planned.size and int(planned[0]) == first:
                self._hint, self._hint_epoch = k, epoch
                return k
        return None

    def _read_ahead(self, epoch: int) -> None:
        """Start reading the row groups of the batches after the last one found
        (`_find`), where the cache has room."""
        total = len(self._plans[epoch])
        # Room comes back only as batches pass: looking for it each batch cost more than
        # the cut with a 128 MiB cache (the batches ahead's keys, gathered each time).
        if self._stalled[0] == epoch and self._hint < self._stalled[1] + RETRY_BATCHES:
            return
        # Batches up to `_ahead` were looked at already: only the newest one is new.
        done_epoch, done = self._ahead
        start = max(self._hint + 1, done + 1 if done_epoch == epoch else 0)
        for k in range(start, min(total, self._hint + 1 + self._horizon(epoch))):
            keep, (windows, positions, _) = None, self._planned(epoch, k)
            for position in positions:
                found = self._fetch(epoch, position, windows, ahead=True)
                if found is None:  # make room from segments no batch near this one reads
                    keep = keep or self._needed(epoch, k)
                    found = self._fetch(epoch, position, windows, ahead=True, keep=keep)
                if found is None:
                    self._stalled = (epoch, self._hint)
                    return  # no room: this batch is looked at again a few batches on
            self._ahead = (epoch, k)

    def _needed(self, epoch: int, upto: int) -> set[tuple[int, int]]:
        """Keys of the segments that the batches from a few before this one (other
        workers may still be reading them) up to batch `upto` read."""
        near = range(max(0, self._hint - BEHIND_BATCHES), upto + 1)
        return set().union(*(self._planned(epoch, b)[2] for b in near))

    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        """Windows `indices` of `epoch`, as fixed-size-list columns (collated to [B, L]
        tensors without a copy)."""
        windows = np.asarray(indices, dtype=np.int64)
        if windows.size and (windows.min() < 0 or windows.max() >= len(self)):
            raise IndexError(f"window indices outside 0..{len(self) - 1}")
        k = self._find(windows, epoch)
        planned = self._planned(epoch, k) if k is not None else None
        if planned is not None and np.array_equal(planned[0], windows):
            positions = planned[1]  # found when this batch was read ahead
        else:
            positions = self._groups_of(windows, epoch).tolist()
        found = {p: self._fetch(epoch, p, windows) for p in positions}  # reads all at once
        if k is not None:
            self._read_ahead(epoch)
        segments = {p: f if isinstance(f, Segment) else f.result() for p, f in found.items()}
        with self._lock:
            (read, retries), self._io = self._io, [0, 0]
        count_bytes(read)  # helper threads' reads count in the batch that needed them
        count_retries(retries)
        return self._cut(windows, epoch, segments)

    def _cut(self, windows: np.ndarray, epoch: int, segments: dict[int, Segment]) -> pa.Table:
        """The windows' columns, filled by one compiled pass over each segment's pieces
        (`loops.cut_pieces`): a window inside one segment is one piece, one that spans
        segments (or the stream's end) a piece of each."""
        _, cum = self._epoch(epoch)
        length, count, width = self.seq_len, windows.size, self.seq_len + 1
        starts = windows * length
        owners = np.searchsorted(cum, starts, side="right") - 1
        pieces = np.empty((count, 4), dtype=np.int64)  # row, column, a, b
        pieces[:, 0], pieces[:, 1], pieces[:, 2] = np.arange(count), 0, starts
        pieces[:, 3] = starts + width
        whole = pieces[:, 3] <= cum[owners + 1]  # most windows: one piece
        if not whole.all():
            rows = np.flatnonzero(~whole).tolist()
            spans = np.array([p for r in rows for p in self._spans(r, int(starts[r]), cum)])
            pieces = np.concatenate([pieces[whole], spans[:, 1:]])
            owners = np.concatenate([owners[whole], spans[:, 0]])
        shape = (4 if self.document_ids else 3, count, length)
        # From pyarrow's default pool (mimalloc, unless a ParquetSource chose the system
        # allocator: arrow_pool.py), which keeps freed pages: the system allocator gave
        # each batch fresh pages when a worker thread cut it and the consumer freed it.
        buffer = pa.allocate_buffer(int(np.prod(shape)) * 8)
        out = np.frombuffer(buffer, dtype=np.int64).reshape(shape)
        for owner in np.unique(owners).tolist():
            segment, mine = segments[owner], pieces[owners == owner]
            mine[:, 2:] -= int(cum[owner]) + segment.offset
            loops.cut_pieces(segment.tokens, segment.starts, segment.rows, mine,
                             self.ignore_index, out, count, length, self.document_ids)  # fmt: skip
        names = ["input_ids", "labels", "position_ids", "document_ids"][: shape[0]]
        plane = count * length * 8
        return pa.table({name: _fixed_lists(buffer.slice(i * plane, plane), count, length)
                         for i, name in enumerate(names)})  # fmt: skip

    def _spans(self, row: int, lo: int, cum: np.ndarray) -> list[tuple[int, int, int, int, int]]:
        """(position, row, column, a, b) of each segment's part of a window (and its next
        token) that spans segments or reaches the stream's end, in stream coordinates."""
        end = int(cum[-1])
        position = int(np.searchsorted(cum, lo, side="right") - 1)
        hi, column, parts = min(lo + self.seq_len + 1, end), 0, []
        while lo < hi:
            stop = min(hi, int(cum[position + 1]))
            parts.append((position, row, column, lo, stop))
            lo, column, position = stop, column + stop - lo, position + 1
        return parts


def _fixed_lists(values: pa.Buffer, rows: int, length: int) -> pa.FixedSizeListArray:
    """`rows` fixed-size lists of `length` int64 that share `values`' memory (collated
    to a [rows, length] tensor without a copy)."""
    flat = pa.Array.from_buffers(pa.int64(), rows * length, [None, values])
    return pa.FixedSizeListArray.from_arrays(flat, length)


def _lanes_of(plan: Any) -> tuple[int, int, int]:
    """(lanes, world size, batch size) of the loader's plan that `plan_epoch` was given
    (one lane, one rank, one window for reads by hand)."""
    choice = getattr(plan, "choice", None)
    if choice is None:
        return 1, 1, 1
    return choice.lanes, int(getattr(plan, "world_size", 1)), choice.granule


def cu_seqlens(position_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative sequence boundaries (int32 [n + 1]) of a packed batch, from its
    `position_ids` (a new sequence wherever they restart at 0), over the flattened
    batch: what flash-attention's variable-length kernels take as `cu_seqlens_q/k`."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    end = torch.tensor([flat.numel()], dtype=starts.dtype, device=flat.device)
    return torch.cat([starts, end]).to(torch.int32)
