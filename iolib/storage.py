"""fsspec filesystems for every read iolib makes: URL resolution and retries.

Why one place: sources, the benchmark and the cache all open files the same way, so
retries, throttling and fault injection wrap one function rather than many.
Filesystem objects are never carried across processes: workers get (url, options)
and open their own.
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import hashlib
import logging
import math
import os
import queue
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, ClassVar, TypeVar

import fsspec
from fsspec.implementations.cached import SimpleCacheFileSystem
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.spec import AbstractBufferedFile

from iolib.errors import ConfigError, DataError

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that a second attempt cannot fix: the object is not there, or its bytes are wrong.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    ValueError,
    TypeError,
    DataError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried, and when a request counts as stuck.

    attempts: total tries per request (default 5); more hides longer outages but delays
        the error a user waits for.
    base_delay_s: first backoff (default 0.05 s), doubled each try, with full jitter.
    max_delay_s: cap on one backoff (default 2 s).
    timeout_s: a request (one row-group read, one batch of image reads) still running
        after this many seconds is abandoned as stuck and retried; None = wait forever.
        Default 120 s: a stuck read fails within about attempts x (timeout_s + max_delay_s).
        Raise it for very large row groups on slow links. The abandoned request's thread
        cannot be stopped; it ends when the request does.
    """

    attempts: int = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    timeout_s: float | None = 120.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"`attempts` must be at least 1. Found: {self.attempts}.")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(
                "`timeout_s` must be a positive number of seconds or None. "
                f"Found: {self.timeout_s!r}."
            )


def open_filesystem(
    url: str, storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve `url` to (filesystem, path), with a message naming the package to install."""
    try:
        fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as exc:
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        hint = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
        package = hint.get(protocol, f"the fsspec backend for '{protocol}'")
        raise ConfigError(
            f"Cannot open {url!r}: the '{protocol}' protocol needs {package}. "
            f"Install it: pip install {package}. ({exc})"
        ) from exc
    return fs, path


def call_with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
    seed: int | None = None,
    redact: Callable[[str], str] = str,
) -> T:
    """Call `fn`; retry transient errors with exponential backoff and full jitter.

    Permanent errors (missing object, bad bytes) raise at once. A call that runs past
    `policy.timeout_s` counts as a transient TimeoutError. After the last attempt the error
    is re-raised as an OSError that names `what` and the attempts made; `redact` cleans
    the text of the underlying error (credentials) before it is shown or logged.
    """
    policy = policy or RetryPolicy()
    jitter = random.Random(seed)  # only the pace depends on it, never the data
    for attempt in range(1, policy.attempts + 1):
        try:
            return _with_timeout(fn, policy.timeout_s, what)
        except PERMANENT_ERRORS as exc:
            if isinstance(exc, (DataError, ConfigError)):
                raise  # ours: already names the file and the fix
            raise _permanent(exc, what, attempt, redact) from (
                exc if redact(str(exc)) == str(exc) else None
            )
        except Exception as exc:
            reason = redact(f"{type(exc).__name__}: {exc}")
            if attempt == policy.attempts:
                raise OSError(
                    f"{what}: failed after {attempt} attempts; last error: {reason}"
                ) from (exc if redact(str(exc)) == str(exc) else None)
            _counters().retries += 1
            if on_retry is not None:
                on_retry(exc)
            delay = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1))
            log.debug("retrying %s after %s (attempt %d)", what, reason, attempt)
            time.sleep(jitter.uniform(0, delay))
    raise AssertionError("unreachable")  # pragma: no cover


def _permanent(
    exc: BaseException, what: str, attempt: int, redact: Callable[[str], str]
) -> BaseException:
    """The same error type, with a message naming `what` and the attempts made."""
    text = (
        f"{what}: failed on attempt {attempt} with a permanent error (not retried): "
        f"{redact(f'{type(exc).__name__}: {exc}')}"
    )
    try:
        return type(exc)(text)
    except Exception:  # an exception type with other constructor arguments
        return OSError(text)


class _Helper:
    """One thread that runs a worker's storage calls, so a stuck call can be abandoned.

    Each calling thread keeps its own helper (thread-local), so per-thread state of the
    callee (open Parquet handles) is reused across calls. A helper whose call timed out
    is retired: it exits when that call returns, and the caller gets a fresh helper."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.owner = threading.current_thread()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.retired = False
        self.thread = threading.Thread(target=self._run, name="iolib-io", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.retired:
            try:
                fn, box, done = self.jobs.get(timeout=_HELPER_IDLE_S)
            except queue.Empty:
                if not self.owner.is_alive():  # its worker is gone: so is the helper
                    return
                continue
            if fn is None:
                return
            with _BUSY_LOCK:
                _BUSY.add(self)
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller, never lost
                box.append((False, exc))
            finally:
                with _BUSY_LOCK:
                    _BUSY.discard(self)
            done.set()

    def alive(self) -> bool:
        return self.pid == os.getpid() and not self.retired and self.thread.is_alive()


_HELPERS = threading.local()
_BUSY: set[_Helper] = set()  # helpers inside a call (an abandoned stuck one included)
_BUSY_LOCK = threading.Lock()
_EXIT_WAIT_S = 10.0


@atexit.register
def _wait_for_busy_helpers() -> None:
    """At exit, give calls still running (a timed-out read) a bounded time to return:
    a daemon thread inside pyarrow or a C client while the interpreter finalizes can
    crash it."""
    deadline = time.monotonic() + _EXIT_WAIT_S
    with _BUSY_LOCK:
        busy = list(_BUSY)
    for helper in busy:
        helper.thread.join(max(0.0, deadline - time.monotonic()))


_HELPER_IDLE_S = 0.5  # how often an idle helper checks that its caller still exists


def _with_timeout(fn: Callable[[], T], timeout_s: float | None, what: str) -> T:
    if timeout_s is None:
        return fn()
    helper = getattr(_HELPERS, "helper", None)
    if helper is None or not helper.alive():  # first call, or forked into a new process
        helper = _HELPERS.helper = _Helper()
    box: list[tuple[bool, Any]] = []
    done = threading.Event()
    helper.jobs.put((fn, box, done))
    if not done.wait(timeout_s):
        helper.retired = True
        helper.jobs.put((None, None, None))  # lets it exit once the stuck call returns
        _HELPERS.helper = None
        raise TimeoutError(f"no answer within {timeout_s:g} s (RetryPolicy.timeout_s)")
    ok, value = box.pop()
    if ok:
        return value
    try:
        raise value
    finally:
        del value  # else error -> traceback -> this frame -> error: a cycle kept until GC


class IOCounters(threading.local):
    """Per-thread I/O counts: a worker takes them after each batch, so the figures reach
    the consumer exactly, from threads and processes alike."""

    bytes_read: int = 0
    retries: int = 0


_COUNTERS = IOCounters()


def _counters() -> IOCounters:
    return _COUNTERS


def count_bytes(n: int) -> None:
    """Record `n` bytes read from storage by the current thread."""
    _COUNTERS.bytes_read += n


def take_counters() -> tuple[int, int]:
    """(bytes read, retries) by the current thread since the last call; resets them."""
    taken = (_COUNTERS.bytes_read, _COUNTERS.retries)
    _COUNTERS.bytes_read = _COUNTERS.retries = 0
    return taken


# --------------------------------------------------------------------------------------
# Wrappers for benchmarks and tests: throttled (latency, bandwidth, jitter) and faulty.
# Both are fsspec filesystems reachable from a chained URL plus storage_options, so a
# worker that opens (url, storage_options) gets them with no other change:
#   open_filesystem("throttled::file:///data/x.parquet",
#                   {"throttled": {"profile": "object-store", "seed": 0}})
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThrottleProfile:
    """What one simulated storage request costs.

    latency_ms: median time to first byte of every request (reads, info, ls); default 0.
    bandwidth_mbps: per-request stream rate in MB/s (10**6 bytes/s); 0 = unlimited.
    jitter: sigma of a lognormal factor on the latency (0 = fixed; 0.5 puts p99 ~3.2x the
        median). Draws are a pure function of (seed, path, byte range, repeat), so a
        rerun sees the same latencies whatever the thread timing.
    total_bandwidth_mbps: one link shared by all requests of this process, MB/s;
        0 = unlimited (each stream gets `bandwidth_mbps`).
    """

    latency_ms: float = 0.0
    bandwidth_mbps: float = 0.0
    jitter: float = 0.0
    total_bandwidth_mbps: float = 0.0

    def __post_init__(self) -> None:
        for name in ("latency_ms", "bandwidth_mbps", "jitter", "total_bandwidth_mbps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"`{name}` must be a number >= 0. Found: {value!r}.")


# Documented in docs/benchmarks.md. Sources: NVMe datasheets (~100 us, GB/s); NFS/SMB
# over 10 GbE (~1-3 ms, a few hundred MB/s per stream, ~1 GB/s link); S3 in-region
# (first byte 30-80 ms with a heavy tail, ~100 MB/s per connection, scales with connections).
PROFILES: dict[str, ThrottleProfile] = {
    "nvme": ThrottleProfile(
        latency_ms=0.1, bandwidth_mbps=2000, jitter=0.1, total_bandwidth_mbps=3000
    ),
    "nas": ThrottleProfile(
        latency_ms=2.0, bandwidth_mbps=250, jitter=0.3, total_bandwidth_mbps=1000
    ),
    "object-store": ThrottleProfile(latency_ms=50.0, bandwidth_mbps=100, jitter=0.5),
}


def _unit(seed: int, *key: object) -> float:
    """A uniform draw in (0, 1) that is a pure function of (seed, key)."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") + 0.5) / 2.0**64


class _WrapperFileSystem(ChainedFileSystem):
    """Forwards every call to a target filesystem, calling `_request` around each read.

    Subclasses decide what a request costs (`_request`) and may alter returned bytes
    (`_result`). Writes pass through untouched, so tests can create data through it.
    """

    protocol: ClassVar[str] = "wrapper"

    def __init__(
        self,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        fo: str | None = None,  # the path, passed by url_to_fs; unused
        seed: int = 0,
        block_size: int = 1 << 20,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if fs is None:
            fs = fsspec.filesystem(target_protocol or "file", **(target_options or {}))
        self.fs = fs
        self.seed = int(seed)
        self.blocksize = int(block_size)
        self._counts: dict[tuple, int] = {}
        self._lock = threading.Lock()

    # -- hooks -------------------------------------------------------------------------
    def _request(self, kind: str, path: str, start: int | None, end: int | None) -> Any:
        """Called before a request; returns a token handed to `_after`."""
        return None

    def _after(self, token: Any, data: bytes | None) -> bytes | None:
        return data

    def _repeat(self, key: tuple) -> int:
        """How many times this exact request was made before (for seeded draws)."""
        with self._lock:
            n = self._counts.get(key, 0)
            self._counts[key] = n + 1
        return n

    def _call(self, kind: str, path: str, fn: Callable[[], T], start=None, end=None) -> T:
        token = self._request(kind, path, start, end)
        result = fn()
        if isinstance(result, bytes):
            return self._after(token, result)  # type: ignore[return-value]
        self._after(token, None)
        return result

    # -- forwarded API -----------------------------------------------------------------
    def _strip(self, path: str) -> str:
        return self.fs._strip_protocol(self._strip_protocol(path))

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip(path)
        return self._call(
            "read", path, lambda: self.fs.cat_file(path, start=start, end=end, **kwargs), start, end
        )

    def info(self, path, **kwargs):
        path = self._strip(path)
        return self._call("meta", path, lambda: self.fs.info(path, **kwargs))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip(path)
        return self._call("meta", path, lambda: self.fs.ls(path, detail=detail, **kwargs))

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        path = self._strip(path)
        return self._call(
            "meta",
            path,
            lambda: self.fs.find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail),
        )

    def glob(self, path, maxdepth=None, **kwargs):
        path = self._strip(path)
        return self._call("meta", path, lambda: self.fs.glob(path, maxdepth=maxdepth, **kwargs))

    def modified(self, path):
        return self.fs.modified(self._strip(path))

    def ukey(self, path):
        return self.fs.ukey(self._strip(path))

    def pipe_file(self, path, value, **kwargs):
        return self.fs.pipe_file(self._strip(path), value, **kwargs)

    def mkdir(self, path, create_parents=True, **kwargs):
        return self.fs.mkdir(self._strip(path), create_parents=create_parents, **kwargs)

    def makedirs(self, path, exist_ok=False):
        return self.fs.makedirs(self._strip(path), exist_ok=exist_ok)

    def rm_file(self, path):
        return self.fs.rm_file(self._strip(path))

    def rm(self, path, recursive=False, maxdepth=None):
        return self.fs.rm(self._strip(path), recursive=recursive, maxdepth=maxdepth)

    def put_file(self, lpath, rpath, **kwargs):
        return self.fs.put_file(lpath, self._strip(rpath), **kwargs)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kw):
        path = self._strip(path)
        if "r" not in mode:
            return self.fs.open(path, mode, **kw)
        return _WrappedFile(
            self,
            path,
            mode,
            block_size=block_size or self.blocksize,
            cache_type=kw.get("cache_type", "readahead"),
            cache_options=cache_options,
            size=kw.get("size"),
        )


class _WrappedFile(AbstractBufferedFile):
    """A buffered read-only file: each block fetch is one request of the wrapper.

    fsspec's readahead cache calls back `self._fetch_range`, a bound method: file and
    cache would form a reference cycle, so a file dropped without `close()` (a reader
    discarded after a failed read, the handles of a worker thread that ended) kept its
    1-3 MiB readahead block until a full garbage collection, which a steady loader
    rarely triggers (measured: RSS +66 MiB/min in the soak). The cache gets a fetcher
    that does not refer to the file, so the file and its block go when the last
    reference does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cache.fetcher = _RangeFetcher(self.fs, self.path, self.size)

    def _fetch_range(self, start: int, end: int) -> bytes:
        return _RangeFetcher(self.fs, self.path, self.size)(start, end)


@dataclass(frozen=True)
class _RangeFetcher:
    """One ranged read of `path` through the wrapper `fs`, checked for short bodies."""

    fs: fsspec.AbstractFileSystem
    path: str
    size: int

    def __call__(self, start: int, end: int) -> bytes:
        data = self.fs.cat_file(self.path, start=start, end=end)
        expected = max(0, min(end, self.size) - start)
        if len(data) < expected:
            # What an HTTP client does on a body shorter than its Content-Length: a
            # transient error (retried), never short bytes handed to a parser.
            raise ShortReadError(
                f"read of {self.path} [{start}:{end}] returned {len(data)} of {expected} bytes "
                "(connection closed early)"
            )
        return data


class ShortReadError(ConnectionError):
    """A ranged read returned fewer bytes than asked for: transient, retried."""


class ThrottledFileSystem(_WrapperFileSystem):
    """Make any fsspec filesystem behave like slower storage, reproducibly.

    Each request (a ranged read, an info or a listing) takes at least
    `latency * lognormal(jitter) + bytes / bandwidth`, and, with `total_bandwidth_mbps`,
    shares one link with every other request of the process. Reads are buffered in
    blocks of `block_size` bytes (default 1 MiB, readahead) like s3fs, so a reader that
    asks for a 10 MB column chunk makes one request and a reader of 4 KB samples makes one
    request per sample.

    Example::

        fs, path = open_filesystem(
            "throttled::file:///data/train.parquet",
            {"throttled": {"profile": "object-store", "seed": 0}},
        )
    """

    protocol: ClassVar[str] = "throttled"

    def __init__(
        self,
        profile: str | None = None,
        latency_ms: float | None = None,
        bandwidth_mbps: float | None = None,
        jitter: float | None = None,
        total_bandwidth_mbps: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.profile = resolve_profile(
            profile,
            latency_ms=latency_ms,
            bandwidth_mbps=bandwidth_mbps,
            jitter=jitter,
            total_bandwidth_mbps=total_bandwidth_mbps,
        )
        self._link_free_at = 0.0  # virtual clock of the shared link
        self.requests = 0
        self.bytes_read = 0

    def _request(self, kind, path, start, end):
        key = (kind, path, start, end)
        n = self._repeat(key)
        p = self.profile
        latency = p.latency_ms / 1000.0
        if p.jitter > 0 and latency > 0:
            z = NormalDist().inv_cdf(_unit(self.seed, *key, n))
            latency *= math.exp(p.jitter * z)
        return time.perf_counter(), latency

    def _after(self, token, data):
        started, latency = token
        nbytes = len(data) if data is not None else 0
        p = self.profile
        finish = started + latency
        if p.bandwidth_mbps > 0:
            finish += nbytes / (p.bandwidth_mbps * 1e6)
        if p.total_bandwidth_mbps > 0 and nbytes:
            with self._lock:
                begin = max(started + latency, self._link_free_at)
                self._link_free_at = begin + nbytes / (p.total_bandwidth_mbps * 1e6)
                finish = max(finish, self._link_free_at)
        with self._lock:
            self.requests += 1
            self.bytes_read += nbytes
        delay = finish - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return data


def resolve_profile(name: str | None = None, **overrides: float | None) -> ThrottleProfile:
    """A preset (`nvme`, `nas`, `object-store`) or zeros, with any non-None overrides."""
    if name is not None and name not in PROFILES:
        raise ConfigError(
            f"Unknown throttle profile {name!r}. Use one of: {', '.join(sorted(PROFILES))}, "
            "or give latency_ms / bandwidth_mbps / jitter."
        )
    base = PROFILES[name] if name else ThrottleProfile()
    changes = {k: float(v) for k, v in overrides.items() if v is not None}
    return replace(base, **changes)


class FaultyFileSystem(_WrapperFileSystem):
    """Inject seeded storage faults in front of any fsspec filesystem.

    error_rate: probability that a request raises ConnectionResetError (transient: a
        retry of the same request draws again).
    slow_rate, slow_ms: probability that a request first sleeps `slow_ms`.
    truncate_rate: probability that a read returns only its first half (a connection
        closed early). Files opened through a wrapper notice the short read and raise a
        transient ShortReadError (as HTTP clients do from Content-Length); a bare
        `cat_file` hands the short bytes on, for testing parsers.
    missing: glob patterns (fnmatch, on the stripped path) that raise FileNotFoundError.
    shared: count the attempts of a request across every FaultyFileSystem of this process
        with this seed (as a real service sees all its clients), so a retry through a fresh
        instance (fsspec makes one per thread; a timed-out request is retried from a new
        thread) draws anew. Default False: counts per instance.
    Whether the n-th attempt of a request fails is a pure function of
    (seed, request, n), so a faulty run is reproducible. `faults` counts what was injected.

    Example::

        open_filesystem("faulty::file:///data", {"faulty": {"error_rate": 0.1, "seed": 1}})
    """

    protocol: ClassVar[str] = "faulty"

    def __init__(
        self,
        error_rate: float = 0.0,
        slow_rate: float = 0.0,
        slow_ms: float = 0.0,
        truncate_rate: float = 0.0,
        missing: list[str] | tuple[str, ...] = (),
        shared: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.shared = bool(shared)
        for name, rate in (
            ("error_rate", error_rate),
            ("slow_rate", slow_rate),
            ("truncate_rate", truncate_rate),
        ):
            if not 0.0 <= rate <= 1.0:
                raise ConfigError(f"`{name}` must be in [0, 1]. Found: {rate!r}.")
        self.error_rate = error_rate
        self.slow_rate = slow_rate
        self.slow_ms = slow_ms
        self.truncate_rate = truncate_rate
        self.missing = tuple(missing)
        self.faults = {"errors": 0, "slow": 0, "truncated": 0, "missing": 0}

    _shared_counts: ClassVar[dict[tuple, int]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def _repeat(self, key: tuple) -> int:
        if not self.shared:
            return super()._repeat(key)
        key = (self.seed, *key)
        with self._shared_lock:
            n = self._shared_counts.get(key, 0)
            self._shared_counts[key] = n + 1
        return n

    def _count(self, what: str) -> None:
        with self._lock:
            self.faults[what] += 1

    def _request(self, kind, path, start, end):
        if any(fnmatch.fnmatch(path, pattern) for pattern in self.missing):
            self._count("missing")
            raise FileNotFoundError(f"{path} (injected: permanently missing)")
        key = (kind, path, start, end)
        n = self._repeat(key)
        if self.slow_rate and _unit(self.seed, "slow", *key, n) < self.slow_rate:
            self._count("slow")
            time.sleep(self.slow_ms / 1000.0)
        if self.error_rate and _unit(self.seed, "error", *key, n) < self.error_rate:
            self._count("errors")
            raise ConnectionResetError(
                f"injected transient fault: {kind} {path} [{start}:{end}] attempt {n + 1}"
            )
        return kind == "read" and _unit(self.seed, "trunc", *key, n) < self.truncate_rate

    def _after(self, truncate, data):
        if truncate and data:
            self._count("truncated")
            return data[: len(data) // 2]
        return data


class BoundedCacheFileSystem(SimpleCacheFileSystem):
    """fsspec's whole-file `simplecache`, made crash-safe and bounded in size.

    A remote shard is downloaded to a temporary name in the cache directory and renamed
    into place, so a crash mid-download never leaves a partial file that would be
    served. After each download the least recently used files are evicted until the
    cache holds at most `max_bytes` (the file just fetched is kept even if larger).

    Example::

        open_filesystem("shardcache::s3://bucket/train",
                        {"shardcache": {"cache_storage": "/tmp/c", "max_bytes": 10**10},
                         "s3": {...}})
    """

    protocol: ClassVar[str] = "shardcache"

    def __init__(self, max_bytes: int | None = None, **kwargs: Any) -> None:
        kwargs.pop("fo", None)
        super().__init__(**kwargs)
        self.max_bytes = max_bytes

    def _get_cached_file_before_open(self, path, **kwargs):
        final = os.path.join(self.storage[-1], self._mapper(path))
        self._mkcache()
        fd, tmp = tempfile.mkstemp(dir=self.storage[-1], prefix=f"{_PARTIAL}{os.getpid()}-")
        os.close(fd)
        try:
            self.fs.get_file(path, tmp)
            os.replace(tmp, final)  # atomic on one filesystem
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        self._cache_size = None
        _evict_lru(self.storage[-1], self.max_bytes, keep=final)

    def _open(self, path, mode="rb", **kwargs):
        if "r" in mode:
            cached = self._check_file(self._strip_protocol(path))
            if cached:
                os.utime(cached)  # recency for LRU eviction (atime is unreliable)
        return super()._open(path, mode=mode, **kwargs)

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        for p in set(paths):
            if not self._check_file(self._strip_protocol(p)):
                self._get_cached_file_before_open(self._strip_protocol(p))
        return super().cat_ranges(paths, starts, ends, max_gap, on_error, **kwargs)


_PARTIAL = ".partial-"  # + the downloading process's pid + "-" + a random suffix


def _remove_orphans(directory: str) -> None:
    """Delete partial downloads left by processes that no longer exist (killed mid-write),
    so crashes cannot fill the cache beyond its bound. Live downloads are kept."""
    for entry in os.scandir(directory):
        if not entry.name.startswith(_PARTIAL):
            continue
        pid = entry.name[len(_PARTIAL) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_exists(int(pid)):
            with contextlib.suppress(FileNotFoundError):
                os.remove(entry.path)


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _evict_lru(directory: str, max_bytes: int | None, keep: str) -> None:
    """Remove least recently used cache files until `directory` holds <= `max_bytes`.

    A module function, not a method: fsspec's caching filesystems forward unknown
    attributes to the target filesystem.
    """
    _remove_orphans(directory)
    if max_bytes is None:
        return
    entries = []
    for entry in os.scandir(directory):
        if entry.is_file() and not entry.name.startswith(_PARTIAL):
            st = entry.stat()
            entries.append((st.st_mtime, st.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, name in sorted(entries):
        if total <= max_bytes:
            break
        if name != keep:
            with contextlib.suppress(FileNotFoundError):
                os.remove(name)
            total -= size


def wrap_url(
    url: str,
    storage_options: dict[str, Any] | None,
    protocol: str,
    options: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """Put the `protocol` wrapper in front of `url`: returns (chained url, storage options).

    >>> wrap_url("file:///d/x.parquet", None, "throttled", {"profile": "nas"})
    ('throttled::file:///d/x.parquet', {'throttled': {'profile': 'nas'}})
    """
    merged = dict(storage_options or {})
    if "::" not in url:
        # A plain URL takes flat options (s3fs's `key`, `endpoint_url`...); once chained
        # they must sit under the inner protocol's name.
        inner = url.split("://", 1)[0] if "://" in url else "file"
        known = set(fsspec.available_protocols())
        flat = {k: v for k, v in merged.items() if not (k in known and isinstance(v, dict))}
        if flat:
            merged = {k: v for k, v in merged.items() if k not in flat}
            merged[inner] = {**merged.get(inner, {}), **flat}
    merged[protocol] = dict(options)
    return f"{protocol}::{url}", merged


_WRAPPERS = {
    "throttled": "iolib.storage.ThrottledFileSystem",
    "faulty": "iolib.storage.FaultyFileSystem",
    "shardcache": "iolib.storage.BoundedCacheFileSystem",
}
for _name, _path in _WRAPPERS.items():
    fsspec.register_implementation(_name, _path, clobber=True)
