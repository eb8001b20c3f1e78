"""Token-budget batches for variable-length fine-tuning data: `TokenBudgetBatches`.

Why a source whose samples are whole batches, not a batch sampler: the loader's plan
already shuffles, shards, resumes and gives every rank the same number of samples; with
a budget batch as the sample, all of that holds for budget batches unchanged (the
cursor counts them). A user-facing batch sampler would lose it: the loader refuses to
shard a user's sampler across ranks, the script would have to call its set_epoch, and a
resume would replay a lazily consumed iterator.

Batch composition for epoch e, a pure function of (seed, e, lengths, max_tokens):
rows in a permutation drawn from (seed, e), sorted by length within buckets of
`bucket_batches` batches' worth of rows (similar lengths together: little padding),
then cut into exactly N contiguous batches at equal token quantiles, where
N = ceil(total / (max_tokens - longest row)); a cut lands at most one row past its
quantile, so no batch holds more than `max_tokens` tokens, and N is the same every
epoch (len() does not depend on the epoch).

Data larger than `shuffle_window`: the permutation is windowed, as PackedTokens' is. Row
groups are drawn in a random order and taken in chunks that fit the window;
rows are permuted and bucketed within their chunk, and the loader shuffles the batches
within chunks, chunks in a random order; so a stretch of batches reads one or two
chunks' row groups, never the whole dataset. What stays O(rows): each row's length and
the epoch's row order (16 bytes a row).
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iolib.base.redact import Redactor
from iolib.base.resources import parse_bytes
from iolib.collate import is_numeric_list
from iolib.errors import ConfigError, DataError
from iolib.plan import Layout, default_blocks, window_groups
from iolib.sources import ParquetSource, checked_cache_bytes
from iolib.text.packed import DEFAULT_CACHE_BYTES, MIN_GROUPS_HELD
from iolib.text.seeded import SeededSource, check_lanes

log = logging.getLogger("iolib")

_BUDGET_STREAM = 0x42554447  # "BUDG"
# Decoded bytes of row groups permuted together: fixed (the order follows it), and a
# chunk and the next, with three row groups in flight, fit the default cache.
DEFAULT_BUDGET_WINDOW = 256 * 2**20


def row_lengths(source: ParquetSource, column: str) -> np.ndarray:
    """Items per row of a list column (null rows: 0), reading its row groups once."""
    kind = source.schema.field(column).type
    if not is_numeric_list(kind):
        raise DataError(
            f"Column {column!r} of {source.describe()} is {kind}: token-budget batches "
            "need a list of numbers (token ids)."
        )
    lengths = []
    for group in range(len(source.blocks())):
        array = source.fetch_row_group(group).column(column)  # in chunks: not combined
        counts = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
        lengths.append(counts.astype(np.int64))
    return np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)


def budget_cuts(lengths: np.ndarray, batches: int) -> np.ndarray:
    """`batches + 1` cut positions splitting rows (in order) at equal token quantiles,
    strictly increasing, every batch holding at least one token: the cuts are taken over
    the rows that hold tokens, and a row with none stays in the batch of the row before
    it (leading ones in the first batch). `batches` must be at most the rows holding
    tokens (`batch_count` gives such a count). Example: lengths [4, 4, 4, 4], 2 batches
    -> [0, 2, 4]; [1, 3, 1, 1], 3 batches -> [0, 2, 3, 4]; [5, 0, 5], 2 -> [0, 2, 3]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    full = np.flatnonzero(lengths > 0)
    if batches < 1 or batches > full.size:
        raise ValueError(
            f"{batches} budget batches of {full.size} rows holding tokens: each batch needs "
            "one such row (batch_count gives a count that fits)."
        )
    tokens = lengths[full]
    cum = np.concatenate([[0], np.cumsum(tokens)])
    targets = np.arange(batches + 1) * (cum[-1] / batches)
    cuts = np.searchsorted(cum, targets, side="left")
    cuts[-1] = tokens.size
    # A row longer than a quantile step leaves two cuts equal: push each cut at least one
    # row past the one before (a running maximum of cut - k), then pull the last ones back
    # so that every later batch keeps a row. Both passes keep a step of >= 1 row, and a
    # moved cut only shortens a batch or leaves it one row long: the budget still holds.
    step = np.arange(batches + 1)
    cuts = np.maximum.accumulate(cuts - step) + step
    cuts = np.minimum(cuts, tokens.size - batches + step)
    # Back to positions among all rows: an inner cut lands on its first row with tokens,
    # so the empty rows before it close the batch before (they add no token to it).
    cuts[1:-1] = full[cuts[1:-1]]
    cuts[-1] = lengths.size
    return cuts


def batch_count(lengths: np.ndarray, max_tokens: int) -> int:
    """Budget batches an epoch of rows with `lengths` makes: ceil(total / (max_tokens -
    longest)), at most one per row holding tokens (the same every epoch: it ignores the
    order); 0 where no row holds a token."""
    holding = int(np.count_nonzero(lengths))
    if holding == 0:
        return 0
    room = max(max_tokens - int(lengths.max()), 1)
    return min(holding, max(1, math.ceil(int(lengths.sum()) / room)))


class TokenBudgetBatches(SeededSource):
    """Rows of a Parquet source grouped into batches of at most `max_tokens` tokens of
    `column` (before padding), similar lengths together; one sample is one batch.

    Example::

        from iolib import DataLoader
        from iolib.collate import ListFormat
        from iolib.sources import ParquetSource
        from iolib.text import TokenBudgetBatches

        rows = ParquetSource("s3://bucket/sft/*.parquet", lists=ListFormat(pad_id=0))
        batches = TokenBudgetBatches(rows, column="input_ids", max_tokens=16_384)
        loader = DataLoader(batches, batch_size=1, shuffle=True, seed=0)  # 1 = one batch
        for batch in loader:   # input_ids [rows, longest], input_ids_mask, ...

    `batch_size` must be 1 (each sample already is a batch; the loader refuses any other
    value, None and a batch_sampler). Every row appears once per
    epoch; batches differ per epoch; every rank gets the same number of batches (the
    plan's rule: the last step is padded with the epoch's first batches, or dropped with
    drop_last). A row longer than `max_tokens` is an error naming its file.

    bucket_batches: rows sorted by length together, in batches' worth (default 64):
        more means less padding but batches of more uniform length in a stretch.
    shuffle_window: decoded bytes (an int, or a size like "256MiB") of row groups
        permuted together (default 256 MiB, fixed: the order follows it). Data that fits
        is permuted whole; larger data within chunks of row groups that fit it (the
        module docstring says how), and the log says so once.
    cache_bytes: bound on the decoded row groups kept (default 1 GiB): memory only, the
        batches are the same at any `cache_bytes` that runs. It must hold two chunks and
        three row groups (the whole data and three row groups, where it fits the window),
        else it is refused when `len()` is first asked, with both sizes.
    lanes: for data larger than `shuffle_window`, how many contiguous shares of the epoch's
        batches are dealt to ranks ("auto": the loader's world size, so rank r reads only
        share r's chunks). To resume at another world size, pass the first run's.
    """

    columnar = True

    def __init__(
        self,
        source: ParquetSource | str | list[str],
        *,
        column: str,
        max_tokens: int,
        bucket_batches: int = 64,
        storage_options: dict[str, Any] | None = None,
        seed: int = 0,
        cache_bytes: int | None = None,
        lanes: int | str = "auto",
        shuffle_window: int | str = DEFAULT_BUDGET_WINDOW,
    ) -> None:
        cache_bytes = checked_cache_bytes(cache_bytes)  # as ParquetSource reads it
        for name, value in (("max_tokens", max_tokens), ("bucket_batches", bucket_batches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"`{name}` must be an integer >= 1. Found: {value!r}.")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError(f"`seed` must be an integer >= 0. Found: {seed!r}.")
        if not isinstance(source, ParquetSource):
            source = ParquetSource(source, storage_options=storage_options,
                                   cache_bytes=cache_bytes)  # fmt: skip
        self.cache_bytes = DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes
        self.shuffle_window = parse_bytes(shuffle_window, "shuffle_window")
        self._windowed_said = False
        self.lanes = check_lanes(lanes)
        self.rows, self.column = source, column
        self.max_tokens, self.bucket_batches, self.seed = max_tokens, bucket_batches, int(seed)
        self._lengths: np.ndarray | None = None
        self._init_runtime()

    # -- lengths and the plan ------------------------------------------------------------
    @property
    def lengths(self) -> np.ndarray:
        """Tokens per row (read once: the column alone, kept in no cache)."""
        if self._lengths is None:
            projected = self.rows.uncached([self.column])
            lengths = row_lengths(projected, self.column)
            if lengths.size and lengths.max() > self.max_tokens:
                row = int(lengths.argmax())
                raise DataError(
                    f"{projected.locate(row)} holds {int(lengths[row])} tokens in "
                    f"{self.column!r}, more than max_tokens={self.max_tokens}: raise "
                    "max_tokens or truncate the row when writing the data."
                )
            self._lengths = lengths
            if self.empty_rows:
                log.info(
                    "%s: %d of %d rows hold no token in %r; each rides in the batch of the "
                    "row before it, so no batch is without a token.",
                    self.describe(), self.empty_rows, lengths.size, self.column,
                )  # fmt: skip
        return self._lengths

    @property
    def empty_rows(self) -> int:
        """Rows holding no token (empty or null lists): they join a neighbouring batch and
        never make a batch of their own; where every row is empty there is no batch."""
        lengths = self.lengths
        return int(lengths.size - np.count_nonzero(lengths))

    def __len__(self) -> int:
        self._chunks()  # a cache too small for the data is refused before anything runs
        return batch_count(self.lengths, self.max_tokens)

    def check_loader(self, options: Any) -> None:
        """Refuse loader options that group budget batches (each sample already is one):
        `batch_size=4` would put 4 budget batches, up to 4 x max_tokens, in one step."""
        if options.batch_size == 1:
            return
        found = (
            "a batch_sampler"
            if options.batch_sampler is not None
            else f"batch_size={options.batch_size!r}"
        )
        raise ConfigError(
            "`batch_size` must be 1 with TokenBudgetBatches: each sample already is a batch "
            f"of at most max_tokens={self.max_tokens} tokens, and grouping them would break "
            f"that budget. Found: {found}. Use DataLoader(batches, batch_size=1), and raise "
            "max_tokens for larger batches."
        )

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows in batch order, cut positions) for `epoch`."""
        key = (self.seed, epoch)
        found = self._epochs.get(key)
        if found is not None:
            return found
        lengths, batches = self.lengths, len(self)
        rng = np.random.Generator(
            np.random.Philox(np.random.SeedSequence([_BUDGET_STREAM, self.seed, epoch]))
        )
        bucket = max(1, self.bucket_batches * lengths.size // max(batches, 1))
        chunks = self._chunks()
        if chunks is None:
            rows = _bucketed(rng.permutation(lengths.size), lengths, bucket)
        else:  # chunks of row groups in a random order, rows permuted within each
            starts = self.rows.row_starts()
            parts = []
            for chunk in np.array_split(rng.permutation(starts.size - 1), chunks):
                ranges = [np.arange(starts[g], starts[g + 1]) for g in chunk.tolist()]
                chunk_rows = np.concatenate(ranges) if ranges else np.zeros(0, np.int64)
                parts.append(_bucketed(chunk_rows[rng.permutation(chunk_rows.size)],
                                       lengths, bucket))  # fmt: skip
            rows = np.concatenate(parts)
        cuts = budget_cuts(lengths[rows], batches) if batches else np.zeros(1, np.int64)
        with self._lock:
            self._epochs[key] = (rows, cuts)
            for old in [k for k in self._epochs if k[1] < epoch - 1]:
                del self._epochs[old]
        return rows, cuts

    # -- windowed order for data larger than shuffle_window ----------------------------
    def _chunks(self) -> int | None:
        """How many chunks of row groups an epoch is cut into; None when the data fits
        `shuffle_window` (then the permutation is global). A cache too small for what the
        order reads together is refused here, naming both sizes."""
        found = self.__dict__.get("_chunk_count", 0)
        if found != 0:
            return found
        sizes = np.asarray(self.rows.estimated_bytes(measure=False), dtype=np.int64)
        largest, total = max(int(sizes.max(initial=0)), 1), int(sizes.sum())
        window = self.shuffle_window
        if window_groups(sizes, window) is None:
            chunks, chunk_bytes = None, total
        else:
            chunks = min(max(2, math.ceil(total / window)), sizes.size)
            chunk_bytes = math.ceil(total / chunks)
        in_flight = (MIN_GROUPS_HELD - 1) * largest
        held = chunk_bytes * (1 if chunks is None else 2) + in_flight
        need = max(MIN_GROUPS_HELD * largest, held)
        if MIN_GROUPS_HELD * largest > self.cache_bytes:
            raise ConfigError(
                f"{self.describe()}: `cache_bytes`={self.cache_bytes} holds fewer than "
                f"{MIN_GROUPS_HELD} of its largest row groups ({largest:,} bytes decoded). "
                f"Raise `cache_bytes` to at least {need} or write the data with smaller row "
                "groups."
            )
        if need > self.cache_bytes:
            what = "the whole data" if chunks is None else "two chunks"
            raise ConfigError(
                f"{self.describe()}: `cache_bytes`={self.cache_bytes} holds less than "
                f"shuffle_window={window} needs: {what} of row groups ({chunk_bytes:,} bytes "
                f"decoded each) and three of the largest in flight ({largest:,} bytes each), "
                f"{need:,} bytes. Raise `cache_bytes` to at least {need}, or lower "
                f"shuffle_window to {(self.cache_bytes - in_flight) // 2} or less (the order "
                "follows shuffle_window, never cache_bytes)."
            )
        self.__dict__["_chunk_count"] = chunks
        return chunks

    def blocks(self) -> np.ndarray | tuple[int, ...]:
        """Budget batches in chunk-sized blocks where the data is larger than the window
        (the loader shuffles within a block, blocks in a random order); else none."""
        chunks = self._chunks()
        if chunks is None:
            return ()
        return default_blocks(len(self), max(1, math.ceil(len(self) / chunks)))

    def layout(self) -> Layout:
        """Where the data is larger than the window: a shuffled loader shuffles batches
        within chunk-sized blocks, blocks in a random order, dealt to lanes one batch at a
        time (lanes="auto": one per rank, so rank r reads only its share's row groups).
        Where it fits, the loader's own order (every rank reads everything). The rows'
        order follows the epoch."""
        chunks = self._chunks()
        if chunks is None:
            return Layout(epoch_samples=True)
        if not self._windowed_said:
            self._windowed_said = True
            log.info(
                "%s: the data is larger than shuffle_window (%d bytes decoded): rows are permuted "
                "within %d chunks of row groups; a shuffled loader shuffles batches within "
                "chunks, chunks in a random order (raise shuffle_window to shuffle more "
                "widely).",
                self.describe(),
                self.shuffle_window,
                chunks,
            )
        modes = (("global", "block", 1), ("block", "block", 1))
        return Layout(blocks=self.blocks(), modes=modes, lanes=self.lanes, granule=1,
                      epoch_samples=True)  # fmt: skip

    def batch_rows(self, batch: int, epoch: int = 0) -> np.ndarray:
        """The rows of batch `batch` of `epoch`, in batch order."""
        rows, cuts = self._epoch(epoch)
        return rows[cuts[batch] : cuts[batch + 1]]

    # -- the Source protocol -------------------------------------------------------------
    def read(self, indices: np.ndarray, *, epoch: int = 0) -> pa.Table:
        """The rows of budget batches `indices` (one, with batch_size=1)."""
        batches = np.asarray(indices, dtype=np.int64)
        if batches.size and (batches.min() < 0 or batches.max() >= len(self)):
            raise IndexError(f"batch indices outside 0..{len(self) - 1}")
        rows = [self.batch_rows(int(k), epoch) for k in batches]
        return self.rows.read(np.concatenate(rows) if rows else rows, epoch=epoch)

    def plan_epoch(self, epoch: int, batches: Any) -> None:
        """The row source's cache learns the rows each upcoming batch reads."""
        self.rows.plan_epoch(epoch, _RowsOf(self, batches, epoch))

    def fit_cache(self, row_groups: int) -> int:
        if self._chunks() is None:
            return self.rows.fit_cache(len(self.rows.blocks()))  # rows come from anywhere
        return self.rows.fit_cache(len(self.rows.blocks()) * 2 // self._chunks() + 3)

    def cache_stats(self) -> dict[str, int]:
        return self.rows.cache_stats()

    def cancel_reads(self) -> None:
        self.rows.cancel_reads()

    def fingerprint(self) -> str:
        words = f"{self.rows.fingerprint()}|{self.column}|{self.max_tokens}|{self.bucket_batches}"
        if self._chunks() is not None:  # the order follows the chunks, so a resume must too
            # The lanes are the plan's (resolved from "auto"): the loader adds them.
            words += f"|chunks={self._chunks()}|window {self.shuffle_window}"
        return hashlib.sha256(words.encode()).hexdigest()[:16]

    def redactor(self) -> Redactor:
        return self.rows.redactor()

    def describe(self) -> str:
        return f"TokenBudgetBatches({self.rows.describe()}, max_tokens={self.max_tokens})"

    def locate(self, index: int) -> str:
        return f"token-budget batch {index} of {self.rows.describe()}"


def _bucketed(rows: np.ndarray, lengths: np.ndarray, bucket: int) -> np.ndarray:
    """`rows` with each run of `bucket` sorted longest first (stable): little padding."""
    for start in range(0, rows.size, bucket):
        part = rows[start : start + bucket]
        rows[start : start + bucket] = part[np.argsort(-lengths[part], kind="stable")]
    return rows


class _RowsOf:
    """Budget batches' index arrays seen as the rows they read (for the row cache)."""

    def __init__(self, owner: TokenBudgetBatches, batches: Any, epoch: int) -> None:
        self.owner, self.batches, self.epoch = owner, batches, epoch

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, k: int) -> np.ndarray:
        parts = [self.owner.batch_rows(int(b), self.epoch) for b in self.batches[k]]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
