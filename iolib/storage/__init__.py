"""fsspec filesystems for every read iolib makes: URL resolution and retries.

Why one place: sources, the benchmark and the cache all open files the same way, so
retries, throttling and fault injection wrap one function rather than many.
Filesystem objects are never carried across processes: workers get (url, options)
and open their own.

Modules, one job each: `filesystems` (open_filesystem, is_local, wrap_url), `retries`
(RetryPolicy, call_with_retries), `timeouts` (the helper thread that lets a stuck
request be abandoned), `counters` (per-thread bytes, retries and helper CPU), `wrapper`
(the base of the wrappers), `throttle` (throttled::), `faults` (faulty::), `cache`
(shardcache::).
Importing this package registers the three wrappers with fsspec; pyproject.toml's
entry points name them as `iolib.storage:ClassName` too.
"""

from __future__ import annotations

import fsspec

from iolib.storage.cache import BoundedCacheFileSystem
from iolib.storage.counters import IOCounters, count_bytes, helper_cpu_s, take_counters
from iolib.storage.faults import FaultyFileSystem
from iolib.storage.filesystems import is_local, open_filesystem, wrap_url
from iolib.storage.retries import PERMANENT_ERRORS, RetryPolicy, call_with_retries
from iolib.storage.throttle import PROFILES, ThrottledFileSystem, ThrottleProfile, resolve_profile
from iolib.storage.wrapper import ShortReadError

__all__ = [
    "PERMANENT_ERRORS",
    "PROFILES",
    "BoundedCacheFileSystem",
    "FaultyFileSystem",
    "IOCounters",
    "RetryPolicy",
    "ShortReadError",
    "ThrottleProfile",
    "ThrottledFileSystem",
    "call_with_retries",
    "count_bytes",
    "helper_cpu_s",
    "is_local",
    "open_filesystem",
    "resolve_profile",
    "take_counters",
    "wrap_url",
]

_WRAPPERS = {
    "throttled": "iolib.storage.ThrottledFileSystem",
    "faulty": "iolib.storage.FaultyFileSystem",
    "shardcache": "iolib.storage.BoundedCacheFileSystem",
}
for _name, _path in _WRAPPERS.items():
    fsspec.register_implementation(_name, _path, clobber=True)
