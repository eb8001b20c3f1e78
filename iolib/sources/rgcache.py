"""A row-group cache that knows the future: eviction by next use (Belady), not recency.

Why: under a global shuffle every batch touches nearly every row group, cycling through
them; LRU then evicts each one just before its next use, and a cache one row group too
small re-reads everything for every batch. The epoch plan lists every batch's row groups
ahead of time, so the cache can drop the row group needed furthest ahead (or never again
this epoch, or the next), and decline to keep a new one needed later than all it holds.
With too small a budget a global shuffle then re-reads only what does not fit, and a
block shuffle, whose row groups are used within a window, reads each once.

Time is (epoch, batch number on this rank). Without a plan (a user's sampler, process
workers that never saw it) it falls back to LRU.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import pairwise
from typing import Any

import numpy as np

_NEVER = (1 << 62, 0)
# Batches a passed-over batch stays protected for (`PlannedCache.pending`): a batch that
# never begins here (skipped under on_error="skip") stops holding the cache back then.
PENDING_SPAN = 16
# Samples a batch up to which a stretch of batches' row groups is found in one sort.
SMALL_BATCH = 128


@dataclass
class _Chunk:
    """Row-group uses of batches [lo, lo + len(by_batch)): one stretch of the future."""

    lo: int
    uses: dict[int, np.ndarray]  # row group -> sorted batch numbers that read it
    firsts: np.ndarray  # first sample of each batch, sorted
    firsts_batch: np.ndarray  # the batch number of each entry of `firsts`
    by_batch: list[np.ndarray]  # the row groups each batch reads, sorted
    first_of: np.ndarray  # first sample of batch lo + i (-1: empty batch)

    @classmethod
    def build(cls, lo: int, batches: Sequence[np.ndarray], hi: int, pairs_of: Callable) -> _Chunk:
        parts = [np.asarray(batches[k], dtype=np.int64) for k in range(lo, hi)]
        firsts = np.array([part[0] if part.size else -1 for part in parts], dtype=np.int64)
        ks, groups = _batch_group_pairs(parts, lo, pairs_of)
        bounds = np.searchsorted(ks, np.arange(lo, hi + 1)).tolist()
        by_batch = [groups[a:b] for a, b in pairwise(bounds)]
        uses: dict[int, np.ndarray] = {}
        if groups.size:
            by_group = np.lexsort((ks, groups))
            g, k = groups[by_group], ks[by_group]
            cuts = np.flatnonzero(np.diff(g)) + 1
            for part_g, part_k in zip(np.split(g, cuts), np.split(k, cuts), strict=True):
                uses[int(part_g[0])] = part_k
        by_first = np.argsort(firsts, kind="stable")
        return cls(lo, uses, firsts[by_first], by_first + lo, by_batch, firsts)


def _batch_group_pairs(
    parts: list[np.ndarray], lo: int, pairs_of: Callable
) -> tuple[np.ndarray, np.ndarray]:
    """(batch number, row group) of each row group each batch `lo + i` (samples
    `parts[i]`) reads, once each, sorted by batch then row group. Small batches (a packed
    batch's 16 windows): one sort of every pair, where a sort a batch cost ~30 us each, a
    tenth of the batch's cut. Large ones: a sort a batch, cheaper than one sort of
    millions of pairs (1.7 s against 0.4 for 2,048 batches of 4,096)."""
    numbers = np.arange(lo, lo + len(parts), dtype=np.int64)
    counts = [part.size for part in parts]
    if sum(counts) > SMALL_BATCH * len(parts):
        found = [
            np.unique(pairs_of(part, np.full(part.size, k))[1])
            for k, part in zip(numbers, parts, strict=True)
        ]
        groups = np.concatenate(found).astype(np.int64, copy=False)
        return np.repeat(numbers, [g.size for g in found]), groups
    flat = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    ks, groups = pairs_of(flat, np.repeat(numbers, counts))
    ks, groups = np.asarray(ks, dtype=np.int64), np.asarray(groups, dtype=np.int64)
    by_k = np.lexsort((groups, ks))
    ks, groups = ks[by_k], groups[by_k]
    once = np.ones(ks.size, dtype=bool)
    once[1:] = (ks[1:] != ks[:-1]) | (groups[1:] != groups[:-1])
    return ks[once], groups[once]


def _each_in_one(group_of: Callable, samples: np.ndarray, ks: np.ndarray) -> tuple:
    return ks, group_of(samples)


class EpochUses:
    """When each row group is used in one epoch on this rank, and how to tell a batch
    by its first sample (a read gets indices, not a batch number).

    Computed a stretch of `horizon` batches at a time, around the batch being read, so
    an epoch of millions of batches costs no more to plan than its next few thousand:
    the cache sees that far ahead, and treats a row group not used within it as needed
    last."""

    HORIZON = 2048  # batches per stretch; two stretches are in view

    def __init__(
        self,
        epoch: int,
        batches: Sequence[np.ndarray],
        group_of: Callable | None = None,
        horizon: int = 0,
        *,
        pairs_of: Callable | None = None,
    ) -> None:
        self.epoch, self.batches = epoch, batches
        if pairs_of is None:  # each sample in one row group
            pairs_of = partial(_each_in_one, group_of)
        self.pairs_of = pairs_of
        self.horizon = horizon or self.HORIZON
        self._chunks: dict[int, _Chunk] = {}
        self._at = 0  # the stretch of the latest batch found

    @classmethod
    def build(
        cls,
        epoch: int,
        batches: Sequence[np.ndarray],
        group_of: Callable | None = None,
        *,
        pairs_of: Callable | None = None,
    ) -> EpochUses:
        """From each batch's sample indices (`batches[k]`) and either `group_of`, the row
        group of each sample (an array in, an array out), or `pairs_of(samples,
        batch_numbers)`, (batch number, row group) pairs for samples that span several
        row groups (repeats allowed)."""
        return cls(epoch, batches, group_of, pairs_of=pairs_of)

    def __len__(self) -> int:
        return len(self.batches)

    def _chunk(self, c: int) -> _Chunk | None:
        lo = c * self.horizon
        if c < 0 or lo >= len(self.batches):
            return None
        found = self._chunks.get(c)
        if found is None:
            hi = min(lo + self.horizon, len(self.batches))
            found = self._chunks[c] = _Chunk.build(lo, self.batches, hi, self.pairs_of)
            for old in [x for x in self._chunks if x < self._at - 1 or x > self._at + 2]:
                del self._chunks[old]
        return found

    def _in_view(self, k: int) -> list[_Chunk]:
        """The stretches from batch k's to the next one."""
        c = k // self.horizon
        return [chunk for chunk in (self._chunk(c), self._chunk(c + 1)) if chunk is not None]

    def upcoming(self, start: int, batches: int) -> list[int]:
        """Row groups batches [start, start + batches) read, by first use."""
        seen: dict[int, None] = {}
        for k in range(start, min(start + batches, len(self.batches))):
            chunk = self._chunk(k // self.horizon)
            seen.update(dict.fromkeys(chunk.by_batch[k - chunk.lo].tolist()))
        return list(seen)

    def told(self, k: int, first_index: int) -> int | None:
        """`k` if batch k of the plan starts with `first_index` (the loader said which
        batch it reads; a batch replaced under on_error="skip" does not match), else
        None."""
        chunk = self._chunk(k // self.horizon) if 0 <= k < len(self.batches) else None
        if chunk is None or chunk.first_of[k - chunk.lo] != first_index:
            return None
        self._at = k // self.horizon
        return k

    def batch_of(self, first_index: int) -> int | None:
        """The batch that starts with `first_index`, searched near the last one found
        (a read by hand, or a caller that does not say which batch it reads)."""
        for c in (self._at, self._at + 1, self._at - 1, 0):
            chunk = self._chunk(c)
            if chunk is None:
                continue
            at = int(np.searchsorted(chunk.firsts, first_index))
            if at < chunk.firsts.size and chunk.firsts[at] == first_index:
                k = int(chunk.firsts_batch[at])
                self._at = k // self.horizon
                return k
        return None

    def next_use(self, group: int, after: int) -> int | None:
        """The first batch >= `after` that reads `group` within view, or None."""
        for chunk in self._in_view(after):
            ks = chunk.uses.get(group)
            if ks is None:
                continue
            at = int(np.searchsorted(ks, after))
            if at < ks.size:
                return int(ks[at])
        return None


@dataclass
class CacheCounts:
    """What the cache did (per process): the loader's stats() reports these."""

    reads: int = 0  # row groups read from storage
    rereads: int = 0  # of those, row groups already read earlier in the same epoch
    hits: int = 0
    evictions: int = 0
    declined: int = 0  # row groups read but not kept (needed later than all held)
    read_this_epoch: dict[int, set[int]] = field(default_factory=dict)


class PlannedCache:
    """Decoded row groups under a byte budget. Not thread-safe: the caller holds a lock.

    `plan(uses)` gives an epoch's future; `begin(thread, epoch, ...)` says which batch a
    thread is assembling. "Now" is the earliest batch in progress, or dealt to a thread
    that has not begun it: with thread workers, batch k+1 may begin before batch k, whose
    row groups must then stay."""

    def __init__(self, budget: int, sizeof: Callable[[Any], int]) -> None:
        self.budget, self.sizeof = budget, sizeof
        self.tables: OrderedDict[int, Any] = OrderedDict()  # recency order: LRU fallback
        self.held = 0
        self.plans: dict[int, EpochUses] = {}
        self.active: dict[int, tuple[int, int]] = {}  # thread id -> (epoch, batch)
        # The latest batch begun: "now" between batches (a read-ahead thread's puts).
        self.last: tuple[int, int] | None = None
        # Batches passed over by a thread that began a later one, not begun yet: another
        # thread holds them (at most one per other thread, see `_passed_over`).
        self.pending: set[tuple[int, int]] = set()
        self.threads: set[int] = set()  # threads that began a batch here
        self.newest: tuple[int, int] | None = None  # the latest batch begun
        self.counts = CacheCounts()

    # -- the future ----------------------------------------------------------------------
    def plan(self, uses: EpochUses) -> None:
        """Keep this epoch's plan and the previous one (its last batches may still be read
        while the loader reads the next epoch ahead)."""
        self.plans[uses.epoch] = uses
        for old in [e for e in self.plans if e < uses.epoch - 1 or e > uses.epoch]:
            del self.plans[old]
        self.counts.read_this_epoch.pop(uses.epoch, None)
        if self.last is not None and self.last[0] > uses.epoch:
            self.last = None  # an epoch run again (a new pass from a cursor)

    def begin(
        self, thread: int, epoch: int, first_index: int | None, batch: int | None = None
    ) -> int | None:
        """Mark `thread` as assembling the batch that starts with `first_index` (batch
        `batch` of the plan when the caller knows it); returns its batch number in the
        plan (None without a plan)."""
        plan, k = self.plans.get(epoch), None
        if plan is not None and first_index is not None:
            k = plan.told(batch, first_index) if batch is not None else None
            k = plan.batch_of(first_index) if k is None else k
        if k is not None:
            self.active[thread] = self.last = (epoch, k)
            self._passed_over(thread, epoch, k)
        else:
            self.active.pop(thread, None)
        return k

    def _passed_over(self, thread: int, epoch: int, k: int) -> None:
        """Note the batches just before `k` that no thread began: with T threads, up to
        T - 1 of them are dealt to the others (a process worker, one thread, sees every
        other batch of the rank and notes none)."""
        self.threads.add(thread)
        self.pending.discard((epoch, k))
        newest = self.newest
        if newest is not None and newest[0] == epoch and k > newest[1] + 1:
            lo = max(newest[1] + 1, k - (len(self.threads) - 1))
            self.pending.update((epoch, j) for j in range(lo, k))
        if newest is None or (epoch, k) > newest:
            self.newest = newest = (epoch, k)
        if self.pending:
            self.pending = {
                p for p in self.pending if p[0] == newest[0] and p[1] >= newest[1] - PENDING_SPAN
            }

    def forget_threads(self) -> None:
        """A forked worker: the parent's threads, and the batches they held, are gone."""
        self.active, self.pending, self.threads = {}, set(), set()

    def _waiting(self) -> list[tuple[int, int]]:
        """Batches in progress, and those passed over that another thread holds."""
        return [*self.active.values(), *self.pending]

    def _now(self) -> tuple[int, int] | None:
        """The earliest batch in progress or passed over; else the latest begun."""
        waiting = self._waiting()
        return min(waiting) if waiting else self.last

    def end(self, thread: int) -> None:
        done = self.active.pop(thread, None)
        if done is not None and self.last is not None and done >= self.last:
            self.last = (done[0], done[1] + 1)  # that batch no longer needs its row groups

    # -- what read-ahead asks ------------------------------------------------------------
    def upcoming(self, epoch: int, k: int, ahead: int) -> list[int] | None:
        """Row groups, by first use, of the batches from the earliest one in progress
        (whose row groups must stay) to `ahead` batches past batch k; None without a
        plan."""
        plan = self.plans.get(epoch)
        if plan is None:
            return None
        start = min([b for e, b in self._waiting() if e == epoch] + [k])
        return plan.upcoming(start, k - start + ahead + 1)

    def room_ahead(self, upcoming: list[int], sizes: Sequence[int]) -> int:
        """Bytes free for reading `upcoming` ahead: held row groups needed later give
        way, and each thread assembling a batch keeps one largest row group's room (it
        may be about to read one this count missed)."""
        needed = set(upcoming)
        room = self.budget - sum(sizes[g] for g in self.tables if g in needed)
        return room - len(self.active) * max(sizes, default=0)

    def free(self) -> int:
        """Bytes the cache can take without evicting."""
        return self.budget - self.held

    def make_room(self, size: int, until: tuple[int, int], reserved: int = 0) -> bool:
        """Evict held row groups next used after `until` ((epoch, batch): when a read
        ahead is needed), the one needed furthest ahead first, until `size` bytes fit
        beside `reserved` (reads in flight); whether they fit. A read ahead thus never
        displaces what is needed sooner than itself. False without a plan."""
        now = self._now()
        while self.held + reserved + size > self.budget:
            if now is None or not self.plans or not self.tables:
                return False
            victim, when = max(((g, self._distance(g, now)) for g in self.tables),
                               key=lambda x: x[1])  # fmt: skip
            if when <= until:
                return False
            self._evict(victim)
        return True

    def still_used(self, epoch: int, group: int) -> bool:
        """Whether a batch from the earliest one in progress on reads `group` (in view
        of the plan); True without a plan or a batch in progress."""
        plan = self.plans.get(epoch)
        now = [b for e, b in self._waiting() if e == epoch]
        if self.last is not None and self.last[0] == epoch:
            now.append(self.last[1])
        if plan is None or not now:
            return True
        return plan.next_use(group, min(now)) is not None

    def _distance(self, group: int, now: tuple[int, int]) -> tuple[int, int]:
        """When `group` is next used at or after `now` ((epoch, batch)); far future if never."""
        epoch, k = now
        for e, after in ((epoch, k), (epoch + 1, 0)):
            plan = self.plans.get(e)
            found = plan.next_use(group, after) if plan is not None else None
            if found is not None:
                return (e, found)
        return _NEVER

    # -- reads ---------------------------------------------------------------------------
    def get(self, group: int) -> Any:
        table = self.tables.get(group)
        if table is not None:
            self.tables.move_to_end(group)
            self.counts.hits += 1
        return table

    def __contains__(self, group: int) -> bool:
        return group in self.tables

    def record_read(self, group: int, epoch: int) -> bool:
        """Count a read from storage; True if it is a re-read within `epoch`."""
        seen = self.counts.read_this_epoch.setdefault(epoch, set())
        for old in [e for e in self.counts.read_this_epoch if e < epoch - 1]:
            del self.counts.read_this_epoch[old]
        again = group in seen
        seen.add(group)
        self.counts.reads += 1
        self.counts.rereads += again
        return again

    def unrecord_read(self, group: int, epoch: int) -> None:
        """Take back a read counted ahead of time that never ran (a claim let go): its
        real read later must not look like a re-read."""
        self.counts.read_this_epoch.get(epoch, set()).discard(group)
        self.counts.reads -= 1

    def put(self, group: int, table: Any, thread: int) -> bool:
        """Keep `table` if the budget allows after evicting what is needed later than it.
        Returns whether it was kept."""
        size = self.sizeof(table)
        if size > self.budget:
            self.counts.declined += 1
            return False
        planned = bool(self.plans) and (bool(self.active) or self.last is not None)
        if not planned:
            while self.held + size > self.budget and self.tables:
                self._evict(next(iter(self.tables)))  # least recently used
        else:
            now = self._now()
            # A batch's own thread holds this table for that batch: its next use is later.
            # A read-ahead thread holds it for nobody: its next use may be now.
            mine = self.active.get(thread)
            after = (mine[0], mine[1] + 1) if mine is not None else now
            incoming = self._distance(group, after)
            while self.held + size > self.budget:
                victim, when = max(
                    ((g, self._distance(g, now)) for g in self.tables), key=lambda x: x[1]
                )
                if when <= incoming:  # everything held is needed sooner: do not keep it
                    self.counts.declined += 1
                    return False
                self._evict(victim)
        self.tables[group] = table
        self.held += size
        return True

    def _evict(self, group: int) -> None:
        self.held -= self.sizeof(self.tables.pop(group))
        self.counts.evictions += 1

    def resize(self, budget: int) -> None:
        self.budget = budget
        while self.held > budget and self.tables:
            self._evict(next(iter(self.tables)))

    def stats(self) -> dict[str, int]:
        c = self.counts
        return {
            "cache_budget_bytes": self.budget,
            "cache_held_bytes": self.held,
            "row_group_reads": c.reads,
            "row_group_rereads": c.rereads,
            "cache_hits": c.hits,
            "cache_evictions": c.evictions,
            "cache_declined": c.declined,
        }
