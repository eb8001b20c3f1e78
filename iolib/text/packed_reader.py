"""The reader of packed token windows, one per process: `TokenReader`.

Why apart from `PackedTokens`: the source is a description (the corpus, `seq_len`, eos,
the window, its token index) that pickles into every worker as it is; this reader is
what each process builds from it and never pickles: the decoded row groups (segments,
one a row group whatever the epoch, in the cache `ParquetReader` uses: `PlannedCache`,
bounded by `cache_bytes`, evicting by next use along the loader's plan), the reads in
flight and their threads, the pieces kept at chunk edges, and the read-ahead along the
plan's batches. `read` cuts a batch from its segments with the token loops
(`iolib.text.kernels`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import CancelledError, Future
from functools import lru_cache, partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iolib.base.forks import reset_after_fork
from iolib.base.resources import thread_budget
from iolib.plan import stream_chunk_edges, stream_edge_pieces, stream_order, stream_rng
from iolib.sources import EpochUses, PlannedCache, ReadAhead, decode_slots, prefer_token_pool
from iolib.storage import count_bytes, is_local, open_filesystem
from iolib.storage.counters import count_retries
from iolib.text import tokenindex
from iolib.text.kernels import loops

FETCH_THREADS = thread_budget().remote_reads  # reads in flight from a store (`_read_threads`)
READAHEAD_BATCHES = 64  # batches past the next chunk's first whose row groups may be read
BEHIND_BATCHES = 4  # batches before this one that other workers may still be reading
RETRY_BATCHES = 8  # batches a read-ahead that found no room waits before it looks again
log = logging.getLogger("iolib.text.packed")


class Segment:
    """One row group's part of an epoch's stream: its non-empty documents in the epoch's
    order, each followed by eos. The tokens stay where Parquet's decode put them (as
    uint16 where the footer bounds the ids there: `packed_checks.narrow_type`):
    `tokens`, the record batches' values, read as one sequence in row order, no eos
    among them. Per document of the stream: where its tokens begin in that sequence
    (`sources`), where it begins in the stream (`starts`, with the stream's length
    last: document j's eos is at ``starts[j + 1] - 1``, so that eos_id may also be an
    ordinary token) and its row across the dataset (`rows`). Why a table and not the
    stream copied out: the copy cost a quarter of a batch's CPU on the read side and
    held the row group twice while it was made; the cut reads each token once either
    way. It holds exactly the bytes `PackedTokens` budgets for it: its tokens and 24 a
    document."""

    def __init__(
        self,
        tokens: tuple[np.ndarray, ...],
        sources: np.ndarray,
        starts: np.ndarray,
        rows: np.ndarray,
        offset: int = 0,
        epoch: int | None = None,
    ) -> None:
        self.tokens, self.sources, self.starts, self.rows = tokens, sources, starts, rows
        self.offset = offset  # where its stream begins in the row group's (a piece's)
        self.epoch = epoch  # whose document order it holds (None: every epoch's)
        held = sum(chunk.nbytes for chunk in tokens)
        self.nbytes = held + sources.nbytes + starts.nbytes + rows.nbytes

    @property
    def stream_tokens(self) -> int:
        """Tokens of its stream, eos included."""
        return int(self.starts[-1])

    def stream(self, eos: int) -> np.ndarray:
        """Its stream spelled out (int64, a copy): what the cut reads, for checks."""
        values = np.concatenate([np.zeros(0, np.int64), *(c.astype(np.int64) for c in self.tokens)])
        sizes = np.diff(self.starts) - 1
        out = np.full(self.stream_tokens, eos, dtype=np.int64)
        within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        out[np.repeat(self.starts[:-1], sizes) + within] = values[
            np.repeat(self.sources, sizes) + within
        ]
        return out

    def piece(self, a: int, b: int) -> Segment:
        """The documents that stream tokens [a, b) of this segment touch, their tokens
        copied: kept for the window that straddles two chunks, after the segment is let
        go. Its stream begins at the first one's start (`offset`)."""
        first = int(np.searchsorted(self.starts, a, side="right") - 1)
        last = int(np.searchsorted(self.starts, b - 1, side="right") - 1)
        starts = self.starts[first : last + 2] - self.starts[first]
        sizes = np.diff(starts) - 1
        sources = np.zeros(sizes.size, dtype=np.int64)
        np.cumsum(sizes[:-1], out=sources[1:])
        bases = np.cumsum([0] + [chunk.size for chunk in self.tokens])
        firsts = self.sources[first : last + 1]
        chunks = (np.searchsorted(bases[:-1], firsts, side="right") - 1).tolist()
        kept = [
            self.tokens[c][f - bases[c] :][:n]
            for c, f, n in zip(chunks, firsts.tolist(), sizes.tolist(), strict=True)
        ]
        tokens = (np.concatenate([self.tokens[0][:0], *kept]),)
        rows = self.rows[first : last + 1].copy()
        offset = self.offset + int(self.starts[first])
        return Segment(tokens, sources, starts, rows, offset=offset, epoch=self.epoch)

    @classmethod
    def build(
        cls,
        array: pa.ChunkedArray | list[pa.Array],
        first_row: int,
        order: np.random.Generator | None,
        epoch: int | None = None,
    ) -> Segment:
        """The segment of a row group's token column, its documents in `order`'s
        permutation (None: as stored). Its tokens are each chunk's values as decoded, no
        copy. A list of chunks is consumed (each let go once read: its offsets and
        validity go then, its values stay)."""
        if isinstance(array, pa.ChunkedArray):
            chunks = list(array.chunks) or [pa.array([], type=array.type)]
        else:
            chunks = array
        parts = []
        for i in range(len(chunks)):
            parts.append(_documents(chunks[i]))
            chunks[i] = None  # its offsets and validity go now: the values stay in parts
        bases = np.cumsum([0] + [p[0].size for p in parts[:-1]]).tolist()
        firsts = np.concatenate([p[1] + base for p, base in zip(parts, bases, strict=True)])
        sizes = np.concatenate([p[2] for p in parts])
        tokens = tuple(p[0] for p in parts)
        del parts
        docs = np.flatnonzero(sizes)
        if order is not None:
            docs = docs[order.permutation(docs.size)]
        starts = np.zeros(docs.size + 1, dtype=np.int64)
        np.cumsum(sizes[docs] + 1, out=starts[1:])
        return cls(tokens, firsts[docs], starts, docs + first_row, epoch=epoch)

    def reordered(self, order: np.random.Generator, epoch: int) -> Segment:
        """The same documents in `epoch`'s order, drawn from `order` as `build` draws it
        (the same batches as a segment read for that epoch): a new table over the same
        tokens, no read and no copy of them. A whole segment only (a piece's documents
        are cut)."""
        by_row = np.argsort(self.rows, kind="stable")  # positions, in the row group's order
        picks = by_row[order.permutation(by_row.size)]
        starts = np.zeros(picks.size + 1, dtype=np.int64)
        np.cumsum(np.diff(self.starts)[picks], out=starts[1:])
        return Segment(self.tokens, self.sources[picks], starts, self.rows[picks], epoch=epoch)


class TokenReader:
    """This process's reads of one `PackedTokens` (`d`, the description): a segment a row
    group kept across epochs in a cache of at most `d.cache_bytes` (evicted by next use
    along the loader's plan, `PlannedCache`; put in the epoch's document order when
    served), reads shared while in flight, and read-ahead along the batches the loader's
    plan lists (`plan_epoch`)."""

    def __init__(self, d: Any) -> None:  # a PackedTokens (not imported: it imports this)
        # A proxy, not a reference: the source owns its reader, and a cycle would keep a
        # dropped source's cache and read threads until the cycle collector ran.
        self.d = weakref.proxy(d)
        self._lock = threading.Lock()
        self._reorder = threading.Lock()  # one row group put in another epoch's order at once
        self._epochs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # Row group -> its segment, in the order of whichever epoch last served it.
        self._cache = PlannedCache(d.cache_bytes, _nbytes)
        # Not a bound method: the read-ahead must not keep its reader alive (a cycle).
        self._reads = ReadAhead("iolib-tokens", partial(_read_threads, self.d))
        self._plans: dict[int, Any] = {}  # epoch -> this rank's batches (from the plan)
        # epoch -> (row groups of those batches, each row group's position in the order)
        self._uses: dict[int, tuple[EpochUses, np.ndarray]] = {}
        self._horizons: dict[int, int] = {}  # epoch -> batches ahead read (`_horizon`)
        self._ahead = (-1, -1)  # (epoch, batch) whose row groups were last read ahead
        self._stalled = (-1, -1)  # (epoch, batch found) when reading ahead last found no room
        self._recent: dict[tuple[int, int], tuple[np.ndarray, list[int]]] = {}
        self._lanes_planned: dict[int, set[int]] = {}  # epoch -> lanes its plans deal to
        self._ranges: dict[tuple, dict] = {}  # (epoch, lanes) -> what edge row groups keep
        self._pieces: dict[tuple[int, int], list[Segment]] = {}  # (epoch, group) -> pieces
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """The parent's threads (and reads in flight, and its lock) are gone in a forked
        worker."""
        self._lock = threading.Lock()  # the read-ahead resets itself (`ReadAhead`)
        self._reorder = threading.Lock()
        self._cache.forget_threads()

    def close(self) -> None:
        """Stop the reads and drop the cached row groups."""
        self._reads.close()
        self._ahead, self._stalled = (-1, -1), (-1, -1)
        with self._lock:
            self._cache = PlannedCache(self.d.cache_bytes, _nbytes)
            self._pieces.clear()

    def cancel(self) -> None:
        """Drop the queued read-ahead (a loader closed, dropped or left): reads on the
        wire finish; read-ahead starts again with the next plan (`plan_epoch`: the next
        pass)."""
        self._reads.cancel()
        # No lock: this may run from a finalizer on a thread that holds it.
        self._ahead, self._stalled = (-1, -1), (-1, -1)

    def set_budget(self, nbytes: int) -> None:
        """Bound the cache at `nbytes` (the source's default, sized once the index is
        known); what it holds beyond that goes, least recently used first."""
        with self._lock:
            self._cache.resize(nbytes)

    def cache_stats(self) -> dict[str, int]:
        """Row-group reads and re-reads (same row group, same epoch), cache hits and
        evictions, in this process."""
        with self._lock:
            stats = self._cache.stats()
        stats["bytes_after_close"] = self._reads.bytes_after_close()
        return stats

    def _horizon(self, epoch: int) -> int:
        """Batches ahead whose row groups may be read: a chunk's (this rank's batches of
        one chunk, from the plan's lanes and batch size) and some, so that the next chunk
        is read while this one is cut."""
        plan = self._plans.get(epoch)
        found = self._horizons.get(epoch)
        if found is None:
            blocks = self.d.blocks()
            per_chunk = int(blocks[0]) if len(blocks) > 1 else 0
            lanes, world, granule = _lanes_of(plan)
            share = max(1, lanes // max(world, 1))
            found = -(-per_chunk * share // max(granule, 1)) + READAHEAD_BATCHES
            if plan is not None:
                self._horizons[epoch] = found
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
        stream = self.d.stream
        for count in lanes:
            edges = stream_chunk_edges(cum, self.d.seq_len, len(self.d), count,
                                       stream.groups_per_chunk)  # fmt: skip
            for group, ranges in stream_edge_pieces(order, cum, edges, self.d.seq_len).items():
                pieces.setdefault(group, []).extend(ranges)
        with self._lock:
            self._ranges = {k: v for k, v in self._ranges.items() if k[0] >= epoch - 1}
            self._ranges[(epoch, lanes)] = pieces
        return pieces

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(row-group order, prefix sums of their stream tokens) for `epoch`: O(row groups)."""
        key = (self.d.seed, epoch)
        found = self._epochs.get(key)
        if found is not None:
            return found
        order, cum = stream_order(self.d.stream, self.d.seed, epoch)
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
        order, cum = self._epoch(epoch)
        # Not a method: the cache's plan must not keep its reader alive (a cycle).
        pairs = partial(_window_pairs, order, cum, self.d.seq_len)
        uses = EpochUses.build(epoch, batches, pairs_of=pairs)
        with self._lock:
            self._cache.plan(uses)  # the cache evicts by next use along these batches
            # The uses first: a thread that finds the batches (no lock) finds them too.
            self._uses = {e: u for e, u in self._uses.items() if e == epoch - 1}
            self._uses[epoch] = (uses, np.argsort(order))
            self._plans = {e: b for e, b in self._plans.items() if e == epoch - 1}
            self._plans[epoch] = batches
            self._horizons = {e: h for e, h in self._horizons.items() if e == epoch - 1}
            planned = self._lanes_planned
            self._lanes_planned = {e: v for e, v in planned.items() if e >= epoch - 1}
            self._lanes_planned.setdefault(epoch, set()).add(lanes)
        self._reads.resume()

    def _groups_of(self, windows: np.ndarray, epoch: int) -> np.ndarray:
        """Positions (in the epoch's row-group order) that windows' tokens come from,
        with the token after each window (its last label)."""
        return _positions(windows, self._epoch(epoch)[1], self.d.seq_len)

    def _fetch(
        self,
        epoch: int,
        position: int,
        windows: np.ndarray,
        ahead: bool = False,
        batch: int = 0,
    ) -> Segment | Future | None:
        """The segment at `position` of the epoch's row-group order if held (in any
        epoch's document order), else a piece of it that holds all that `windows` need
        of it, else its read: shared if in flight (one read however many threads want
        it), else started; None when reading ahead finds no room, even after dropping
        the held segments needed later than batch `batch` (`PlannedCache.make_room`)."""
        order, _ = self._epoch(epoch)
        group = int(order[position])
        with self._lock:
            held = self._cache.get(group)  # in any epoch's order: `_serve` reorders it
            if held is not None:
                return held
            pieces = self._pieces.get((epoch, group))
        # A read in flight is shared (whichever epoch started it: `_serve` reorders it);
        # one a batch now waits on goes before read-ahead. By (epoch, batch): the next
        # epoch's first batches (persistent workers) never pass this one's last.
        priority = (epoch, batch)
        pool = self._reads.started
        flight = None if pool is None else pool.flight(group, need=not ahead, priority=priority)
        if flight is not None:
            return flight
        if pieces:
            piece = self._covering(pieces, epoch, position, windows)
            if piece is not None:
                return piece
        pool = self._reads.pool()
        with self._lock:
            # A read that landed since the look above put its segment first: no re-read.
            held = self._cache.get(group)
            if held is not None:
                return held
            if ahead and pool.flight(group) is None and not self._room_for(group, epoch, batch):
                return None  # no room to read ahead: the batch that needs it will
            # Shared if another thread started it meanwhile (the pool's key).
            load = partial(self._load, epoch, group)
            flight = pool.submit(load, ahead=ahead, priority=priority, key=group)
        if not ahead:
            pool.promote(flight, priority)
        return flight

    def _covering(
        self, pieces: list[Segment], epoch: int, position: int, windows: np.ndarray
    ) -> Segment | None:
        """The piece of the row group at `position` that holds every token (and next
        token) that `windows` take from it, if one does."""
        _, cum = self._epoch(epoch)
        lo = windows * self.d.seq_len
        hi = np.minimum(lo + self.d.seq_len + 1, cum[-1])
        base, top = int(cum[position]), int(cum[position + 1])
        touch = (lo < top) & (hi > base)
        if not touch.any():
            return None
        need_lo, need_hi = max(int(lo[touch].min()), base), min(int(hi[touch].max()), top)
        for piece in pieces:
            start = base + piece.offset
            if start <= need_lo and need_hi <= start + piece.stream_tokens:
                return piece
        return None

    def _room_for(self, group: int, epoch: int, batch: int) -> bool:
        """Whether the cache has room to read `group` ahead for batch `batch`, made by
        dropping held segments needed later than that batch (or never), the furthest
        first: when the next chunk's row groups are due the cache is full of the last
        chunk's, which it would otherwise keep until a batch has to wait for its reads.
        Under the lock."""
        size = int(self.d.group_bytes[group])
        return self._cache.make_room(size, (epoch, batch), self._in_flight_bytes())

    def _in_flight_bytes(self) -> int:
        """A read in flight counts as the segment it will be: the decoder's own buffers
        exist only while a decode slot (one a core) holds it, bounded by the cores, not by
        the reads queued (counted 3x, the next chunk was not read ahead in time)."""
        sizes = self.d.group_bytes
        pool = self._reads.started
        return int(sum(sizes[group] for group in pool.in_flight())) if pool else 0

    def _load(self, epoch: int, group: int) -> Segment:
        """Read and decode row group `group` in `epoch`'s document order, and cache it."""
        opened = self._reads.opened  # a close() from now on: nothing read is kept
        prefer_token_pool()  # before a segment is allocated: see arrow_pool.py
        try:
            needed = self._reads.needed()  # a batch waits for it: read in parallel pieces
            parquet = self.d.parquet
            read_as = self.d.read_as(group)  # uint16 where the footer bounds the ids there
            table = tokenindex.unskippable(
                lambda: parquet.fetch_row_group(group, needed=needed, read_as=read_as)
            )
            first_row = int(self.d.parquet.row_starts()[group])
            order = stream_rng(self.d.seed, epoch, group) if self.d.shuffle_documents else None
            tagged = epoch if order is not None else None
            column = table.column(self.d.column)
            chunks = column.chunks or [pa.array([], type=column.type)]
            del table, column  # the chunks alone hold the row group: `build` takes them
            segment = Segment.build(chunks, first_row, order, tagged)
            documents = segment.starts.size - 1  # the index's counts, checked (free here)
            self.d.index.check_segment(group, segment.stream_tokens - documents, documents)
            self._keep_pieces(epoch, group, segment, opened)
            with self._lock:
                if not self._reads.kept_since(opened):
                    return segment
                self._cache.record_read(group, epoch)
                if group not in self._cache:  # counted once, whichever read lands first
                    self._cache.put(group, segment, threading.get_ident())
            return segment
        finally:
            with self._lock:
                idle = len(self._reads.pool().in_flight()) <= 1  # the last read in flight
            if idle:
                # Arrow's pool may keep freed pages (mimalloc, pyarrow's default, per read
                # thread). Returned when the reads pause (after each one, it cost ~15% more
                # CPU a batch).
                pa.default_memory_pool().release_unused()

    def _planned(self, epoch: int, k: int) -> tuple[np.ndarray, list[int], list[int]]:
        """Windows of batch k of the plan, the positions of their row groups, and those
        positions the largest row group first (the batches read ahead are kept: each
        costs an order lookup, and they are asked for again to find this batch)."""
        key = (epoch, k)
        found = self._recent.get(key)
        if found is None:
            windows = np.asarray(self._plans[epoch][k], dtype=np.int64)
            uses, rank = self._uses[epoch]  # the cache's plan found them: no second search
            positions = sorted(rank[uses.upcoming(k, 1)].tolist())
            found = (windows, positions, self._largest_first(epoch, positions))
            with self._lock:
                self._recent[key] = found
                while len(self._recent) > self._horizon(epoch) + 4 * BEHIND_BATCHES:
                    del self._recent[next(iter(self._recent))]
        return found

    def _largest_first(self, epoch: int, positions: list[int]) -> list[int]:
        """`positions` the largest row group first: a batch's reads start at once, take
        turns on the link in pieces (`ranges`), and the smaller one's decode after the
        last byte is the shorter."""
        if len(positions) < 2:  # most batches need one row group: nothing to order
            return positions
        sizes = self.d.group_bytes[self._epoch(epoch)[0][positions]]
        return [positions[i] for i in np.argsort(-sizes, kind="stable")]

    def _told(self, windows: np.ndarray, epoch: int, batch: int | None) -> int | None:
        """`batch` if the loader said which batch of the plan these windows are and they
        are that batch (a batch replaced under on_error="skip" is not), else None: a read
        by hand, or a sample retried alone, reads nothing ahead."""
        batches = self._plans.get(epoch)
        if batch is None or batches is None or not 0 <= batch < len(batches):
            return None
        planned = self._planned(epoch, batch)[0]
        # Most often the plan's own array (the loader's task holds it): no comparison.
        return batch if planned is windows or np.array_equal(planned, windows) else None

    def _read_ahead(self, epoch: int, now: int) -> None:
        """Start reading the row groups of the batches after batch `now`, where the cache
        has room."""
        if self._reads.paused:
            return
        total = len(self._plans[epoch])
        # Room comes back only as batches pass: looking for it each batch cost more than
        # the cut with a 128 MiB cache (the batches ahead's keys, gathered each time).
        if self._stalled[0] == epoch and now < self._stalled[1] + RETRY_BATCHES:
            return
        # Batches up to `_ahead` were looked at already: only the newest one is new.
        done_epoch, done = self._ahead
        start = max(now + 1, done + 1 if done_epoch == epoch else 0)
        for k in range(start, min(total, now + 1 + self._horizon(epoch))):
            windows, positions, _ = self._planned(epoch, k)
            for position in positions:
                if self._fetch(epoch, position, windows, ahead=True, batch=k) is None:
                    self._stalled = (epoch, now)
                    return  # no room: this batch is looked at again a few batches on
            self._ahead = (epoch, k)

    def read(self, indices: np.ndarray, *, epoch: int = 0, batch: int | None = None) -> pa.Table:
        """Windows `indices` of `epoch`, as fixed-size-list columns (collated to [B, L]
        tensors without a copy); `batch`: which batch of the plan they are (read-ahead
        follows the plan from there)."""
        windows = np.asarray(indices, dtype=np.int64)
        k = self._told(windows, epoch, batch)  # the plan's windows are in range
        if k is None and windows.size and (windows.min() < 0 or windows.max() >= len(self.d)):
            raise IndexError(f"window indices outside 0..{len(self.d) - 1}")
        if k is not None:
            ordered = self._planned(epoch, k)[2]  # found when this batch was read ahead
        else:
            ordered = self._largest_first(epoch, self._groups_of(windows, epoch).tolist())
        at = k if k is not None else 0
        self._reads.begin()  # a cancel from now on stops this batch's read-ahead only
        thread = threading.get_ident()
        with self._lock:  # which batch this thread cuts: the cache keeps its row groups
            self._cache.begin(thread, epoch, int(windows[0]) if windows.size else None, k)
        try:
            found = {p: self._fetch(epoch, p, windows, batch=at) for p in ordered}
            if k is not None:
                self._read_ahead(epoch, k)
            segments = {p: self._wait(epoch, p, windows, f, at) for p, f in found.items()}
        finally:
            with self._lock:
                self._cache.end(thread)
            read, retries = self._reads.take_io()
            count_bytes(read)  # helper threads' reads count in the batch that needed them
            count_retries(retries)
        return self._cut(windows, epoch, segments)

    def _wait(
        self, epoch: int, position: int, windows: np.ndarray, found: Any, batch: int
    ) -> Segment:
        """The segment `found` is or will be, in `epoch`'s document order (`_serve`);
        read again if its read was cancelled (a loader over this source was closed
        meanwhile)."""
        while not isinstance(found, Segment):
            try:
                found = found.result()
            except CancelledError:
                found = self._fetch(epoch, position, windows, batch=batch)
        return self._serve(epoch, position, found)

    def _serve(self, epoch: int, position: int, segment: Segment) -> Segment:
        """`segment` in `epoch`'s document order: as it is, or put in that order from
        another epoch's (a copy, no read), which then takes its place in the cache, with
        the pieces this epoch keeps of it. One thread reorders a row group at a time (a
        batch's threads all want the same ones as an epoch begins)."""
        if segment.epoch is None or segment.epoch == epoch:
            return segment
        group = int(self._epoch(epoch)[0][position])
        with self._reorder:
            opened = self._reads.opened
            with self._lock:
                held = self._cache.tables.get(group)
            if held is not None and held.epoch == epoch:
                return held  # another thread put it in this order meanwhile
            rng = stream_rng(self.d.seed, epoch, group)
            new = segment.reordered(rng, epoch)
            self._keep_pieces(epoch, group, new, opened)
            with self._lock:
                if self._cache.tables.get(group) is held is not None:
                    self._cache.tables[group] = new  # the same bytes: what it holds is true
        return new

    def _keep_pieces(self, epoch: int, group: int, segment: Segment, opened: int) -> None:
        """Keep the pieces of `segment` (in `epoch`'s order) that this epoch's windows
        straddling two chunks take (a corpus in one chunk has no edges: none), unless the
        reader was closed since the read began at `opened`."""
        ranges = self._edge_pieces(epoch).get(group, ())
        if ranges:
            pieces = [segment.piece(a, b) for a, b in ranges]
            with self._lock:
                if self._reads.kept_since(opened):
                    self._pieces[(epoch, group)] = pieces

    def _cut(self, windows: np.ndarray, epoch: int, segments: dict[int, Segment]) -> pa.Table:
        """The windows' columns, filled by one compiled pass (`loops.cut_windows`): a
        window inside one segment is one piece, one that spans segments (or the stream's
        end) a piece of each."""
        _, cum = self._epoch(epoch)
        d = self.d
        count, length = windows.size, d.seq_len
        planes = 4 if d.document_ids else 3
        # From pyarrow's default pool (jemalloc where pyarrow has it, unless a ParquetSource
        # chose the system allocator first: arrow_pool.py), which reuses freed pages: the
        # system allocator gave each batch fresh pages when a worker thread cut it and the
        # consumer freed it.
        buffer = pa.allocate_buffer(planes * count * length * 8)
        held = sorted(segments)
        given = [(s.tokens, s.sources, s.starts, s.rows, s.offset)
                 for s in map(segments.__getitem__, held)]  # fmt: skip
        loops.cut_windows(windows * length, cum, np.array(held, dtype=np.int64), given, d.eos_id,
                          d.ignore_index, np.frombuffer(buffer, dtype=np.int64), count, length,
                          d.document_ids)  # fmt: skip
        return _window_table(buffer, planes, count, length)


def _lengths(array: pa.Array) -> np.ndarray:
    """Each row's length of a list array, int64; a null row is empty."""
    if array.null_count == 0:
        return np.diff(array.offsets.to_numpy()).astype(np.int64)
    return pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _documents(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values, each row's offset into them, its length) of a list array, int64
    offsets and lengths; a null row is empty. Without null rows (Parquet's token
    columns), the child's values as they are, no copy (``flatten`` cost ~30 ms CPU a
    row group of 1.2 M tokens)."""
    if array.null_count == 0:
        bounds = array.offsets.to_numpy().astype(np.int64)  # into the child (a slice too)
        return array.values.to_numpy(zero_copy_only=False), bounds[:-1], np.diff(bounds)
    values = array.flatten().to_numpy(zero_copy_only=False)
    lengths = _lengths(array)
    return values, np.cumsum(lengths) - lengths, lengths  # nulls add no values


_PLANE_NAMES = ("input_ids", "labels", "position_ids", "document_ids")


@lru_cache(maxsize=8)
def _window_schema(planes: int, length: int) -> pa.Schema:
    return pa.schema([(name, pa.list_(pa.int64(), length)) for name in _PLANE_NAMES[:planes]])


def _window_table(buffer: pa.Buffer, planes: int, rows: int, length: int) -> pa.Table:
    """The planes of `buffer` ([planes, rows, length] int64) as columns of `rows`
    fixed-size lists that share its memory (collated to [rows, length] tensors without a
    copy)."""
    schema = _window_schema(planes, length)
    values = pa.Array.from_buffers(pa.int64(), planes * rows * length, [None, buffer])
    lists = pa.Array.from_buffers(schema[0].type, planes * rows, [None], children=[values])
    return pa.Table.from_arrays([lists.slice(i * rows, rows) for i in range(planes)], schema=schema)


def _lanes_of(plan: Any) -> tuple[int, int, int]:
    """(lanes, world size, batch size) of the loader's plan that `plan_epoch` was given
    (one lane, one rank, one window for reads by hand)."""
    choice = getattr(plan, "choice", None)
    if choice is None:
        return 1, 1, 1
    return choice.lanes, int(getattr(plan, "world_size", 1)), choice.granule


def _read_threads(d: Any) -> int:
    """Row-group reads in flight: FETCH_THREADS from a remote store, whose rate per
    connection is far below its total; from local disk as many as decode at once: a
    read there is all decode, and more threads only hold more memory (each thread's
    allocator keeps what its reads freed)."""
    options = d.parquet.storage_options
    local = all(is_local(open_filesystem(url, options)[0]) for url in d.parquet.urls)
    return decode_slots() if local else FETCH_THREADS


def _nbytes(segment: Segment) -> int:
    return segment.nbytes


def _window_positions(
    windows: np.ndarray, cum: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """(window, position) pairs, repeats allowed: the positions (in an epoch's row-group
    order, whose prefix sums of stream tokens are `cum`) that each window's tokens come
    from, with the token after it (its last label)."""
    lo = windows * seq_len
    hi = np.minimum(lo + seq_len, cum[-1] - 1)
    first = np.searchsorted(cum, lo, side="right") - 1
    last = np.searchsorted(cum, hi, side="right") - 1
    at = np.arange(windows.size)
    if (last - first <= 1).all():  # a window in one or two segments: no gaps to fill
        return np.concatenate([at, at]), np.concatenate([first, last])
    counts = last - first + 1
    steps = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(at, counts), np.repeat(first, counts) + steps


def _positions(windows: np.ndarray, cum: np.ndarray, seq_len: int) -> np.ndarray:
    """Positions that windows' tokens come from (`_window_positions`), each once, sorted."""
    return np.unique(_window_positions(windows, cum, seq_len)[1])


def _window_pairs(
    order: np.ndarray, cum: np.ndarray, seq_len: int, windows: np.ndarray, ks: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(batch number, row group) pairs of windows whose batch numbers are `ks`: what
    the cache's plan counts (`EpochUses`), for a stretch of batches at once."""
    at, positions = _window_positions(np.asarray(windows, dtype=np.int64), cum, seq_len)
    return ks[at], order[positions]
