"""The base of the throttled:: and faulty:: wrappers: forward every call, hook each request.

Both wrappers are fsspec filesystems reachable from a chained URL plus storage_options,
so a worker that opens (url, storage_options) gets them with no other change::

    open_filesystem("throttled::file:///data/x.parquet",
                    {"throttled": {"profile": "object-store", "seed": 0}})
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import fsspec
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.spec import AbstractBufferedFile

from iolib.base.forks import reset_after_fork

T = TypeVar("T")


def seeded_unit(seed: int, *key: object) -> float:
    """A uniform draw in (0, 1) that is a pure function of (seed, key)."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") + 0.5) / 2.0**64


class WrapperFileSystem(ChainedFileSystem):
    """Forwards every call to a target filesystem, calling `before_request` around each read.

    Subclasses decide what a request costs (`before_request`) and may alter returned bytes
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
        reset_after_fork(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # a parent thread may have held it at the fork

    # -- hooks -------------------------------------------------------------------------
    def before_request(self, kind: str, path: str, start: int | None, end: int | None) -> Any:
        """Called before a request; returns a token handed to `after_request`."""
        return None

    def after_request(self, token: Any, data: bytes | None) -> bytes | None:
        return data

    def repeat_count(self, key: tuple) -> int:
        """How many times this exact request was made before (for seeded draws)."""
        with self._lock:
            n = self._counts.get(key, 0)
            self._counts[key] = n + 1
        return n

    def _call(self, kind: str, path: str, fn: Callable[[], T], start=None, end=None) -> T:
        token = self.before_request(kind, path, start, end)
        result = fn()
        if isinstance(result, bytes):
            return self.after_request(token, result)  # type: ignore[return-value]
        self.after_request(token, None)
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
