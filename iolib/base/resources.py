"""Bytes and CPUs, read once: what a memory budget says and how many cores this process
may use. Options, the tuner and the command line all ask here, so each is parsed and
counted one way."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from iolib.errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
_UNITS.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})


def parse_bytes(value: int | float | str | None, name: str = "memory_budget") -> int | None:
    """Bytes from an int or a string like "2GiB", "512MB", "1.5 GB" (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value >= 1 and value != float("inf"):
            return int(value)
        value = repr(value)  # refused below, as written
    match = re.fullmatch(r"\s*(\d+\.?\d*|\.\d+)\s*([a-zA-Z]*)\s*", str(value))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
        raise ConfigError(
            f"`{name}` must be a positive number of bytes or a size like '2GiB' or '512MB'. "
            f"Found: {value!r}."
        )
    return int(float(match.group(1)) * _UNITS[unit])


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity), counted in this one place."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2


@dataclass(frozen=True)
class ThreadBudget:
    """The threads one process runs to read data, in one place (sources and the token
    reader ask here rather than keep constants of their own).

    remote_reads: row-group reads in flight from an object store: a request's latency,
        not the link, bounds one connection, so several run at once (8 filled a link in
        the store benchmarks).
    decodes: row groups decoded at once: one a core this process may use, at least 2 (a
        decode holds its pages and values: more at once only raise the peak memory).
    footers: footer reads in flight when listing a dataset (a request or two each).
    index_reads: row groups read at once to count a token index.
    readahead: background threads of a Parquet reader's read-ahead.
    pieces: connections one needed read of a large range is split over (S3 transfer
        managers' parallel ranged GETs: 5 of 20 MB/s a connection on the benchmarks' store).
    """

    remote_reads: int = 8
    decodes: int = 2
    footers: int = 64
    index_reads: int = 8
    readahead: int = 1
    pieces: int = 8


def thread_budget() -> ThreadBudget:
    """This process's thread budget (its cores counted now: call it again after a fork)."""
    return ThreadBudget(decodes=max(2, cpu_count()))
