"""A worker's reads of a Parquet description: `ParquetReader`.

Each worker (a process, or the process whose threads share it) builds one from the
description on first use; it holds what must not travel: the row-group cache (sized in
decoded Arrow bytes, evicted by next use in the epoch plan: `iolib.sources.rgcache`),
the read-ahead and the batches' reads (`ReadAhead`: a fetch pool whose keyed flights
let threads that miss the same row group share one read, needed reads first), the
dense in-memory store (`iolib.sources.dense`), the open files
(`iolib.sources.parquet_fetch`) and the counters. A batch's indices are grouped by row
group; each row group is read once, and rows are taken from the Arrow tables without
Python per-row work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import CancelledError, Future, wait
from contextlib import nullcontext
from functools import partial

import numpy as np
import pyarrow as pa

from iolib.base.forks import reset_after_fork
from iolib.base.resources import thread_budget
from iolib.sources.dense import DenseColumns
from iolib.sources.parquet_description import ParquetDescription
from iolib.sources.parquet_fetch import RowGroupFetcher
from iolib.sources.readahead import ReadAhead
from iolib.sources.rgcache import EpochUses, PlannedCache
from iolib.storage import count_bytes, take_counters
from iolib.storage.counters import count_retries

FETCH_THREADS = thread_budget().remote_reads  # a batch's row-group reads in flight at once
WAKE_S = 0.5  # a batch waiting on a read looks again this often (see `_wait`)
# One logger for the Parquet source, whichever of its modules speaks.
log = logging.getLogger("iolib.sources.parquet")


class ParquetReader:
    """Reads batches and row groups of a `ParquetDescription`, thread-safely. Building
    one costs nothing (threads start on use); reads need the description `indexed`."""

    def __init__(self, description: ParquetDescription) -> None:
        self.description = description
        self.fetcher = RowGroupFetcher(self.description)
        self._lock = threading.Lock()
        self._cache = PlannedCache(self.description.cache_bytes, lambda t: t.nbytes)
        self._rereads_warned = False
        self._failed_groups: set[int] = set()  # a read failed: read again, not the cache's doing
        # A batch's reads in parallel and the read-ahead, needed reads first.
        self._ahead = ReadAhead("iolib-fetch", FETCH_THREADS + thread_budget().readahead,
                                ahead_threads=thread_budget().readahead)  # fmt: skip
        self._ahead_sent: set[tuple[int, int]] = set()  # (epoch, row group) submitted
        # This thread's epoch, batch, the row groups it wants and the reads it holds.
        self._local = threading.local()
        self._dense: DenseColumns | None = None
        self._dense_wanted = self.description.keep_dense
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """In a forked worker: the parent's threads are gone, and with them the reads
        they had in flight, the read-ahead thread and any lock they held. What was read
        stays (the in-memory store is shared copy-on-write)."""
        self._lock = threading.Lock()
        self._cache = PlannedCache(self.description.cache_bytes, lambda t: t.nbytes)
        self._ahead_sent = set()  # the read-ahead resets itself (`ReadAhead`)
        self._local = threading.local()
        self.fetcher.after_fork()
        if self._dense is not None:
            self._dense.after_fork()

    def update(self, description: ParquetDescription) -> None:
        """Read by `description` from now on (the same files: a new cache budget, other
        storage options, or the in-memory store chosen or not)."""
        with self._lock:
            self.description = self.fetcher.description = description
            self._dense_wanted = description.keep_dense
            if not description.keep_dense:
                self._dense = None
            if description.cache_bytes != self._cache.budget:
                self._cache.resize(description.cache_bytes)

    def defer_counts(self) -> None:
        """Storage counts per thread: this one makes no batch (read-ahead, planning), so
        the next batch counts what it read and retried."""
        self._ahead.deposit(*take_counters())

    def close(self) -> None:
        """Stop the reads and drop what is held."""
        self._ahead.close()
        self._ahead_sent = set()
        with self._lock:
            self._cache = PlannedCache(self.description.cache_bytes, lambda t: t.nbytes)
            self._dense = None

    def cancel(self) -> None:
        """Drop the queued read-ahead (a loader closed, dropped or left): reads on the
        wire finish (their bytes: `bytes_after_close`) and a batch's own reads are kept;
        read-ahead starts again with the next plan (`plan_epoch`: the next pass)."""
        self._ahead.cancel()
        # No lock: this may run from a finalizer on a thread that holds it.
        self._ahead_sent = set()

    # -- what a caller can observe ---------------------------------------------------------
    def cache_stats(self) -> dict[str, int]:
        """Row-group reads and re-reads (same row group, same epoch), cache hits and
        evictions, in this process."""
        with self._lock:
            stats = self._cache.stats()
        stats["bytes_after_close"] = self._ahead.bytes_after_close()
        return stats

    def dense_row_groups(self) -> np.ndarray | None:
        """Which row groups the in-memory store holds (one bool each), or None when
        batches are gathered from Arrow tables (no store, or one given up on a null)."""
        dense = self._dense
        return None if dense is None else dense.filled.copy()

    def open_files(self) -> dict[str, int]:
        """Path -> bytes still loaded, for each file the calling thread holds open."""
        return self.fetcher.open_files()

    def plan_epoch(self, epoch: int, batches: Sequence[np.ndarray]) -> None:
        """The epoch's batches on this rank: the cache evicts by next use, not recency."""
        starts = self.description.row_starts
        uses = EpochUses.build(
            epoch, batches, lambda i: np.searchsorted(starts, i, side="right") - 1
        )
        with self._lock:
            self._cache.plan(uses)
        self._ahead.resume()

    # -- batches ---------------------------------------------------------------------------
    def read(self, indices: np.ndarray, epoch: int, batch: int | None = None) -> pa.Table:
        """Rows at `indices` (int64, in range), in that order, as a fresh Arrow table;
        `batch`: which batch of the plan they are (found by their first row if not said).

        From the dense store when there is one (one `np.take` per column); else Arrow's
        `take` per row group plus one reordering `take` (two copies, GIL released)."""
        thread = threading.get_ident()
        self._local.epoch = epoch
        self._ahead.begin()  # a cancel from now on stops this batch's read-ahead
        with self._lock:  # which batch this thread assembles: the cache protects it
            first = int(indices[0]) if indices.size else None
            k = self._cache.begin(thread, epoch, first, batch)
        self._local.batch = k if k is not None else 0
        # A batch that misses row groups is waited on: no read-ahead starts until it
        # is assembled (it was submitted first so that the two meet in the middle).
        need = self._ahead.pool().needing() if self._misses(indices) else nullcontext()
        try:
            with need:
                if k is not None and self.description.readahead:
                    self._read_ahead(epoch, k)
                return self._read(indices)
        finally:
            with self._lock:
                self._cache.end(thread)
            read, retries = self._ahead.take_io()
            self.release()
            count_bytes(read)  # what was read ahead counts in the batch that took it over
            count_retries(retries)

    def _misses(self, indices: np.ndarray) -> bool:
        """Whether a row group of `indices` is neither held nor in the in-memory store."""
        dense = self._dense
        if not indices.size or (dense is not None and dense.complete):
            return False  # every row group is in the store: nothing to look up a batch
        groups = np.unique(np.searchsorted(self.description.row_starts, indices, side="right") - 1)
        with self._lock:
            return any(
                g not in self._cache and (dense is None or not dense.filled[g])
                for g in groups.tolist()
            )

    def _read(self, indices: np.ndarray) -> pa.Table:
        starts = self.description.row_starts
        dense = self._dense_columns()
        if dense is not None and indices.size and self._fill_dense(dense, indices):
            return dense.take(indices)
        groups = np.searchsorted(starts, indices, side="right") - 1
        self._local.wanted = set(groups.tolist())
        self._read_in_parallel(sorted(self._local.wanted), None)
        order = np.argsort(groups, kind="stable")
        pieces, boundaries = [], np.flatnonzero(np.diff(groups[order])) + 1
        for chunk in np.split(order, boundaries) if indices.size else []:
            group = int(groups[chunk[0]])
            table = self._row_group(group)
            pieces.append(table.take(pa.array(indices[chunk] - starts[group])))
        if not pieces:
            return self.description.schema.empty_table()
        batch = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        return batch.take(pa.array(inverse))

    def release(self) -> None:
        """Drop this thread's loaded bytes and the reads it held once a batch is decoded."""
        self.fetcher.release()
        self._local.wanted = ()
        self._local.pending = {}

    # -- the dense store -------------------------------------------------------------------
    def _dense_columns(self) -> DenseColumns | None:
        """The contiguous column store, made on first use where fit_cache chose it."""
        if self._dense is not None or not self._dense_wanted or self.description.fixed_cache:
            return self._dense  # the per-batch path: no lock once the store exists
        with self._lock:
            if self._dense is None and self._dense_wanted:
                d = self.description
                self._dense = DenseColumns(d.schema, d.row_starts, d.capacities())
            return self._dense

    def _fill_dense(self, dense: DenseColumns, indices: np.ndarray) -> bool:
        """Copy in the row groups `indices` need; False if one holds a null (the store is
        then dropped and the caller reads Arrow tables)."""
        if dense.complete:
            return True
        groups = np.searchsorted(self.description.row_starts, indices, side="right") - 1
        missing = list(dense.missing(groups))
        self._local.wanted = set(missing)
        self._read_in_parallel(missing, dense)
        for group in missing:
            table = self._row_group(group, dense=dense)
            if not dense.filled[group] and not dense.fill(group, table):
                self._drop_dense(group)
                return False
        return True

    def _drop_dense(self, group: int) -> None:
        """A row group held nulls: go back to Arrow tables for good (nulls survive there)."""
        log.info("%s: row group %d holds nulls; batches are gathered from Arrow tables",
                 self.description.describe(), group)  # fmt: skip
        with self._lock:
            self._dense_wanted, self._dense = False, None

    # -- row groups ------------------------------------------------------------------------
    def row_group(self, group: int) -> pa.Table:
        """Row group `group` of the projected columns, through the cache."""
        try:
            return self._row_group(group)  # type: ignore[return-value]
        finally:
            self.release()

    def keep(self, group: int, table: pa.Table) -> bool:
        """Offer the cache a row group read outside any batch (the one read to size the
        cache), so that the batch that needs it does not read it again; whether kept."""
        with self._lock:
            return group in self._cache or self._cache.put(group, table, 0)

    def fetch_row_group(
        self, group: int, *, needed: bool = False, read_as: Mapping[str, pa.DataType] | None = None
    ) -> pa.Table:
        """Row group `group` from storage with retries and counted, bypassing the cache."""
        try:
            return self.fetcher.fetch(group, transient=True, needed=needed, read_as=read_as)
        finally:
            self.release()

    def _row_group(self, group: int, dense: DenseColumns | None = None) -> pa.Table | None:
        """A row group from this thread's reads, the cache, else storage: one read however
        many threads want it (the fetch pool's flight of `group`; a read-ahead of it is
        promoted to a needed read).

        With `dense`, the read copies the row group into that store and does not cache
        it; None when the store already holds it (another thread filled it since)."""
        pending = self._local.__dict__.setdefault("pending", {})
        while True:
            future = pending.pop(group, None)
            if future is None:
                with self._lock:
                    if dense is not None and dense.filled[group]:
                        return None
                    cached = self._cache.get(group)
                if cached is not None:
                    return cached
                future = self._start(group, dense)
            try:
                table = self._wait(future)
            except CancelledError:  # a read-ahead dropped before it ran: read it now
                continue
            if table is not None:
                return table
            if dense is not None and dense.filled[group]:
                return None
            # A read-ahead that found its batches passed: look again (a needed read next).

    def _wait(self, future: Future) -> pa.Table | None:
        """The result of a read this batch waits for: promoted to a needed read (one
        shared with a read-ahead queued meanwhile would wait behind this very batch's
        `needing`), and again at each wake-up."""
        pool, now = self._ahead.pool(), self._now()
        while True:
            pool.promote(future, now)
            wait([future], timeout=WAKE_S)
            # done(), not wait()'s answer: a read the pool dropped is cancelled but never
            # notified as such, and `wait` would not count it done however long it waited.
            if future.done():
                return future.result()

    def _start(self, group: int, dense: DenseColumns | None) -> Future:
        """The needed read of `group`: the one in flight (promoted), else a new one that
        brings in the same request the batch's later row groups that no thread holds or
        reads (`RowGroupFetcher.foldable`), taking over a read-ahead of `group` still
        queued (`FetchPool.submit_many`); their reads are kept for this thread."""
        pool, now = self._ahead.pool(), self._now()
        found = pool.flight(group)
        if found is not None and not pool.queued_ahead(found):
            pool.promote(found, now)
            return found
        with self._lock:  # a read that landed since the caller looked cached it first
            held = self._cache.get(group)
            if held is not None or (dense is not None and dense.filled[group]):
                found = Future()
                found.set_result(held)
                return found
        pending = self._local.__dict__.setdefault("pending", {})
        in_flight = set(pool.in_flight())
        with self._lock:
            later = [
                g
                for g in sorted(getattr(self._local, "wanted", ()))
                if g > group
                and g not in self._cache
                and g not in in_flight
                and g not in pending
                and (dense is None or not dense.filled[g])
            ]
        later = self.fetcher.foldable(group, later)
        read = partial(self._load, now[0], dense, threading.get_ident())
        futures = pool.submit_many(read, [group, *later], priority=now)
        pool.promote(futures[group], now)  # if it began as a read-ahead meanwhile
        for g in later:
            pending[g] = futures[g]
        return futures[group]

    def _now(self) -> tuple[int, int]:
        """(epoch, batch) this thread assembles: the priority of its reads."""
        return getattr(self._local, "epoch", 0), getattr(self._local, "batch", 0)

    def _load(
        self, epoch: int, dense: DenseColumns | None, owner: int, groups: list[int]
    ) -> dict[int, object]:
        """On a pool thread: `groups` from storage in one request where they fit (the
        first is the one asked for), each cached (or copied into `dense`) for `owner`,
        the thread whose batch asked (a read-ahead's owner is none). A read-ahead whose
        batches passed reads nothing; a row group that fails gets its error (raised to
        whoever waits for it)."""
        self._local.epoch = epoch
        needed = self._ahead.needed()
        opened = self._ahead.opened  # a close() from now on: nothing read is kept
        out: dict[int, object] = {}
        try:
            if not needed and not self._still_ahead(epoch, groups[0]):
                return out  # waited behind needed reads until its batches passed
            with self._lock:  # read by another flight since this one was asked for
                held = self._cache.tables.get(groups[0])
                if held is not None or (dense is not None and dense.filled[groups[0]]):
                    return {groups[0]: held}
                for group in groups:
                    self._count_read(group)
            for i, group in enumerate(groups):
                try:
                    table = self.fetcher.fetch(group, groups[i + 1 :] if i == 0 else (),
                                               needed=needed)  # fmt: skip
                except Exception as exc:
                    with self._lock:
                        self._failed_groups.add(group)
                        for other in groups[i + 1 :]:  # never read: not re-reads later
                            self._cache.unrecord_read(other, epoch)
                    out[group] = exc
                    return out
                if dense is not None:
                    dense.fill(group, table)  # unfilled if it holds a null: the caller checks
                else:
                    with self._lock:
                        if self._ahead.kept_since(opened):
                            self._cache.put(group, table, owner if needed else 0)
                out[group] = table
            return out
        finally:
            self.release()
            if needed:  # counted before its waiter wakes: in the batch that waits
                self._ahead.deposit(*take_counters())

    def _count_read(self, group: int) -> None:
        """Count a read from storage (the lock is held); warn once at the first re-read."""
        epoch = getattr(self._local, "epoch", 0)
        again = self._cache.record_read(group, epoch)
        if not again or self._rereads_warned or group in self._failed_groups:
            return  # a failed row group read again (on_error="skip") says nothing of the cache
        self._rereads_warned = True
        meta, local = self.description.group(group)
        log.warning(
            "%s: %r row group %d is read again in epoch %d: the row-group cache (%.0f MiB) "
            "holds less than this shuffle needs. Use shuffle='block', a larger "
            "`cache_bytes`, or smaller row groups; loader.stats()['row_group_rereads'] "
            "counts the re-reads.",
            self.description.describe(),
            meta.url,
            local,
            epoch,
            self.description.cache_bytes / 2**20,
        )

    # -- reads ahead of need ---------------------------------------------------------------
    def _read_ahead(self, epoch: int, k: int) -> None:
        """Submit the row groups of batches k..k+readahead not yet held or read, latest
        first (the batch's own thread reads its row groups in ascending order: the two
        meet in the middle), where the cache or the in-memory store has room."""
        if self._ahead.paused:
            return
        dense = self._dense_columns()
        if dense is not None and dense.complete:
            return  # nothing left to read: the epoch's plan need not be walked
        sizes = self.description.sizes
        with self._lock:
            upcoming = self._cache.upcoming(epoch, k, self.description.readahead)
            # No plan, or sizes unknown: no room.
            if upcoming is None or sizes is None:
                return
            # Room for everything these batches read that is not held yet, in order of
            # first use, so that a read ahead never displaces what is needed sooner (it
            # would then be read twice).
            room = self._cache.room_ahead(upcoming, sizes)
            in_flight = set(self._ahead.pool().in_flight())
            wanted = []
            for group in upcoming:
                if group in self._cache or (dense is not None and dense.filled[group]):
                    continue
                room -= sizes[group]
                if dense is None and room < 0:
                    break
                if (epoch, group) in self._ahead_sent or group in in_flight:
                    continue
                wanted.append(group)
                self._ahead_sent.add((epoch, group))
            self._ahead_sent = {(e, g) for e, g in self._ahead_sent if e >= epoch - 1}
            if not wanted:
                return
        pool = self._ahead.pool()
        read = partial(self._load, epoch, dense, 0)
        for group in reversed(wanted):
            pool.submit_many(read, [group], ahead=True, priority=(epoch, k))

    def _read_in_parallel(self, groups: list[int], dense: DenseColumns | None) -> None:
        """Start reading a batch's row groups that are neither held nor being read, a
        request for each run of them next to each other in a file, on pool threads
        (FETCH_THREADS at a time): on object storage a request's latency, not the link,
        bounds one reader, and a batch of a global shuffle over many files needs dozens
        of them. Only what the cache has room for (no evictions); the rest are read as
        the batch gets to them. Read-ahead of these row groups still queued is taken
        over by those runs; read-ahead already started is promoted."""
        pool, now = self._ahead.pool(), self._now()
        in_flight = set(pool.in_flight())
        pending = self._local.__dict__.setdefault("pending", {})
        read = partial(self._load, now[0], dense, threading.get_ident())
        queued = []
        for group in sorted(in_flight.intersection(groups)):
            found = pool.flight(group)
            if found is not None and pool.queued_ahead(found):
                queued.append(group)
            elif found is not None:
                pool.promote(found, now)
        with self._lock:
            missing = [g for g in groups if g not in self._cache and g not in in_flight]
            if dense is not None:
                missing = [g for g in missing if not dense.filled[g]]
            elif (sizes := self.description.sizes) is not None:
                room = self._cache.free()
                fits = np.cumsum([sizes[g] for g in missing]) <= room
                missing = [g for g, fit in zip(missing, fits, strict=True) if fit]
            else:
                missing = []
        if len(missing) < 2:
            missing = []  # one read, which brings its neighbours along (`_start`)
        # Each run of row groups next to each other in a file, one request (no byte
        # between them that no batch asked for): read-ahead of them still queued is
        # taken over, needed now.
        todo = sorted({*queued, *missing})
        while todo:
            run = [todo[0]]
            for group in todo[1:]:
                if group != run[-1] + 1:
                    break
                run.append(group)
            run = [run[0], *self.fetcher.foldable(run[0], run[1:])]
            todo = todo[len(run) :]
            futures = pool.submit_many(read, run, priority=now)
            pending.update(futures)
            pool.promote(futures[run[0]], now)  # if one began as a read-ahead meanwhile

    def _still_ahead(self, epoch: int, group: int) -> bool:
        """Whether a batch from the earliest one in progress on reads `group` (in view of
        the plan); True without a plan."""
        with self._lock:
            return self._cache.still_used(epoch, group)
