"""Per-thread I/O counts (bytes read, retries) that workers hand to the consumer."""

from __future__ import annotations

import threading


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
