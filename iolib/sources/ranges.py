"""Exact reads of Parquet column chunks: the bytes a batch needs, in as few ranged
requests as they allow, handed to pyarrow from memory.

Why not fsspec's buffered files: they read ahead a block past every request (1 MiB in
the throttle, 5 MiB or more in s3fs). With 2+ workers each reading every n-th row
group, the next row group's bytes belong to another worker, so half of every 1 MiB row
group's request was thrown away: on the nas profile the shared link, not the workers,
set the pace (8 threads read a 1 MiB row group every 2.1-2.3 ms; 1.6-1.7 ms with exact
reads, docs/benchmarks.md).

What the libraries already do (benchmarks/bench_ranges.py, results/ranges.md: 40 ms and
5 MB/s per request, and local disk; many small columns, a 2 MB binary column, a batch of
16 small row groups):

- `coalesce` is fsspec's `merge_offset_ranges`: the same requests and bytes in every case.
- `RangedFile` stays, against `fsspec.caching.KnownPartsOfAFile`, for what that cannot
  do, not for speed: on the store the two take the same time (ratio 1.00 in all four
  reads); on local disk ours is 0.97-1.15x its time (15% less on the 2 MB chunk, one
  copy fewer a read). KnownPartsOfAFile answers a read outside its parts with
  ValueError (strict) or zeros (its default) where ours makes the request; it serves
  only through `fs.open(cache_type="parts")`, which the local filesystem ignores (the
  bytes are read twice); it has no check of short bodies, nor of servers that ignore
  ranges (`_whole_file`).
- pyarrow's `pre_buffer` matches ours on contiguous reads, but its default
  `CacheOptions` (8 KiB holes) read every 10th of 200 columns in 20 requests, 5.7x our
  time on the store; `ParquetFile` takes no `CacheOptions`, and the dataset API that
  does reads the footer again (6-7 requests, 1.5-3.9x). It also reads on Arrow's IO
  threads through the Python file, which aborts the process at exit (parquet.py).
"""

from __future__ import annotations

import bisect
import io
import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq
from fsspec.utils import merge_offset_ranges

from iolib.base.forks import reset_after_fork
from iolib.base.redact import redact_url
from iolib.base.resources import thread_budget
from iolib.storage import ShortReadError

log = logging.getLogger(__name__)

# A gap between two wanted byte ranges up to this size is read rather than paid for with
# another request: a request costs 2 ms on nas (0.5 MB at 250 MB/s) and 50 ms on object
# storage (5 MB at 100 MB/s); 1 MiB sits between them.
HOLE_BYTES = 1 << 20
# One request reads at most this much (a batch of many small row groups is read in
# several): the bytes stay in memory until the batch is decoded.
MAX_REQUEST_BYTES = 64 << 20
# A range a batch waits for that is larger than this is read as pieces of at least
# PIECE_BYTES on parallel connections (at most MAX_PIECES), as S3 transfer managers do:
# an object store's rate per connection is a fraction of its link's (5 of 20 MB/s on
# the benchmarks' store), so one request for a 24 MB row group would leave the link 3/4
# idle. Read-ahead is never split: it fills what the needed reads leave. Pieces of 2 MiB
# rather than 4: a second needed range waits for the first's pieces to end, and what
# is left of it must still span enough connections to fill the link (a 16 MB row group
# in 3 pieces left 2 connections, half the link, for its last second).
SPLIT_ABOVE = 8 << 20
PIECE_BYTES = 2 << 20
MAX_PIECES = thread_budget().pieces
# A read in pieces waits at most this long for its pieces (a stuck connection), as a
# request does by default (`RetryPolicy.timeout_s`): then a TimeoutError, retried.
PIECES_WAIT_S = 120.0


class _PieceSlots:
    """At most MAX_PIECES pieces on the wire at once in this process, a read's pieces
    granted together in the order the reads came: the pieces of one read fill the link,
    and those of a later read start as they end. Of two row groups a batch waits for,
    the first then lands (and is decoded) while the second is still on the wire, rather
    than both landing together at the end."""

    def __init__(self) -> None:
        self._after_fork()

    def _after_fork(self) -> None:
        # Slots held by a parent's threads at the fork are free here.
        self.slots = threading.Semaphore(MAX_PIECES)
        self.order = threading.Lock()  # one read takes its slots at a time

    def take(self, timeout_s: float) -> bool:
        """A slot for one piece, waiting at most `timeout_s` (then the piece goes anyway:
        False, no slot to give back)."""
        return self.slots.acquire(timeout=timeout_s)


_PIECES = _PieceSlots()
reset_after_fork(_PIECES)


Span = tuple[int, int]


def column_spans(group: pq.RowGroupMetaData) -> dict[str, tuple[Span, ...]]:
    """The byte ranges [start, end) of a row group's column chunks by top-level column
    (a nested column has one per leaf), as pyarrow reads them: from the dictionary page
    when there is one. Read once per file with the footer: the metadata objects cost
    Python work a batch should not pay again."""
    spans: dict[str, list[Span]] = {}
    for j in range(group.num_columns):
        chunk = group.column(j)
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
            start = chunk.dictionary_page_offset
        name = chunk.path_in_schema.split(".")[0]
        spans.setdefault(name, []).append((start, start + chunk.total_compressed_size))
    return {name: tuple(ranges) for name, ranges in spans.items()}


def pieces(spans: Sequence[Span], above: int, piece: int, most: int) -> list[Span]:
    """`spans` with each one larger than `above` bytes cut into contiguous pieces of at
    least `piece` bytes (at most `most` of them, about equal), in order."""
    out: list[Span] = []
    for start, end in spans:
        size = end - start
        count = max(1, min(most, size // piece)) if size > above else 1
        cuts = [start + size * i // count for i in range(count)] + [end]
        out += list(itertools.pairwise(cuts))
    return out


def coalesce(
    spans: Sequence[Span], hole: int = HOLE_BYTES, limit: int = MAX_REQUEST_BYTES
) -> list[Span]:
    """Merge ranges whose gap is at most `hole` bytes, into requests of at most `limit`
    bytes (a single range larger than that stays whole), sorted by start: fsspec's
    `merge_offset_ranges` for the ranges of one file."""
    if not spans:
        return []
    _, starts, ends = merge_offset_ranges(
        [""] * len(spans),
        [start for start, _ in spans],
        [end for _, end in spans],
        max_gap=hole,
        max_block=limit,
    )
    return list(zip(starts, ends, strict=True))  # type: ignore[arg-type]  # no end is None


class RangedFile(io.RawIOBase):
    """A read-only file of `size` bytes that serves reads from ranges loaded beforehand
    (`load`), one request per range; a read outside them is one request of its own.

    One per thread and file: pyarrow seeks and reads it from the thread that decodes.
    `timeout_s`: how long a read in parallel pieces waits for them (None: PIECES_WAIT_S)."""

    _warned_ranges = False  # once per process: a server that ignores Range headers

    def __init__(self, fs: Any, path: str, size: int, timeout_s: float | None = None) -> None:
        super().__init__()
        self.fs, self.path, self.size = fs, path, size
        self.timeout_s = PIECES_WAIT_S if timeout_s is None else timeout_s
        self._pos = 0
        self._starts: list[int] = []
        self._blocks: list[memoryview] = []
        self.requests = 0  # for tests: how many requests this file made
        self.fetched_bytes = 0  # every byte the requests returned, holes included

    def load(self, spans: Sequence[Span], *, split: bool = False) -> None:
        """Hold the bytes of `spans` (already coalesced), reading those not held yet.
        `split`: a batch waits for them, so a large range is read as pieces on parallel
        connections (`SPLIT_ABOVE`)."""
        missing = [(a, b) for a, b in spans if self._block_at(a, b) is None]
        if not missing:
            return
        requests = pieces(missing, SPLIT_ABOVE, PIECE_BYTES, MAX_PIECES) if split else missing
        if len(requests) == 1:
            ((start, end),) = requests
            datas = [self.fs.cat_file(self.path, start=start, end=end)]
        elif len(requests) > len(missing):
            datas = _read_in_parallel(self.fs, self.path, requests, self.timeout_s)
        else:  # asynchronous filesystems (s3fs, gcsfs) make these requests concurrently
            paths = [self.path] * len(requests)
            starts, ends = [a for a, _ in requests], [b for _, b in requests]
            datas = self.fs.cat_ranges(paths, starts, ends, on_error="raise")
        self.requests += len(requests)
        self.fetched_bytes += sum(len(data) for data in datas)
        if len(requests) > len(missing):
            datas = self._joined(missing, requests, datas)
        for (start, end), data in zip(missing, datas, strict=True):
            self._check_length(start, end, data)
            if len(data) > min(end, self.size) - start:
                start, data = self._whole_file(start, end, data)
                if self._block_at(start, start + len(data)) is not None:
                    continue  # the whole file is held already
            at = bisect.bisect_left(self._starts, start)
            self._starts.insert(at, start)
            self._blocks.insert(at, memoryview(data))

    def _joined(self, missing: list[Span], requests: list[Span], datas: list) -> list:
        """The pieces' bytes put back together, one block per range of `missing`; a
        piece longer than asked for (a server that ignores ranges) stands for the range."""
        joined, at = [], 0
        for _, end in missing:
            parts = []
            while at < len(requests) and requests[at][1] <= end:
                (a, b), data = requests[at], datas[at]
                self._check_length(a, b, data)
                parts.append(data)
                at += 1
            longer = [p for p, (a, b) in zip(parts, requests[at - len(parts) : at], strict=True)
                      if len(p) > min(b, self.size) - a]  # fmt: skip
            joined.append(longer[0] if longer else b"".join(parts))
        return joined

    def _whole_file(self, start: int, end: int, data: bytes) -> tuple[int, bytes]:
        """A response longer than the range asked for: the server ignored the Range
        header (Python's http.server, some proxies) and sent the whole file, status 200.
        Keep it whole, from offset 0, so later ranges need no request; anything else that
        is not the requested range is read again, in full."""
        if len(data) != self.size:
            data = self.fs.cat_file(self.path)
            self.requests += 1
            self.fetched_bytes += len(data)
            if len(data) != self.size:
                raise ShortReadError(
                    f"read of {self.path} returned {len(data)} bytes where its footer says "
                    f"{self.size}: the file changed while it was read, or the server sends "
                    "something else than the requested bytes"
                )
        if not self._warned_ranges:
            log.warning(
                "%s: the server ignored a range request [%d:%d] and sent the whole file "
                "(%d bytes); iolib reads whole files from it.",
                redact_url(self.path),
                start,
                end,
                self.size,
            )
            RangedFile._warned_ranges = True
        return 0, data

    @property
    def held_bytes(self) -> int:
        """Bytes loaded and not yet released."""
        return sum(len(block) for block in self._blocks)

    def release(self) -> None:
        """Drop the loaded bytes (what pyarrow decoded from them keeps its own reference)."""
        self._starts, self._blocks = [], []

    def _block_at(self, start: int, end: int) -> memoryview | None:
        """The bytes [start, end) from a loaded range that holds all of them, else None."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0 or end > self._starts[i] + len(self._blocks[i]):
            return None
        offset = start - self._starts[i]
        return self._blocks[i][offset : offset + end - start]

    def _check_length(self, start: int, end: int, data: bytes) -> None:
        expected = max(0, min(end, self.size) - start)
        if len(data) < expected:
            # A body shorter than asked for (a connection closed early): transient and
            # retried, never short bytes handed to the decoder.
            raise ShortReadError(
                f"read of {self.path} [{start}:{end}] returned {len(data)} of {expected} "
                "bytes (connection closed early)"
            )

    # -- the file protocol pyarrow uses ----------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = base + offset
        return self._pos

    def read(self, n: int | None = -1) -> bytes | memoryview:  # type: ignore[override]
        end = self.size if n is None or n < 0 else min(self._pos + n, self.size)
        if end <= self._pos:
            return b""
        data = self._block_at(self._pos, end)
        if data is None:
            self.load([(self._pos, end)])
            data = self._block_at(self._pos, end)
            assert data is not None  # load() holds exactly this range, or the whole file
        self._pos = end
        return data


def _read_in_parallel(
    fs: Any, path: str, requests: list[Span], timeout_s: float = PIECES_WAIT_S
) -> list[bytes]:
    """Each range of `path` on its own connection, each started once it has a slot
    (`_PieceSlots`), on short-lived threads (daemons: none holds up an exit). The caller
    waits for them at most `timeout_s` in all (TimeoutError: a stuck connection, retried)
    and no longer than the first error (raised at once: the other pieces are not
    wanted); pieces still without a slot after a quarter of that go without one."""
    datas: list[Any] = [None] * len(requests)
    errors: list[BaseException] = []
    left = [len(requests)]  # pieces not ended yet
    ended = threading.Condition()
    deadline = time.monotonic() + timeout_s

    def read(i: int, slot: bool) -> None:
        try:
            datas[i] = fs.cat_file(path, start=requests[i][0], end=requests[i][1])
        except BaseException as exc:  # raised on the caller's thread below
            with ended:
                errors.append(exc)
                ended.notify_all()
        finally:
            if slot:
                _PIECES.slots.release()
            with ended:
                left[0] -= 1
                ended.notify_all()

    give_up = time.monotonic() + timeout_s / 4  # on slots held by stuck connections
    with _PIECES.order:
        for i in range(len(requests)):
            slot = _PIECES.take(max(0.0, give_up - time.monotonic()))
            threading.Thread(target=read, args=(i, slot), name="iolib-piece", daemon=True).start()
    with ended:
        wait = max(0.0, deadline - time.monotonic())
        if not ended.wait_for(lambda: errors or not left[0], timeout=wait):
            raise TimeoutError(
                f"read of {redact_url(path)}: {left[0]} of {len(requests)} pieces still "
                f"running after {timeout_s:g} s"
            )
    if errors:
        raise errors[0]
    return datas
