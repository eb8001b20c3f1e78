"""throttled:: a seeded latency, bandwidth and jitter model in front of any filesystem."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, ClassVar

from iolib.errors import ConfigError
from iolib.storage.wrapper import WrapperFileSystem, seeded_unit


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


class ThrottledFileSystem(WrapperFileSystem):
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

    def before_request(self, kind, path, start, end):
        key = (kind, path, start, end)
        n = self.repeat_count(key)
        p = self.profile
        latency = p.latency_ms / 1000.0
        if p.jitter > 0 and latency > 0:
            z = NormalDist().inv_cdf(seeded_unit(self.seed, *key, n))
            latency *= math.exp(p.jitter * z)
        return time.perf_counter(), latency

    def after_request(self, token, data):
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
