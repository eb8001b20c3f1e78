"""Packed token windows for language-model pretraining: `PackedTokens`.

Documents (rows of a `list<int>` token column) are concatenated in an order drawn per
epoch, each followed by `eos_id`, and the stream is cut into windows of `seq_len`
tokens; sample k of epoch e is window k. Packing lives in the plan, not in a stateful
buffer (Megatron's GPT dataset keeps the same three indices: documents, samples,
shuffle): with every document's length, window k is a pure function of (seed, e,
seq_len, data), found by a prefix sum and a binary search, so worker counts, prefetch
depth, resume points and world sizes cannot change it. The loader's own shuffle then
orders the windows, and its cursor resumes and shards them like any other samples.

Worked example: documents [a a a], [b], [c c c c] with eos E, seq_len 4, no document
shuffle: the stream is a a a E b E c c c c E (11 tokens), windows [a a a E] [b E c c]
and the last partial [c c E] is dropped; position_ids are [0 1 2 3] [0 1 0 1].

The token column is held in memory as one flat array (its raw size plus 4 bytes a
document, filled row group by row group at first use): a window is then a few slices
gathered with one vectorised index, no Python per token (docs/tokens.md).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from iolib.errors import ConfigError, DataError
from iolib.sources.footer import leaf_values
from iolib.sources.parquet import ParquetSource
from iolib.text.seeded import SeededSource

_DOCUMENT_STREAM = 0x444F4353  # "DOCS": document order, independent of the window order
IGNORE_INDEX = -100  # torch's cross_entropy default ignore_index


class TokenStore:
    """A token column in memory: every non-empty document's tokens followed by `eos`,
    back to back (`tokens`), where each document starts (`starts`) and its length."""

    def __init__(self, source: ParquetSource, column: str, eos_id: int) -> None:
        groups = len(source.blocks())
        # An upper bound on items plus one eos a row, from the footers: untouched pages
        # of the tail are never resident.
        bound = sum(
            leaf_values(f.footer.row_group(local))[column] + rows
            for f in source.files
            for local, rows in enumerate(f.row_groups)
        )
        kind = source.schema.field(column).type.value_type
        self.tokens = np.empty(bound, dtype=np.dtype(kind.to_pandas_dtype()))
        self.lengths = np.zeros(len(source), dtype=np.int64)
        self.starts = np.zeros(len(source), dtype=np.int64)
        filled, row = 0, 0
        for group in range(groups):
            array = source.row_group(group).column(column).combine_chunks()
            values = array.flatten().to_numpy(zero_copy_only=False)
            lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
            filled = self._append(values, lengths.astype(np.int64), eos_id, filled, row)
            row += len(lengths)
        self.tokens = self.tokens[:filled]
        # Arrow's allocator keeps the freed row-group buffers for reuse: this process
        # reads no more Parquet for packing, so give them back (measured: -32 MiB of
        # resident memory on an 80 MiB column).
        pa.default_memory_pool().release_unused()
        # Rows with at least one token (empty and null rows add nothing to the stream).
        self.documents = np.flatnonzero(self.lengths > 0)
        self.stream = filled  # tokens in the stream: every document and its eos

    def _append(
        self, values: np.ndarray, lengths: np.ndarray, eos_id: int, filled: int, row: int
    ) -> int:
        """Copy one row group's documents in, each non-empty one followed by eos."""
        spans = lengths + (lengths > 0)
        starts = filled + np.cumsum(spans) - spans
        self.lengths[row : row + len(lengths)] = lengths
        self.starts[row : row + len(lengths)] = starts
        # An eos after each non-empty document: one insert, whose only temporary is the
        # row group's interleaved tokens (a scatter index would take 8 bytes a token).
        ends = np.cumsum(lengths)[lengths > 0]
        interleaved = np.insert(values, ends, np.array(eos_id, dtype=values.dtype))
        self.tokens[filled : filled + interleaved.size] = interleaved
        return int(filled + interleaved.size)


class PackedTokens(SeededSource):
    """Fixed windows of `seq_len` tokens cut from the documents of a token column,
    concatenated (each followed by `eos_id`) in a per-epoch document order.

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
    pure function of (seed, epoch, seq_len, data); the document order differs per epoch
    (unless `shuffle_documents=False`). Documents longer than `seq_len` are split,
    never dropped; empty and null documents add nothing (not even an eos).

    source: a ParquetSource, or its URL(s). column: the `list<int>` token column.
    seed: only for use outside a loader; a DataLoader sets its own `seed`.
    """

    columnar = True

    # A process worker reloads the tokens rather than receive them through a pipe.
    _RUNTIME = ("_lock", "_epochs", "_store")

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
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise ConfigError(f"`seq_len` must be an integer >= 1. Found: {seq_len!r}.")
        if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)):
            raise ConfigError(f"`eos_id` must be an integer token id. Found: {eos_id!r}.")
        if not isinstance(source, ParquetSource):
            source = ParquetSource(source, storage_options=storage_options)
        # Read row groups once into the store, never kept in the row-group cache.
        self.parquet = ParquetSource(
            source.urls, [column], source.storage_options, cache_bytes=1, retry=source.retry
        )
        self.column, self.seq_len, self.eos_id = column, seq_len, int(eos_id)
        self.shuffle_documents, self.document_ids = bool(shuffle_documents), bool(document_ids)
        self.ignore_index, self.seed = int(ignore_index), int(seed)
        self._store: TokenStore | None = None
        self._init_runtime()

    # -- the token column ----------------------------------------------------------------
    @property
    def store(self) -> TokenStore:
        """The tokens, read on first use (every row group once)."""
        if self._store is None:
            with self._lock:
                if self._store is None:
                    self._check_column()
                    self._store = TokenStore(self.parquet, self.column, self.eos_id)
        return self._store

    def _check_column(self) -> None:
        field = self.parquet.schema.field(self.column)
        kind = field.type
        is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if not (is_list and pa.types.is_integer(kind.value_type)):
            raise DataError(
                f"Column {self.column!r} of {self.parquet.files[0].url!r} is {kind}: "
                "PackedTokens needs a list of integer token ids (list<int32>, list<int64>...)."
            )
        info = np.iinfo(np.dtype(kind.value_type.to_pandas_dtype()))
        if not info.min <= self.eos_id <= info.max:
            raise ConfigError(
                f"`eos_id` {self.eos_id} does not fit the column's {kind.value_type} "
                f"({info.min}..{info.max}). Use the tokenizer's end-of-document id."
            )

    # -- the plan ------------------------------------------------------------------------
    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(document order, prefix sums of their spans in the stream) for `epoch`."""
        key = (self.seed, epoch)
        found = self._epochs.get(key)
        if found is not None:
            return found
        store = self.store
        order = store.documents
        if self.shuffle_documents:
            words = [_DOCUMENT_STREAM, self.seed, epoch]
            rng = np.random.Generator(np.random.Philox(np.random.SeedSequence(words)))
            order = order[rng.permutation(order.size)]
        cum = np.zeros(order.size + 1, dtype=np.int64)
        np.cumsum(store.lengths[order] + 1, out=cum[1:])
        with self._lock:
            self._epochs[key] = (order, cum)
            for old in [k for k in self._epochs if k[1] < epoch - 1]:
                del self._epochs[old]  # keep this epoch and the one before (read ahead)
        return order, cum

    def __len__(self) -> int:
        """Windows per epoch: the same every epoch (the stream's length does not change)."""
        return self.store.stream // self.seq_len

    def fingerprint(self) -> str:
        words = f"{self.parquet.fingerprint()}|{self.column}|{self.seq_len}|{self.eos_id}"
        words += f"|{self.shuffle_documents}"
        return hashlib.sha256(words.encode()).hexdigest()[:16]

    def describe(self) -> str:
        return f"PackedTokens({self.parquet.describe()}, seq_len={self.seq_len})"

    def locate(self, index: int) -> str:
        return f"packed window {index} of {self.parquet.describe()}"

    # -- reads ---------------------------------------------------------------------------
    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        """Windows `indices` of `epoch`, as fixed-size-list columns (collated to [B, L]
        tensors without a copy)."""
        windows = np.asarray(indices, dtype=np.int64)
        if windows.size and (windows.min() < 0 or windows.max() >= len(self)):
            raise IndexError(f"window indices outside 0..{len(self) - 1}")
        order, cum = self._epoch(epoch)
        pieces = _pieces(windows * self.seq_len, self.seq_len, cum)
        store, length = self.store, self.seq_len
        doc = order[pieces.document]
        within = pieces.lo - cum[pieces.document]  # offset into the document's span
        flat = np.arange(windows.size * length, dtype=np.int64)
        index = flat + np.repeat(store.starts[doc] + within - pieces.out, pieces.size)
        ids = store.tokens[index].astype(np.int64)
        # labels[t] is the token after ids[t]: ids[t + 1] within a window (pieces meet
        # only after an eos, whose label is ignored), the next window's first token at
        # its end. A piece that reaches its document's end ends with that eos.
        labels = np.empty_like(ids).reshape(-1, length)
        labels[:, :-1] = ids.reshape(-1, length)[:, 1:]
        after = np.minimum(index[length - 1 :: length] + 1, store.tokens.size - 1)
        labels[:, -1] = store.tokens[after]
        ends = within + pieces.size == store.lengths[doc] + 1
        labels.reshape(-1)[(pieces.out + pieces.size - 1)[ends]] = self.ignore_index
        columns = {"input_ids": ids, "labels": labels.reshape(-1)}
        columns["position_ids"] = flat - np.repeat(pieces.out, pieces.size)
        if self.document_ids:
            columns["document_ids"] = np.repeat(doc, pieces.size)
        return pa.table(
            {k: pa.FixedSizeListArray.from_arrays(pa.array(v), length) for k, v in columns.items()}
        )


class _Pieces:
    """The (window, document) pieces of a batch of windows, in output order: document
    positions in the epoch order, where each starts in the stream (`lo`) and in the
    flat batch (`out`), and its token count."""

    def __init__(self, document: np.ndarray, lo: np.ndarray, out: np.ndarray, size: np.ndarray):
        self.document, self.lo, self.out, self.size = document, lo, out, size


def _pieces(starts: np.ndarray, length: int, cum: np.ndarray) -> _Pieces:
    """Map windows [start, start + length) of the stream to document pieces, vectorised:
    a binary search finds each window's first and last document; the documents between
    them are consecutive in the epoch order."""
    first = np.searchsorted(cum, starts, side="right") - 1
    last = np.searchsorted(cum, starts + length - 1, side="right") - 1
    counts = last - first + 1
    window = np.repeat(np.arange(starts.size), counts)
    offset = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    document = first[window] + offset
    lo = np.maximum(cum[document], starts[window])
    hi = np.minimum(cum[document + 1], starts[window] + length)
    out = window * length + (lo - starts[window])
    return _Pieces(document, lo, out, hi - lo)


def cu_seqlens(position_ids: torch.Tensor) -> torch.Tensor:
    """Cumulative sequence boundaries (int32 [n + 1]) of a packed batch, from its
    `position_ids` (a new sequence wherever they restart at 0), over the flattened
    batch: what flash-attention's variable-length kernels take as `cu_seqlens_q/k`."""
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    end = torch.tensor([flat.numel()], dtype=starts.dtype, device=flat.device)
    return torch.cat([starts, end]).to(torch.int32)
