"""shardcache:: a whole-file local cache that is crash-safe and bounded in size."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from typing import Any, ClassVar

from fsspec.implementations.cached import SimpleCacheFileSystem

from iolib.errors import StorageError


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
        directory = self.storage[-1]
        final = os.path.join(directory, self._mapper(path))
        try:
            self._mkcache()
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{_PARTIAL}{os.getpid()}-")
            os.close(fd)
        except OSError as exc:
            raise _cache_error(directory, exc) from exc
        try:
            self.fs.get_file(path, tmp)
            os.replace(tmp, final)  # atomic on one filesystem
        except OSError as exc:
            if exc.errno in _LOCAL_DISK_ERRORS:
                raise _cache_error(directory, exc) from exc
            raise
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
# Errors of the local disk, never of the remote store: no retry helps, and the data is fine.
_LOCAL_DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}


def _cache_error(directory: str, exc: OSError) -> StorageError:
    reason = {
        errno.ENOSPC: "its disk is full",
        errno.EDQUOT: "its disk quota is used up",
        errno.EROFS: "its filesystem is read-only",
        errno.EACCES: "it cannot be written (permission denied)",
        errno.EPERM: "it cannot be written (not permitted)",
    }.get(exc.errno or 0, f"writing there failed ({exc})")
    return StorageError(
        exc.errno or errno.EIO,
        f"The shard cache at {directory!r} cannot hold another shard: {reason}. Free space "
        "there, lower the cache's max_bytes, or point cache_storage at another disk. The "
        "data itself is fine.",
    )


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
