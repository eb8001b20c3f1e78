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

Split as `ParquetSource` is: `PackedTokens` is the description (the corpus, `seq_len`,
eos, the window and the token index), which pickles into a worker as it is; each
process reads through its own `TokenReader` (`iolib.text.packed_reader`: the segments'
cache, reads in flight, read-ahead, the cut); the order is the plan's
(`iolib.plan.stream_*`, from `layout()`).

Worked example: documents [a a a], [b], [c c c c] in one row group with eos E, seq_len
4, no document shuffle: the stream is a a a E b E c c c c E (11 tokens), windows
[a a a E] [b E c c] and the last partial [c c E] is dropped; position_ids are
[0 1 2 3] [0 1 0 1].
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from iolib.errors import ConfigError, DataError
from iolib.plan import DEFAULT_SHUFFLE_WINDOW, Layout, TokenStream, default_blocks, window_groups
from iolib.redact import Redactor
from iolib.resources import parse_bytes
from iolib.sources.base import Source
from iolib.sources.parquet import ParquetSource
from iolib.sources.parquet_description import checked_cache_bytes
from iolib.text import tokenindex
from iolib.text.packed_reader import FETCH_THREADS, Segment, TokenReader
from iolib.text.seeded import check_lanes

__all__ = ["FETCH_THREADS", "PackedTokens", "Segment", "cu_seqlens"]

IGNORE_INDEX = -100  # torch's cross_entropy default ignore_index


def check_ignore_index_and_seed(ignore_index: Any, seed: Any) -> None:
    """Refuse at construction what would fail, or wrap, at the first batch: labels are
    int64, and seeds feed NumPy's SeedSequence (non-negative)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise ConfigError(
            f"`ignore_index` must be an integer label (torch's default is -100). "
            f"Found: {ignore_index!r}."
        )
    if not -(2**63) <= int(ignore_index) < 2**63:
        raise ConfigError(f"`ignore_index` must fit int64 labels. Found: {ignore_index!r}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise ConfigError(f"`seed` must be an integer >= 0. Found: {seed!r}.")


DEFAULT_CACHE_BYTES = 1 << 30  # per process, at most: two default shuffle windows
MIN_GROUPS_HELD = 4  # two chunks of two row groups: this one, and the next read ahead
log = logging.getLogger(__name__)


class PackedTokens(Source):
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
    cache_bytes: decoded row groups kept per process (default: the least that runs, at
        most 1 GiB; more only keeps the last epoch's row groups, which the next epoch
        does not read): memory only, the
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
        cache_bytes = checked_cache_bytes(cache_bytes)  # as ParquetSource reads it
        check_ignore_index_and_seed(ignore_index, seed)
        if not isinstance(source, ParquetSource):
            source = ParquetSource(source, storage_options=storage_options)
        # The reader of row groups: no cache of its own (this source keeps segments).
        with _named_column():
            self.parquet = source.uncached([column])
        self.column, self.seq_len, self.eos_id = column, seq_len, int(eos_id)
        self.shuffle_documents, self.document_ids = bool(shuffle_documents), bool(document_ids)
        self.ignore_index, self.seed = int(ignore_index), int(seed)
        self.cache_bytes = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
        self._cache_default = cache_bytes is None  # sized from the index once it is known
        self.shuffle_window = parse_bytes(shuffle_window, "shuffle_window")
        self.lanes = check_lanes(lanes)
        self._index: tokenindex.TokenIndex | None = None
        self._windowed_said = False
        self._reader = TokenReader(self)  # this process's: never pickled

    # -- pickling: the description travels, each process builds its own reader ----------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_reader"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reader = TokenReader(self)

    def with_seed(self, seed: int) -> PackedTokens:
        """This source under the loader's seed (a copy, with its own reader: what was
        counted, the token index, is shared)."""
        if seed == self.seed:
            return self
        clone = copy.copy(self)  # through __getstate__: a reader of its own
        clone.seed = int(seed)
        return clone

    def close(self) -> None:
        """Stop the read threads and drop the cached row groups."""
        self._reader.close()
        self.parquet.close()

    # -- metadata ------------------------------------------------------------------------
    @property
    def index(self) -> tokenindex.TokenIndex:
        """Tokens and documents per row group: from beside the data, the local cache,
        or counted once (`iolib.text.tokenindex`)."""
        if self._index is None:  # two threads may both load it: the same value
            self._check_column()
            index = tokenindex.load_or_compute(self.parquet, self.column)
            self._check_budget(index)  # refused every time, not only the first
            if self._cache_default:
                # What the order reads together, not 1 GiB: a cache larger than that only
                # keeps the last epoch's segments, which the next epoch never reads.
                self.cache_bytes = min(DEFAULT_CACHE_BYTES, self._cache_need(index)[0])
                self._reader.set_budget(self.cache_bytes)
            self._index = index
        return self._index

    def _check_column(self) -> None:
        with _named_column():
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

    def _cache_need(self, index: tokenindex.TokenIndex) -> tuple[int, str]:
        """(bytes, why): what the order reads together, the least cache that runs: four
        of the largest row groups, and two chunks of the shuffle window (or the whole
        corpus and three row groups, where it fits the window)."""
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
        return need, why

    def _check_budget(self, index: tokenindex.TokenIndex) -> None:
        """Refuse a cache that cannot hold what the order reads together (`_cache_need`);
        the message names both sizes."""
        sizes = self._segment_bytes(index)
        largest = int(sizes.max(initial=0))
        need, why = self._cache_need(index)
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
        return self._reader.cache_stats()

    # -- reads: this process's reader ----------------------------------------------------
    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        """Windows `indices` of `epoch`, as fixed-size-list columns (collated to [B, L]
        tensors without a copy)."""
        return self._reader.read(indices, epoch=epoch)

    def plan_epoch(self, epoch: int, batches: Any) -> None:
        """This rank's batches of windows: the reader reads ahead along them."""
        self._reader.plan_epoch(epoch, batches)


def cu_seqlens(position_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative sequence boundaries (int32 [n + 1]) of a packed batch, from its
    `position_ids` (a new sequence wherever they restart at 0), over the flattened
    batch: what flash-attention's variable-length kernels take as `cu_seqlens_q/k`."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    end = torch.tensor([flat.numel()], dtype=starts.dtype, device=flat.device)
    return torch.cat([starts, end]).to(torch.int32)


@contextlib.contextmanager
def _named_column() -> Iterator[None]:
    """A missing column is PackedTokens' `column` argument, not ParquetSource's `columns`."""
    try:
        yield
    except DataError as exc:
        if "Fix `columns`." not in str(exc):
            raise
        raise DataError(str(exc).replace("Fix `columns`.", "Fix `column`.")) from None
