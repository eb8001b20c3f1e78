"""Retries: which storage errors are transient, and how they are retried.

Why here: every read iolib makes (row groups, images, footers) goes through
`call_with_retries`, so one policy decides backoff, jitter, attempts and timeouts.

Layering: retry loops below iolib's multiply with it (botocore's default of 5 attempts
made a read iolib tried 3 times 15 requests to a server answering 500; one attempt each
since, tests/test_s3_retries.py). For s3 URLs `open_filesystem` sets
botocore to one attempt (`BOTOCORE_RETRIES`) unless the user configured botocore's
retries (storage option `config_kwargs={"retries": ...}`, or AWS_MAX_ATTEMPTS /
AWS_RETRY_MODE), so iolib's policy is the outer and only configured loop. s3fs keeps a
loop of its own that no option reaches (`S3FileSystem.retries`, 5 tries, for dropped
connections and SlowDown only): a read failing that way is tried up to 5 x `attempts`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from iolib.errors import ConfigError, DataError, StorageError
from iolib.storage.counters import count_retries
from iolib.storage.timeouts import call_with_timeout

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
    DataError,
    StorageError,
)


# botocore's (and gcsfs's) "no credentials" errors, by class name: no import of either.
# A retry cannot find credentials, so they fail at once with the way to pass them.
CREDENTIAL_ERRORS = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
     "NoAuthTokenError", "RefreshError", "DefaultCredentialsError"}
)  # fmt: skip
CREDENTIALS_HINT = (
    " Fix: pass credentials in storage_options, e.g. {'key': ..., 'secret': ...} for S3 "
    "(and 'endpoint_url' for an S3-compatible store); on the command line -o key=... "
    "-o secret=...; or configure the backend's own lookup (~/.aws, environment variables)."
)


# botocore's retries for the s3 filesystems iolib opens: one attempt, so a failed request
# surfaces to `call_with_retries` (backoff, jitter, timeouts) instead of being retried
# beneath it. "standard" rather than botocore's "legacy": the documented mode whose
# attempt count includes the first request.
BOTOCORE_RETRIES: dict[str, object] = {"mode": "standard", "total_max_attempts": 1}


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried, and when a request counts as stuck.

    attempts: total tries per request (default 5); more hides longer outages but delays
        the error a user waits for.
    base_delay_s: first backoff (default 0.05 s), doubled each try, with full jitter.
    max_delay_s: cap on one backoff (default 2 s).
    timeout_s: a request (one row-group read, one batch of image reads) still running
        after this many seconds is abandoned as stuck and retried; None = wait forever.
        Default 120 s: a stuck read fails within about attempts x (timeout_s + max_delay_s).
        Raise it for very large row groups on slow links. The abandoned request's thread
        cannot be stopped; it ends when the request does.
    """

    attempts: int = 5
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    timeout_s: float | None = 120.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError(f"`attempts` must be at least 1. Found: {self.attempts}.")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ConfigError(
                "`timeout_s` must be a positive number of seconds or None. "
                f"Found: {self.timeout_s!r}."
            )


def call_with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
    seed: int | None = None,
    redact: Callable[[str], str] = str,
) -> T:
    """Call `fn`; retry transient errors with exponential backoff and full jitter.

    Permanent errors (missing object, bad bytes) raise at once. A call that runs past
    `policy.timeout_s` counts as a transient TimeoutError. After the last attempt the error
    is re-raised as an OSError that names `what` and the attempts made; `redact` cleans
    the text of the underlying error (credentials) before it is shown or logged.
    """
    policy = policy or RetryPolicy()
    jitter = random.Random(seed)  # only the pace depends on it, never the data
    for attempt in range(1, policy.attempts + 1):
        try:
            return call_with_timeout(fn, policy.timeout_s, what)
        except PERMANENT_ERRORS as exc:
            if isinstance(exc, (DataError, ConfigError)):
                raise  # ours: already names the file and the fix
            remote = "://" in what and "file://" not in what
            hint = CREDENTIALS_HINT if remote and isinstance(exc, PermissionError) else ""
            raise _permanent(exc, what, attempt, redact, hint) from (
                exc if redact(str(exc)) == str(exc) else None
            )
        except Exception as exc:
            if type(exc).__name__ in CREDENTIAL_ERRORS:
                denied = PermissionError(f"{type(exc).__name__}: {exc}")
                raise _permanent(denied, what, attempt, redact, CREDENTIALS_HINT) from None
            _retry_or_raise(exc, what, attempt, policy, jitter, on_retry, redact)
    raise AssertionError("unreachable")  # pragma: no cover


def _retry_or_raise(
    exc: Exception,
    what: str,
    attempt: int,
    policy: RetryPolicy,
    jitter: random.Random,
    on_retry: Callable[[BaseException], None] | None,
    redact: Callable[[str], str],
) -> None:
    """After a transient error: raise if it was the last attempt, else back off."""
    reason = redact(f"{type(exc).__name__}: {exc}")
    if attempt == policy.attempts:
        raise OSError(f"{what}: failed after {attempt} attempts; last error: {reason}") from (
            exc if redact(str(exc)) == str(exc) else None
        )
    count_retries(1)
    if on_retry is not None:
        on_retry(exc)
    log.debug("retrying %s after %s (attempt %d)", what, reason, attempt)
    time.sleep(backoff_delay(attempt, policy, jitter))


def backoff_delay(attempt: int, policy: RetryPolicy, jitter: random.Random) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based): full jitter, uniform in
    [0, min(max_delay_s, base_delay_s * 2 ** (attempt - 1))], so the bound doubles each
    attempt up to the cap while clients that failed together spread out."""
    bound = min(policy.max_delay_s, policy.base_delay_s * 2.0 ** (attempt - 1))
    return jitter.uniform(0, bound)


def _permanent(
    exc: BaseException, what: str, attempt: int, redact: Callable[[str], str], hint: str = ""
) -> BaseException:
    """The same error type, with a message naming `what` and the attempts made."""
    text = (
        f"{what}: failed on attempt {attempt} with a permanent error (not retried): "
        f"{redact(f'{type(exc).__name__}: {exc}')}{hint}"
    )
    try:
        return type(exc)(text)
    except Exception:  # an exception type with other constructor arguments
        return OSError(text)
