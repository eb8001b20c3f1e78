"""Storage profiles: where the benchmark's data lives and how slow it is to reach.

`local` and `memory` are as fast as this machine; `nvme`, `nas` and `object-store` put
iolib's seeded throttle (iolib.storage.ThrottledFileSystem) in front of local files;
`custom` takes the latency/bandwidth/jitter flags; `s3` copies the data to moto's S3
server on 127.0.0.1 and reads it through s3fs, throttled too when flags ask for it.
Every profile is a (root URL, storage_options) pair, so the loaders open it like any
user URL, through iolib.storage.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

from iolib.errors import ConfigError
from iolib.storage import PROFILES, wrap_url

PROFILE_NAMES = ("local", "memory", *PROFILES, "custom", "s3")


@dataclass(frozen=True)
class Storage:
    """A profile resolved to URLs: `root` for loaders (with the cache, if on), `raw_root`
    for probes (storage only, never the cache)."""

    name: str
    root: str
    options: dict[str, Any] | None
    raw_root: str
    raw_options: dict[str, Any] | None
    throttle: dict[str, Any] | None = None


def throttle_options(
    name: str, overrides: dict[str, float | None], seed: int
) -> dict[str, Any] | None:
    """The `throttled` storage options of a profile (None: no throttle)."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if name in PROFILES:
        return {"profile": name, "seed": seed, **given}
    if name == "custom" or (name == "s3" and given):
        if not given:
            raise ConfigError(
                "The custom profile needs --latency-ms and/or --bandwidth-mbps. "
                "Fix: e.g. --profile custom --latency-ms 20 --bandwidth-mbps 200."
            )
        return {"seed": seed, **given}
    return None


def prepare_storage(
    name: str,
    local_root: str,
    *,
    overrides: dict[str, float | None],
    seed: int = 0,
    s3_options: dict[str, Any] | None = None,
    cache_dir: str | None = None,
    cache_max_bytes: int | None = None,
) -> Storage:
    """Make the data under `local_root` reachable through profile `name`."""
    if name not in PROFILE_NAMES:
        raise ConfigError(
            f"Unknown storage profile {name!r}. Fix: use one of {', '.join(PROFILE_NAMES)}."
        )
    root, options = "file://" + os.path.abspath(local_root), None
    if name == "memory":
        root = _copy_tree(local_root, f"memory://iolib-bench/{uuid.uuid4().hex[:8]}", None)
    elif name == "s3":
        if s3_options is None:
            raise ConfigError("The s3 profile needs moto's server. Fix: run it via `iolib bench`.")
        root = _copy_tree(local_root, f"s3://iolib-bench/{uuid.uuid4().hex[:8]}", s3_options)
        options = {"s3": dict(s3_options)}
    throttle = throttle_options(name, overrides, seed)
    if throttle is not None:
        root, options = wrap_url(root, options, "throttled", throttle)
    raw_root, raw_options = root, options
    if cache_dir is not None:
        cache = {"cache_storage": cache_dir, "max_bytes": cache_max_bytes}
        root, options = wrap_url(root, options, "shardcache", cache)
    return Storage(name, root, options, raw_root, raw_options, throttle)


def _copy_tree(local_root: str, url: str, options: dict[str, Any] | None) -> str:
    import fsspec

    fs, base = fsspec.core.url_to_fs(url, **(options or {}))
    fs.put(os.path.abspath(local_root).rstrip("/") + "/", base, recursive=True)
    return url
