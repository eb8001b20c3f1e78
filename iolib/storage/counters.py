"""Per-thread I/O counts (bytes read, retries, CPU spent on helper threads) that
workers hand to the consumer."""

from __future__ import annotations

import threading


class IOCounters(threading.local):
    """Per-thread I/O counts: a worker takes them after each batch, so the figures reach
    the consumer exactly, from threads and processes alike."""

    bytes_read: int = 0
    retries: int = 0
    helper_cpu_s: float = 0.0  # CPU helper threads (timeouts, DALI's pool) spent for this one


_COUNTERS = IOCounters()


def count_bytes(n: int) -> None:
    """Record `n` bytes read from storage by the current thread."""
    _COUNTERS.bytes_read += n


def count_retries(n: int) -> None:
    """Record `n` retries for the current thread (made on its behalf by another one)."""
    _COUNTERS.retries += n


def count_helper_cpu(seconds: float) -> None:
    """Record CPU that helper threads (a storage timeout's, a decoder's pool) spent
    on work of the current thread."""
    _COUNTERS.helper_cpu_s += seconds


def helper_cpu_s() -> float:
    """CPU seconds helper threads spent for the current thread (a running total)."""
    return _COUNTERS.helper_cpu_s


def take_counters() -> tuple[int, int]:
    """(bytes read, retries) by the current thread since the last call; resets them."""
    taken = (_COUNTERS.bytes_read, _COUNTERS.retries)
    _COUNTERS.bytes_read = _COUNTERS.retries = 0
    return taken
