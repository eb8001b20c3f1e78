"""fsspec filesystems for every read iolib makes: URL resolution and retries.

Why one place: sources, the benchmark and the cache all open files the same way, so
retries, throttling and fault injection wrap one function rather than many.
Filesystem objects are never carried across processes: workers get (url, options)
and open their own.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec

from iolib.errors import ConfigError

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
)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried.

    attempts: total tries per request (default 5); more hides longer outages but delays
        the error a user waits for.
    base_delay_s: first backoff (default 0.05 s), doubled each try, with full jitter.
    max_delay_s: cap on one backoff (default 2 s).
    """

    attempts: int = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"`attempts` must be at least 1. Found: {self.attempts}.")


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
) -> T:
    """Call `fn`; retry transient errors with exponential backoff and full jitter.

    Permanent errors (missing object, bad bytes) raise at once. After the last attempt
    the error is re-raised as an OSError that names `what` and the attempts made.
    """
    policy = policy or RetryPolicy()
    jitter = random.Random(seed)  # only the pace depends on it, never the data
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except PERMANENT_ERRORS:
            raise
        except Exception as exc:
            if attempt == policy.attempts:
                raise OSError(
                    f"{what}: failed after {attempt} attempts; last error: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            _counters().retries += 1
            if on_retry is not None:
                on_retry(exc)
            delay = min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1))
            log.debug("retrying %s after %s (attempt %d)", what, exc, attempt)
            time.sleep(jitter.uniform(0, delay))
    raise AssertionError("unreachable")  # pragma: no cover


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
