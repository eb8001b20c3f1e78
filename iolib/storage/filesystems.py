"""URL resolution: (url, storage_options) to an fsspec filesystem, and chaining wrappers.

Filesystem objects are never carried across processes: workers get (url, options) and
open their own.
"""

from __future__ import annotations

from typing import Any

import fsspec

from iolib.errors import ConfigError


def open_filesystem(
    url: str, storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve `url` to (filesystem, path), with a message naming the package to install."""
    _check_userinfo(url)
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


def _check_userinfo(url: str) -> None:
    """fsspec reads a URL's user info up to the first '/': a secret holding one (as AWS
    secret keys often do) becomes part of the bucket name, and the request fails with
    that piece of the secret quoted. Say how to pass it instead."""
    from iolib.redact import redact_url, userinfo

    for part in url.split("::"):
        info = userinfo(part)
        if info and "/" in info:
            raise ConfigError(
                f"The credentials in {redact_url(part)!r} hold a '/', which fsspec cannot "
                "parse from a URL. Pass them as storage options instead, e.g. "
                "storage_options={'key': ..., 'secret': ...} (CLI: -o key=... -o secret=...)."
            )


def wrap_url(
    url: str,
    storage_options: dict[str, Any] | None,
    protocol: str,
    options: dict[str, Any],
) -> tuple[str, dict[str, Any]]:
    """Put the `protocol` wrapper in front of `url`: returns (chained url, storage options).

    >>> wrap_url("file:///d/x.parquet", None, "throttled", {"profile": "nas"})
    ('throttled::file:///d/x.parquet', {'throttled': {'profile': 'nas'}})
    """
    merged = dict(storage_options or {})
    if "::" not in url:
        # A plain URL takes flat options (s3fs's `key`, `endpoint_url`...); once chained
        # they must sit under the inner protocol's name.
        inner = url.split("://", 1)[0] if "://" in url else "file"
        known = set(fsspec.available_protocols())
        flat = {k: v for k, v in merged.items() if not (k in known and isinstance(v, dict))}
        if flat:
            merged = {k: v for k, v in merged.items() if k not in flat}
            merged[inner] = {**merged.get(inner, {}), **flat}
    merged[protocol] = dict(options)
    return f"{protocol}::{url}", merged
