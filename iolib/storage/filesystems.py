"""URL resolution: (url, storage_options) to an fsspec filesystem, and chaining wrappers.

Filesystem objects are never carried across processes: workers get (url, options) and
open their own.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec

from iolib.errors import ConfigError
from iolib.storage.retries import BOTOCORE_RETRIES

_S3_PROTOCOLS = ("s3", "s3a")


def open_filesystem(
    url: str, storage_options: dict[str, Any] | None = None
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve `url` to (filesystem, path), with a message naming the package to install."""
    _check_userinfo(url)
    _check_s3_option_names(url, storage_options or {})
    options = _one_retry_layer(url, storage_options or {})
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        hint = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
        package = hint.get(protocol, f"the fsspec backend for '{protocol}'")
        raise ConfigError(
            f"Cannot open {url!r}: the '{protocol}' protocol needs {package}. "
            f"Install it: pip install {package}. ({exc})"
        ) from exc
    return fs, path


# boto3's names (or near misses) that s3fs spells otherwise: s3fs would pass them on to
# aiobotocore, whose TypeError does not say which option was meant.
_S3_NAMES = {
    "endpoint": "endpoint_url",
    "endpoint_uri": "endpoint_url",
    "url": "endpoint_url",
    "aws_access_key_id": "key",
    "access_key": "key",
    "access_key_id": "key",
    "aws_secret_access_key": "secret",
    "secret_key": "secret",
    "secret_access_key": "secret",
    "aws_session_token": "token",
    "session_token": "token",
    "region": "client_kwargs={'region_name': ...}",
    "region_name": "client_kwargs={'region_name': ...}",
}


def _check_s3_option_names(url: str, options: dict[str, Any]) -> None:
    """Name s3fs's spelling of a misspelt S3 option before any request."""
    protocol = url.split("::")[-1].split("://", 1)[0] if "://" in url else "file"
    if protocol not in _S3_PROTOCOLS:
        return
    wrong = [k for k in options if k in _S3_NAMES]
    if wrong:
        fixes = ", ".join(f"{k!r} -> {_S3_NAMES[k]}" for k in wrong)
        raise ConfigError(
            f"storage_options for s3:// URLs: s3fs does not know {wrong}; it spells "
            f"them {fixes} (e.g. storage_options={{'endpoint_url': 'http://host:9000'}}, "
            "or -o endpoint_url=... on the command line)."
        )


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `fs` is the local disk itself (not a wrapper or a cache in front of it):
    there a read costs no request, and a stat costs no round trip."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol


def _one_retry_layer(url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """`storage_options` with botocore's retries set to `BOTOCORE_RETRIES` for an s3 URL,
    unless the user set them (`config_kwargs["retries"]`, AWS_MAX_ATTEMPTS,
    AWS_RETRY_MODE): iolib's policy is then the one retry loop (`iolib.storage.retries`).
    The caller's dicts are not changed."""
    parts = url.split("::")
    protocol = parts[-1].split("://", 1)[0] if "://" in parts[-1] else "file"
    if protocol not in _S3_PROTOCOLS or {"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} & set(os.environ):
        return storage_options
    options = dict(storage_options)
    if len(parts) == 1:
        target = options  # a plain URL takes flat options
    else:  # a chained one takes the inner filesystem's under its protocol's name
        target = options[protocol] = dict(options.get(protocol) or {})
    config = dict(target.get("config_kwargs") or {})
    # botocore rewrites the retries dict it is given (max_attempts to total_max_attempts):
    # it gets a copy, so the user's stays as written.
    retries = config.get("retries")
    config["retries"] = dict(BOTOCORE_RETRIES if retries is None else retries)
    target["config_kwargs"] = config
    return options


def _check_userinfo(url: str) -> None:
    """fsspec reads a URL's user info up to the first '/': a secret holding one (as AWS
    secret keys often do) becomes part of the bucket name, and the request fails with
    that piece of the secret quoted. Say how to pass it instead."""
    from iolib.base.redact import redact_url, userinfo

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
