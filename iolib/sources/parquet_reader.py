"""A worker's reads of a Parquet description: `ParquetReader`.

Each worker (a process, or the process whose threads share it) builds one from the
description on first use; it holds what must not travel: the row-group cache (sized in
decoded Arrow bytes, evicted by next use in the epoch plan: `iolib.sources.rgcache`),
the reads in flight (threads that miss the same row group share one read), the
read-ahead and fetch threads, the dense in-memory store (`iolib.sources.dense`), the
open files (`iolib.sources.parquet_fetch`) and the counters. A batch's indices are
grouped by row group; each row group is read once, and rows are taken from the Arrow
tables without Python per-row work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
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
# One logger for the Parquet source, whichever of its modules speaks.
log = logging.getLogger("iolib.sources.parquet")


class _Flight:
    """One row-group read that other threads wait on. `owner`: the thread that claimed
    it for later (its bytes come with an earlier request of that thread's batch), which
    leads it when its batch gets there; None when whoever made it leads it at once."""

    def __init__(self, owner: int | None = None) -> None:
        self.done = threading.Event()
        self.table: pa.Table | None = None
        self.error: BaseException | None = None
        self.owner = owner
        self.led = owner is None


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
        self._local = threading.local()  # this thread's epoch and batch's row groups
        self._in_flight: dict[int, _Flight] = {}
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
        self._in_flight = {}
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
        if not indices.size:
            return False
        groups = np.unique(np.searchsorted(self.description.row_starts, indices, side="right") - 1)
        dense = self._dense
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
        """Drop this thread's loaded bytes and claims once a batch is decoded."""
        self._let_go_of_claims()
        self.fetcher.release()
        self._local.wanted = ()

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

    def fetch_row_group(self, group: int, *, needed: bool = False) -> pa.Table:
        """Row group `group` from storage with retries and counted, bypassing the cache."""
        try:
            return self.fetcher.fetch(group, transient=True, needed=needed)
        finally:
            self.release()

    def _row_group(
        self, group: int, dense: DenseColumns | None = None, *, wait: bool = True
    ) -> pa.Table | None:
        """A row group from the cache, else from storage. Threads that miss the same row
        group at once share one read (the first reads, the others wait for it; with
        `wait` False, None instead of waiting).

        With `dense`, the reader copies the row group into that store before the others
        are let go, and it is not cached; None when the store already holds it (another
        thread filled it since this one looked)."""
        with self._lock:
            if dense is not None and dense.filled[group]:
                return None
            cached = self._cache.get(group)
            if cached is not None:
                return cached
            flight = self._in_flight.get(group)
            if flight is None:
                leader, flight = True, _Flight()
                self._in_flight[group] = flight
                self._count_read(group)
            else:  # this thread's own claim: lead it now (others wait for it)
                leader = not flight.led and flight.owner == threading.get_ident()
                flight.led = flight.led or leader
        if not leader:
            if not wait:
                return None
            flight.done.wait()  # set by its leader (success or error) or when cancelled
            if flight.error is not None:
                raise flight.error
            if flight.table is None:  # a claim let go unread (its request failed): read it
                return self._row_group(group, dense)
            return flight.table
        if self._local.__dict__.get("ahead"):
            return self._lead(group, flight, dense)
        with self._ahead.pool().needing():  # a batch waits on it: no read-ahead starts
            return self._lead(group, flight, dense)

    def _lead(self, group: int, flight: _Flight, dense: DenseColumns | None) -> pa.Table:
        """Read `group` for everyone waiting on `flight` (claimed by this thread or for it),
        then cache it and let them go."""
        try:
            table = self._fetch(group, dense)
            if dense is not None:
                dense.fill(group, table)  # unfilled if it holds a null: the caller checks
            flight.table = table
            return table
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                if dense is None and flight.table is not None:
                    self._cache.put(group, flight.table, threading.get_ident())
                if flight.error is not None:
                    self._failed_groups.add(group)
                del self._in_flight[group]
            flight.done.set()

    def _fetch(self, group: int, dense: DenseColumns | None) -> pa.Table:
        """`group` from storage, with the batch's later row groups that no thread holds
        or reads in the same request (`RowGroupFetcher.spans`). Those are claimed for
        this thread, which reads them from the loaded bytes when its batch gets there: a
        thread that needs one meanwhile waits instead of reading it again. No wait can
        close a cycle: a batch takes its row groups in ascending order, and claims only
        row groups above the one it reads."""
        me = threading.get_ident()
        with self._lock:
            later = [
                g
                for g in sorted(getattr(self._local, "wanted", ()))
                if g > group
                and g not in self._cache
                and g not in self._in_flight
                and (dense is None or not dense.filled[g])
            ]
            for g in later:
                self._in_flight[g] = _Flight(owner=me)
                self._count_read(g)
        self._local.__dict__.setdefault("claims", set()).update(later)
        needed = not self._local.__dict__.get("ahead")  # a batch waits for it
        return self.fetcher.fetch(group, later, needed=needed)

    def _let_go_of_claims(self) -> None:
        """Claims this thread did not lead (its batch failed or stopped early): unread,
        so a thread waiting on one reads it itself."""
        claims = self._local.__dict__.get("claims")
        if not claims:
            return
        me, freed = threading.get_ident(), []
        with self._lock:
            for group in claims:
                flight = self._in_flight.get(group)
                if flight is not None and flight.owner == me and not flight.led:
                    del self._in_flight[group]
                    freed.append(flight)
                    # Counted as read when claimed: uncount it, or its real read later
                    # would look like a re-read (and blame the cache for it).
                    self._cache.unrecord_read(group, getattr(self._local, "epoch", 0))
        claims.clear()
        for flight in freed:
            flight.done.set()

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
            wanted = []
            for group in upcoming:
                if group in self._cache or (dense is not None and dense.filled[group]):
                    continue
                room -= sizes[group]
                if dense is None and room < 0:
                    break
                if (epoch, group) in self._ahead_sent or group in self._in_flight:
                    continue
                wanted.append(group)
                self._ahead_sent.add((epoch, group))
            self._ahead_sent = {(e, g) for e, g in self._ahead_sent if e >= epoch - 1}
            if not wanted:
                return
        pool = self._ahead.pool()
        for group in reversed(wanted):
            read = partial(self._read_one_ahead, epoch, group, dense)
            pool.submit(read, ahead=True, priority=(epoch, k))

    def _read_in_parallel(self, groups: list[int], dense: DenseColumns | None) -> None:
        """Start reading all but the first of a batch's row groups that are neither held
        nor being read, FETCH_THREADS at a time: on object storage a request's latency,
        not the link, bounds one reader, and a batch of a global shuffle over many files
        needs dozens of them. The batch's own thread reads the first and then takes the
        others over (shared reads: `_row_group`)."""
        with self._lock:
            missing = [g for g in groups if g not in self._cache and g not in self._in_flight]
            if dense is not None:
                missing = [g for g in missing if not dense.filled[g]]
            elif (sizes := self.description.sizes) is not None:
                # Only what the cache has room for: no evictions.
                room = self._cache.free()
                fits = np.cumsum([sizes[g] for g in missing]) <= room
                missing = [g for g, fit in zip(missing, fits, strict=True) if fit]
            else:
                missing = []
            if len(missing) < 2:
                return
            # Claimed now, not when a pool thread starts: else the batch's own thread may
            # take them into its first request too (read twice, 2.0x the bytes once).
            claims = {}
            for group in missing[1:]:
                claims[group] = self._in_flight[group] = _Flight()
                self._count_read(group)
        epoch, pool = getattr(self._local, "epoch", 0), self._ahead.pool()
        now = (epoch, getattr(self._local, "batch", 0))  # the batch waited on first
        for group, flight in claims.items():
            read = pool.submit(partial(self._read_claimed, epoch, group, flight, dense),
                               priority=now)  # fmt: skip
            read.add_done_callback(partial(self._drop_if_cancelled, group, flight))

    def _drop_if_cancelled(self, group: int, flight: _Flight, read: Future) -> None:
        """A claimed read that close() cancelled before it ran: its waiters are let go
        (and read the row group themselves) instead of waiting for ever."""
        if not read.cancelled():
            return
        with self._lock:
            if self._in_flight.get(group) is flight:
                del self._in_flight[group]
        flight.done.set()

    def _read_one_ahead(self, epoch: int, group: int, dense: DenseColumns | None) -> None:
        """One read ahead of need. A failure is left to the batch that needs the row
        group: it reads it again, with retries, and reports the error with its batch."""
        self._local.epoch, self._local.ahead = epoch, True
        if not self._still_ahead(epoch, group):
            return  # waited behind needed reads until its batches passed: not wanted now
        try:
            # Never waits on another thread's read: at exit the interpreter joins this
            # thread while dropping the fetch pool's queued reads, which would never end.
            self._row_group(group, dense=dense, wait=False)
        except Exception:  # reported by the batch that needs it
            pass
        finally:
            self.release()

    def _still_ahead(self, epoch: int, group: int) -> bool:
        """Whether a batch from the earliest one in progress on reads `group` (in view of
        the plan); True without a plan."""
        with self._lock:
            return self._cache.still_used(epoch, group)

    def _read_claimed(
        self, epoch: int, group: int, flight: _Flight, dense: DenseColumns | None
    ) -> None:
        """A batch's row group read by a pool thread. A failure reaches the batch, which
        reports it (after the retries the read already made)."""
        self._local.epoch, self._local.ahead = epoch, False
        try:
            self._lead(group, flight, dense)
        except Exception:  # raised to the batch waiting on the flight
            pass
        finally:
            self.release()
