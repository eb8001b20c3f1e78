"""faulty:: seeded transient errors, slow requests, short reads and missing objects."""

from __future__ import annotations

import fnmatch
import threading
import time
from typing import Any, ClassVar

from iolib.errors import ConfigError
from iolib.storage.wrapper import WrapperFileSystem, seeded_unit


class FaultyFileSystem(WrapperFileSystem):
    """Inject seeded storage faults in front of any fsspec filesystem.

    error_rate: probability that a request raises ConnectionResetError (transient: a
        retry of the same request draws again).
    slow_rate, slow_ms: probability that a request first sleeps `slow_ms`.
    truncate_rate: probability that a read returns only its first half (a connection
        closed early). Files opened through a wrapper notice the short read and raise a
        transient ShortReadError (as HTTP clients do from Content-Length); a bare
        `cat_file` hands the short bytes on, for testing parsers.
    missing: glob patterns (fnmatch, on the stripped path) that raise FileNotFoundError.
    denied: glob patterns that raise PermissionError (permanent: never retried).
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
        denied: list[str] | tuple[str, ...] = (),
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
        self.missing, self.denied = tuple(missing), tuple(denied)
        self.faults = {"errors": 0, "slow": 0, "truncated": 0, "missing": 0, "denied": 0}

    _shared_counts: ClassVar[dict[tuple, int]] = {}
    _shared_faults: ClassVar[dict[tuple, int]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def injected(cls, seed: int) -> dict[str, int]:
        """Faults injected by every `shared` instance with `seed` in this process."""
        with cls._shared_lock:
            found = {k[1]: n for k, n in cls._shared_faults.items() if k[0] == seed}
        return {"errors": 0, "slow": 0, "truncated": 0, "missing": 0, "denied": 0, **found}

    @classmethod
    def attempts(cls, seed: int) -> dict[tuple, int]:
        """Attempts per request (kind, path, start, end) of every `shared` instance."""
        with cls._shared_lock:
            return {k[1:]: n for k, n in cls._shared_counts.items() if k[0] == seed}

    @classmethod
    def forget(cls, seed: int) -> None:
        """Start `seed`'s shared attempt and fault counts afresh (tests reuse seeds)."""
        with cls._shared_lock:
            for table in (cls._shared_counts, cls._shared_faults):
                for key in [k for k in table if k[0] == seed]:
                    del table[key]

    def repeat_count(self, key: tuple) -> int:
        if not self.shared:
            return super().repeat_count(key)
        key = (self.seed, *key)
        with self._shared_lock:
            n = self._shared_counts.get(key, 0)
            self._shared_counts[key] = n + 1
        return n

    def _count(self, what: str) -> None:
        with self._lock:
            self.faults[what] += 1
        if self.shared:
            with self._shared_lock:
                key = (self.seed, what)
                self._shared_faults[key] = self._shared_faults.get(key, 0) + 1

    def before_request(self, kind, path, start, end):
        key = (kind, path, start, end)
        n = self.repeat_count(key)  # permanent faults count too: a test sees repeats
        if any(fnmatch.fnmatch(path, pattern) for pattern in self.missing):
            self._count("missing")
            raise FileNotFoundError(f"{path} (injected: permanently missing)")
        if any(fnmatch.fnmatch(path, pattern) for pattern in self.denied):
            self._count("denied")
            raise PermissionError(f"{path} (injected: access denied)")
        if self.slow_rate and seeded_unit(self.seed, "slow", *key, n) < self.slow_rate:
            self._count("slow")
            time.sleep(self.slow_ms / 1000.0)
        if self.error_rate and seeded_unit(self.seed, "error", *key, n) < self.error_rate:
            self._count("errors")
            raise ConnectionResetError(
                f"injected transient fault: {kind} {path} [{start}:{end}] attempt {n + 1}"
            )
        return kind == "read" and seeded_unit(self.seed, "trunc", *key, n) < self.truncate_rate

    def after_request(self, truncate, data):
        if truncate and data:
            self._count("truncated")
            return data[: len(data) // 2]
        return data
