"""Keep credentials out of every message, log line and record iolib writes.

Why a module of its own: URLs and storage options travel into error messages
(sources), log lines (storage), observations and reports (bench). Each of those
places passes its text through `redact_text` with the secrets of the URLs and options
it was given, so a key in ``s3://KEY:SECRET@bucket/...`` or in
``storage_options={"key": ..., "secret": ...}`` is printed as ``***``.

>>> redact_url("s3://AKIA1234:s3cr3t@bucket/train.parquet")
's3://***@bucket/train.parquet'
>>> redact_options({"key": "AKIA1234", "client_kwargs": {"region_name": "eu-west-1"}})
{'key': '***', 'client_kwargs': {'region_name': 'eu-west-1'}}
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

MASK = "***"
# Option and query-parameter names whose values are credentials (case-insensitive, anywhere
# in the name): s3fs key/secret/token, gcsfs token, adlfs account_key/sas_token,
# http auth and password, signed-URL signatures.
_SENSITIVE = re.compile(
    r"key|secret|token|passw|credential|signature|sig$|auth|session", re.IGNORECASE
)
# scheme://user:password@host, where the password may hold any character but blanks
# (AWS secret keys hold '/' and '+'; others quotes and ':'), an '@' only where another
# '@' follows before the next '/' (as URL parsers take the last '@' of the host part),
# or scheme://token@host (no '/' in a token: a path may hold '@'). The user part stops
# at ':' or '/', so a port (host:8080/a@b) is not one.
_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)"
    r"(?P<user>[^/:\s@]+:(?!\d+/)(?:[^\s@]|@(?=[^\s/@]*@))*|[^/:\s@]+)@"
)
# "secret": "value", secret=value, 'token': 'value' (JSON, Python reprs, query strings),
# "Authorization": "Bearer value" (the scheme word kept, the credential masked).
# An exception's name ("NoCredentialsError: Unable to ...") is no assignment.
_ASSIGNED = re.compile(
    r"(?P<name>(?<![A-Za-z0-9_-])[\"']?[A-Za-z0-9_-]*"
    r"(?:key|secret|token|passw\w*|credential\w*|signature|auth\w*)"
    r"(?<!error)(?<!exception)(?<!warning)"
    r"[\"']?\s*[:=]\s*[\"']?(?:(?:Bearer|Basic|Token|Digest|AWS4-HMAC-SHA256)\s+)?)"
    r"(?P<value>[^\"'&,}\s]+)",
    re.IGNORECASE,
)
# Words that open an Authorization header's value: the credential is what follows.
_AUTH_SCHEMES = re.compile(r"^(?:Bearer|Basic|Token|Digest)\s+(\S+)$", re.IGNORECASE)
_MIN_SECRET = 4  # shorter values would mask innocent text everywhere


def is_sensitive(name: str) -> bool:
    """True for option names that hold credentials ("key", "secret", "token", ...)."""
    return bool(_SENSITIVE.search(name))


def secrets_in(urls: Iterable[str] = (), options: Any = None) -> frozenset[str]:
    """Every credential value found in `urls` (user info, signed query parameters) and in
    `options` (values under sensitive names, at any depth)."""
    found: set[str] = set()
    for url in urls:
        for part in str(url).split("::"):
            found.update(_url_secrets(part))
    _collect(options, found, sensitive=False)
    return frozenset(s for s in found if len(s) >= _MIN_SECRET)


def userinfo(url: str) -> str | None:
    """The user info of `url` (``KEY:SECRET`` of ``s3://KEY:SECRET@bucket/x``), whatever
    characters the secret holds; None when it has none. urllib stops at the first '/',
    which cut secrets that hold one and let them through unmasked."""
    match = _USERINFO.match(url.strip())
    return match.group("user") if match else None


def _url_secrets(url: str) -> set[str]:
    out: set[str] = set()
    user = userinfo(url)
    if user:
        out.add(user)
        parts = [part for part in user.split(":", 1) if part]
        out.update(parts)
        # A parser that stops at '/' quotes the secret in pieces ("Invalid bucket name
        # 'KEY:abc'"), so each piece is a secret too.
        out.update(piece for part in parts for piece in part.split("/"))
    if "?" in url:
        with _suppress():
            for name, value in parse_qsl(urlsplit(url).query):
                if is_sensitive(name):
                    out.add(value)
    return out


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], ValueError)  # type: ignore[arg-type]


def _collect(value: Any, found: set[str], sensitive: bool) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _collect(v, found, sensitive or is_sensitive(str(k)))
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _collect(v, found, sensitive)
    elif isinstance(value, (str, bytes)) and sensitive:
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        found.add(text)
        scheme = _AUTH_SCHEMES.match(text.strip())
        if scheme:  # "Bearer hf_...": the token alone is printed too
            found.add(scheme.group(1))
    elif isinstance(value, str) and "://" in value:
        found.update(_url_secrets(value))


def redact_url(url: str) -> str:
    """`url` with its user info and signed query parameters masked."""
    return redact_text(url)


def redact_options(options: Any) -> Any:
    """A copy of `options` with every value under a sensitive name masked."""
    if isinstance(options, dict):
        return {
            k: (MASK if is_sensitive(str(k)) and not isinstance(v, dict) else redact_options(v))
            for k, v in options.items()
        }
    if isinstance(options, (list, tuple)):
        return type(options)(redact_options(v) for v in options)
    if isinstance(options, str):
        return redact_text(options)
    return options


def redact_text(text: str, secrets: Iterable[str] = (), *, assignments: bool = True) -> str:
    """`text` with URL user info, each of `secrets` and (unless `assignments` is False, as
    for tracebacks that quote source lines) `name=value` credentials masked."""
    # Known secrets first: a pattern rule that masked part of one ("Bearer" of
    # "Bearer hf_...") would leave the rest unmatched.
    text = str(text)
    for secret in sorted(set(secrets), key=len, reverse=True):  # longest first
        if len(secret) >= _MIN_SECRET:
            text = text.replace(secret, MASK)
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    if assignments:
        text = _ASSIGNED.sub(lambda m: f"{m.group('name')}{MASK}", text)
    return text


class Redactor:
    """Redacts text with the secrets of one source's URLs and options; picklable.

    >>> Redactor(["s3://b/x"], {"secret": "hunter22"})("denied: hunter22")
    'denied: ***'
    """

    def __init__(self, urls: Iterable[str] = (), options: Any = None) -> None:
        self.secrets = secrets_in(urls, options)
        # "KEY:<what a parser kept of the secret>", however short that piece is.
        users = {u.split(":", 1)[0] for u in map(userinfo, map(str, urls)) if u and ":" in u}
        self._quoted = [
            re.compile(re.escape(user) + r":[^\s@]*")
            for user in sorted(users, key=len, reverse=True)
            if len(user) >= _MIN_SECRET
        ]

    def __call__(self, text: str, *, assignments: bool = True) -> str:
        text = redact_text(str(text), self.secrets, assignments=False)  # known ones first
        for pattern in self._quoted:
            text = pattern.sub(MASK, text)
        return redact_text(text, (), assignments=assignments)

    def changes(self, text: str) -> bool:
        """True when `text` holds something this redactor masks."""
        return self(text) != text
