"""shardcache:: a whole-file local cache that is crash-safe and bounded in size.

Owned outright rather than built on fsspec's `SimpleCacheFileSystem`: crash safety and
the size bound needed four of its private methods overridden (`_open`,
`_get_cached_file_before_open`, its `_check_file` and `_mapper`), which a fsspec release
may change without notice. What is left is small: a path's copy, downloaded to a
temporary name and renamed into place, and an LRU bound.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import weakref
from typing import Any, ClassVar

import fsspec
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.implementations.local import LocalFileSystem

from iolib.errors import ConfigError, StorageError


class BoundedCacheFileSystem(ChainedFileSystem):
    """A whole-file local cache in front of any filesystem, crash-safe and bounded.

    A remote shard is downloaded to a temporary name in the cache directory and renamed
    into place, so a crash mid-download never leaves a partial file that would be
    served. After each download the least recently used files are evicted until the
    cache holds at most `max_bytes` (the file just fetched is kept even if larger).
    Shards are taken as immutable, as fsspec's `simplecache` takes them: a copy is
    served until evicted, or until written through this filesystem.

    cache_storage: the cache directory (default: a temporary one, removed at exit).
    max_bytes: bound on the cache's size in bytes; None = unbounded.

    Example::

        open_filesystem("shardcache::s3://bucket/train",
                        {"shardcache": {"cache_storage": "/tmp/c", "max_bytes": 10**10},
                         "s3": {...}})
    """

    protocol: ClassVar[str] = "shardcache"

    def __init__(
        self,
        cache_storage: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
        target_protocol: str | None = None,
        target_options: dict[str, Any] | None = None,
        fs: fsspec.AbstractFileSystem | None = None,
        fo: str | None = None,  # the path, passed by url_to_fs; unused
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 0):
            raise ConfigError(
                f"`max_bytes` of shardcache must be a number of bytes >= 0 or None. "
                f"Found: {max_bytes!r}."
            )
        if cache_storage is None:
            cache_storage = tempfile.mkdtemp(prefix="iolib-shardcache-")
            weakref.finalize(self, shutil.rmtree, cache_storage, True)
        elif not isinstance(cache_storage, (str, os.PathLike)):
            raise ConfigError(
                "`cache_storage` of shardcache must be one directory (a path). "
                f"Found: {cache_storage!r}."
            )
        self.cache_storage = os.fspath(cache_storage)
        self.max_bytes = max_bytes
        self.fs = fs if fs is not None else fsspec.filesystem(
            target_protocol or "file", **(target_options or {})
        )  # fmt: skip

    def _strip(self, path: str) -> str:
        return self.fs._strip_protocol(self._strip_protocol(path))

    def local_path(self, path: str) -> str:
        """Where the copy of `path` is kept (whether or not it is there yet)."""
        name = hashlib.sha256(self._strip(path).encode()).hexdigest()
        return os.path.join(self.cache_storage, name)

    def fetch(self, path: str) -> str:
        """The local copy of `path`: downloaded first if missing, marked recently used."""
        final = self.local_path(path)
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: download again
            os.utime(final)  # recency for LRU eviction (atime is unreliable)
            return final
        try:
            os.makedirs(self.cache_storage, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_storage, prefix=f"{_PARTIAL}{os.getpid()}-")
            os.close(fd)
        except OSError as exc:
            raise _cache_error(self.cache_storage, exc) from exc
        try:
            self.fs.get_file(self._strip(path), tmp)
            os.replace(tmp, final)  # atomic on one filesystem
        except OSError as exc:
            if exc.errno in _LOCAL_DISK_ERRORS:
                raise _cache_error(self.cache_storage, exc) from exc
            raise
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        _evict_lru(self.cache_storage, self.max_bytes, keep=final)
        return final

    def forget(self, path: str) -> None:
        """Drop the copy of `path` (it is read again on the next access)."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.local_path(path))

    # -- reads: from the local copy --------------------------------------------------
    def _open(self, path, mode="rb", **kwargs):
        if "r" in mode and "+" not in mode:
            for attempt in range(2):
                try:
                    return open(self.fetch(path), mode)
                except FileNotFoundError:  # another process evicted it in between
                    if attempt:
                        raise
        self.forget(path)
        return self.fs.open(self._strip(path), mode, **kwargs)

    def cat_file(self, path, start=None, end=None, **kwargs):
        with self._open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = 0 if start is None else (start + size if start < 0 else start)
            end = size if end is None else (end + size if end < 0 else min(end, size))
            f.seek(start)
            return f.read(max(0, end - start))

    def cat_ranges(self, paths, starts, ends, max_gap=None, on_error="return", **kwargs):
        local = {p: self.fetch(p) for p in set(paths)}
        return LocalFileSystem().cat_ranges(
            [local[p] for p in paths], starts, ends, max_gap=max_gap, on_error=on_error
        )

    # -- listings and metadata: the target's -----------------------------------------
    def info(self, path, **kwargs):
        return self.fs.info(self._strip(path), **kwargs)

    def ls(self, path, detail=True, **kwargs):
        return self.fs.ls(self._strip(path), detail=detail, **kwargs)

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        return self.fs.find(
            self._strip(path), maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs
        )

    def glob(self, path, maxdepth=None, **kwargs):
        return self.fs.glob(self._strip(path), maxdepth=maxdepth, **kwargs)

    def modified(self, path):
        return self.fs.modified(self._strip(path))

    def ukey(self, path):
        return self.fs.ukey(self._strip(path))

    # -- writes: to the target, dropping the stale copy ------------------------------
    def pipe_file(self, path, value, **kwargs):
        self.forget(path)
        return self.fs.pipe_file(self._strip(path), value, **kwargs)

    def put_file(self, lpath, rpath, **kwargs):
        self.forget(rpath)
        return self.fs.put_file(lpath, self._strip(rpath), **kwargs)

    def rm_file(self, path):
        self.forget(path)
        return self.fs.rm_file(self._strip(path))

    def rm(self, path, recursive=False, maxdepth=None):
        paths = [path] if isinstance(path, str) else list(path)
        for p in paths:
            self.forget(p)
        stripped = [self._strip(p) for p in paths]
        return self.fs.rm(stripped, recursive=recursive, maxdepth=maxdepth)

    def mkdir(self, path, create_parents=True, **kwargs):
        return self.fs.mkdir(self._strip(path), create_parents=create_parents, **kwargs)

    def makedirs(self, path, exist_ok=False):
        return self.fs.makedirs(self._strip(path), exist_ok=exist_ok)


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
    """Remove least recently used cache files until `directory` holds <= `max_bytes`."""
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
