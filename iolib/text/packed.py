"""Packed token windows for language-model pretraining: `PackedTokens`, streamed.

`PackedTokens` is the description (corpus, column, `seq_len`, eos, shuffle window), which
pickles into workers; each process reads through its own `TokenReader`
(`iolib.text.packed_reader`), along the plan's order (`iolib.plan.stream_*`). How the
stream, the chunks and the reads work, with an example: docs/tokens.md.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from typing import Any

import numpy as np
import pyarrow as pa

from iolib.base.redact import Redactor
from iolib.base.resources import parse_bytes
from iolib.plan import DEFAULT_SHUFFLE_WINDOW, Layout, TokenStream, default_blocks, window_groups
from iolib.sources import ParquetSource, Source, checked_cache_bytes
from iolib.text import tokenindex
from iolib.text.packed_checks import (
    MIN_GROUPS_HELD,
    cache_need,
    check_arguments,
    check_budget,
    check_column,
    named_column,
    narrow_groups,
    narrow_type,
    segment_bytes,
)
from iolib.text.packed_reader import FETCH_THREADS, Segment, TokenReader
from iolib.text.seeded import check_lanes
from iolib.text.varlen import cu_seqlens

__all__ = ["FETCH_THREADS", "MIN_GROUPS_HELD", "PackedTokens", "Segment", "cu_seqlens"]

IGNORE_INDEX = -100  # torch's cross_entropy default ignore_index
DEFAULT_CACHE_BYTES = 1 << 30  # per process, at most: two default shuffle windows
log = logging.getLogger(__name__)


class PackedTokens(Source):
    """Fixed windows of `seq_len` tokens cut from the documents of a token column,
    concatenated (each followed by `eos_id`) in a per-epoch document order, streamed
    with memory bounded by `cache_bytes` (docs/tokens.md, "Packed windows").

    Each batch holds int64 [B, seq_len] ``input_ids``; ``labels``, already shifted (do
    not shift again), `ignore_index` at each eos; ``position_ids``, restarting at each
    document and window (`cu_seqlens` gives varlen attention its boundaries); and with
    `document_ids=True` ``document_ids``. Windows depend on (seed, epoch, seq_len, data,
    shuffle_window, lanes), never on `cache_bytes`, workers or timing.

    source: a ParquetSource, or its URL(s). column: the `list<int>` token column.
    shuffle_window: decoded bytes (an int, or a size like "256MiB"; default 512 MiB)
        whose windows the loader's shuffle mixes; a corpus that fits is shuffled whole.
    cache_bytes: decoded row groups kept per process (default: the least that runs, at
        most 1 GiB): memory only. Less than two chunks of the window (and four of the
        largest row groups) is refused when the loader starts, with the sizes to change.
    lanes: contiguous shares of the stream ("auto": the world size; rank r then reads
        share r). The order depends on it: to resume at another world size, pass the
        first run's.
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
        check_arguments(seq_len, eos_id, ignore_index, seed)
        cache_bytes = checked_cache_bytes(cache_bytes)  # as ParquetSource reads it
        if not isinstance(source, ParquetSource):
            source = ParquetSource(source, storage_options=storage_options)
        # The reader of row groups: no cache of its own (this source keeps segments).
        with named_column():
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
        """This source under the loader's seed: a copy with its own reader (and the index)."""
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
            with named_column():
                kind = self.parquet.schema.field(self.column).type
            check_column(kind, self.column, self.eos_id, self.parquet.describe())
            index = tokenindex.load_or_compute(self.parquet, self.column)
            # Refused every time, not only the first.
            narrow = narrow_groups(self.parquet, self.column, kind)
            sizes = segment_bytes(index, kind, narrow)
            check_budget(sizes, self.column, self.shuffle_window, self.cache_bytes,
                         self.describe(), given=not self._cache_default)  # fmt: skip
            if self._cache_default:
                # What the order reads together, not 1 GiB: the cache keeps a row group's
                # segment across epochs, and more than the corpus holds nothing more.
                need = cache_need(sizes, self.column, self.shuffle_window)[0]
                self.cache_bytes = min(DEFAULT_CACHE_BYTES, need)
                self._reader.set_budget(self.cache_bytes)
            self._sizes = sizes  # before the index: a thread that sees it sees them
            self._narrow, self._narrow_type = narrow, narrow_type(kind)  # a bool a row group
            self._index = index
        return self._index

    @property
    def group_bytes(self) -> np.ndarray:
        """Decoded bytes of each row group's segment (its tokens and 24 a document): what
        the reader's cache counts for it."""
        if self._index is None:
            _ = self.index  # loading the index sets them
        return self._sizes

    def read_as(self, group: int) -> dict[str, pa.DataType] | None:
        """The type row group `group`'s tokens are decoded as (None: the column's own):
        uint16 where its footer bounds every id there (`packed_checks.narrow_type`)."""
        if self._index is None:
            _ = self.index  # loading the index sets them
        return {self.column: self._narrow_type} if self._narrow[group] else None

    def shuffle_window_groups(self) -> int:
        """Row groups whose windows the loader's shuffle mixes (a chunk): as many of the
        largest as `shuffle_window` holds; all where the corpus fits in it."""
        groups = window_groups(self.group_bytes, self.shuffle_window)
        return int(self.group_bytes.size) if groups is None else groups

    def blocks(self) -> np.ndarray:
        """Chunks of consecutive windows, each about one shuffle window of row groups:
        the loader shuffles windows within a chunk, and chunks among themselves."""
        index, windows = self.index, len(self)
        groups = max(index.tokens.size, 1)
        per_chunk = int(index.stream.sum()) * self.shuffle_window_groups() // groups
        return default_blocks(windows, max(1, per_chunk // self.seq_len))

    @property
    def stream(self) -> TokenStream:
        """The stream as the plan sees it (row groups' stream tokens, chunking), once."""
        if "_stream_" not in self.__dict__:
            self.__dict__["_stream_"] = TokenStream(self.index.stream, self.seq_len,
                self.shuffle_window_groups(), self.shuffle_documents)  # fmt: skip
        return self.__dict__["_stream_"]

    def layout(self) -> Layout:
        """Windows dealt to lanes a batch at a time; a shuffled loader mixes them within
        chunks of whole row groups, one chunk at a time (a batch's row groups fit the
        cache), or all where the corpus fits the window. Documents' order: per epoch."""
        windowed = len(self.blocks()) > 1
        if windowed and not self._windowed_said:
            self._windowed_said = True
            log.info("%s: the corpus is larger than shuffle_window (%d bytes decoded): windows "
                     "are shuffled within %d-row-group chunks, chunks in a random order, where "
                     "the loader shuffles (raise shuffle_window to shuffle more widely; "
                     "docs/tokens.md).", self.describe(), self.shuffle_window,
                     self.shuffle_window_groups())  # fmt: skip
        modes = (("global", "block", 1), ("block", "block", 1)) if windowed else (
            ("block", "global", 0),
        )  # fmt: skip
        return Layout(blocks=self.blocks(), modes=modes, lanes=self.lanes, granule=None,
                      stream=self.stream, epoch_samples=self.shuffle_documents)  # fmt: skip

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

    def cancel_reads(self) -> None:
        """Drop the queued reads; reads on the wire finish (`bytes_after_close`)."""
        self._reader.cancel()

    # -- reads: this process's reader ----------------------------------------------------
    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        """Windows `indices` of `epoch`, as fixed-size-list columns (collated to [B, L]
        tensors without a copy)."""
        return self._reader.read(indices, epoch=epoch)

    def read_batch(self, indices: np.ndarray, *, epoch: int, batch: int) -> pa.Table:
        """`read` of batch `batch` of the plan: the reader reads ahead from there."""
        return self._reader.read(indices, epoch=epoch, batch=batch)

    def plan_epoch(self, epoch: int, batches: Any) -> None:
        """This rank's batches of windows: the reader reads ahead along them."""
        self._reader.plan_epoch(epoch, batches)
