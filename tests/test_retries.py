"""Retries counted exactly: one per injected transient fault, none for a permanent error,
and a backoff whose bound doubles up to its cap with full jitter.

The faults come from the seeded `faulty::` wrapper over real Parquet files in fsspec's
memory store (a fixed path, so the draws are the same on every run)."""

from __future__ import annotations

import random
from pathlib import Path

import fsspec
import pytest

from iolib import DataLoader
from iolib.errors import failure_text
from iolib.sources import ParquetSource
from iolib.storage import RetryPolicy, call_with_retries, wrap_url
from iolib.storage.faults import FaultyFileSystem
from iolib.storage.retries import backoff_delay
from tests.conftest import write_parquet_shards
from tests.failures import raises_failure

FAST = RetryPolicy(attempts=12, base_delay_s=0.001, max_delay_s=0.002)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """400 rows, 4 files, row groups of 25, at a fixed path of the memory store."""
    local = tmp_path_factory.mktemp("retries")
    write_parquet_shards(local, 400, shards=4, row_group_size=25)
    fs = fsspec.filesystem("memory")
    for path in sorted(Path(local).iterdir()):
        fs.pipe_file(f"/iolib-retries/{path.name}", path.read_bytes())
    return "memory:///iolib-retries"


def _faulty_source(url: str, seed: int, policy: RetryPolicy = FAST, **faults) -> ParquetSource:
    """A source listed through healthy storage whose reads then go through `faults`."""
    source = ParquetSource(url, retry=policy)
    len(source)  # footers read before any fault
    FaultyFileSystem.forget(seed)
    options = {"seed": seed, "shared": True, "skip_instance_cache": True, **faults}
    source.urls = [wrap_url(u, None, "faulty", options)[0] for u in source.urls]
    source.storage_options = wrap_url(url, None, "faulty", options)[1]
    return source


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("seed", [4, 5])
def test_retries_equal_the_transient_faults_injected(data, workers, seed) -> None:
    """Every injected ConnectionResetError is retried once and counted once: the loader's
    `retries` is exactly the wrapper's count (twice the count, or none, fails)."""
    # Half the requests fail: a batch's neighbouring row groups come in one request, so
    # an epoch of 16 row groups makes only ~10.
    source = _faulty_source(data, seed, error_rate=0.5)
    loader = DataLoader(source, batch_size=16, shuffle=True, seed=1, num_workers=workers)
    ids = sorted(i for b in loader for i in b["id"].tolist())
    assert ids == list(range(400))
    injected = FaultyFileSystem.injected(seed)
    assert injected["errors"] >= 3, injected  # fixed path: the same draws every run
    assert loader.stats()["retries"] == injected["errors"], (loader.stats(), injected)


def test_a_permission_error_fails_on_attempt_one_and_is_not_retried(data) -> None:
    source = _faulty_source(data, 11, denied=["*part-001.parquet"])
    loader = DataLoader(source, batch_size=16, shuffle=False)
    with raises_failure(PermissionError) as info:
        list(loader)
    assert "part-001.parquet' row group 0: failed on attempt 1" in failure_text(info.value)
    assert "access denied" in failure_text(info.value)
    denied = FaultyFileSystem.injected(11)["denied"]
    attempts = FaultyFileSystem.attempts(11)
    assert denied >= 1 and sum(attempts.values()) >= denied
    # No request is retried: each is asked at most twice, once by the read-ahead and once
    # by the batch's own read after the read-ahead's failure (neither repeats itself).
    assert max(attempts.values()) <= 2, attempts
    assert loader.stats()["retries"] == 0


def test_call_with_retries_counts_attempts_against_its_faults() -> None:
    """Direct: k transient failures then success make k retries and k + 1 calls; a
    PermissionError is called once; the last attempt's failure is not a retry."""
    calls: list[int] = []

    def flaky(failures: int, exc: BaseException):
        def fn() -> str:
            calls.append(1)
            if len(calls) <= failures:
                raise exc
            return "ok"

        return fn

    retried: list[BaseException] = []
    policy = RetryPolicy(attempts=5, base_delay_s=0.0001, max_delay_s=0.0001, timeout_s=None)
    assert call_with_retries(flaky(3, ConnectionResetError("reset")), what="x",
                             policy=policy, on_retry=retried.append) == "ok"  # fmt: skip
    assert len(calls) == 4 and len(retried) == 3
    calls.clear(), retried.clear()
    with pytest.raises(PermissionError, match="failed on attempt 1 with a permanent error"):
        call_with_retries(flaky(9, PermissionError("denied")), what="x", policy=policy,
                          on_retry=retried.append)  # fmt: skip
    assert len(calls) == 1 and not retried
    calls.clear()
    with pytest.raises(OSError, match="failed after 5 attempts"):
        call_with_retries(flaky(9, ConnectionResetError("reset")), what="x", policy=policy,
                          on_retry=retried.append)  # fmt: skip
    assert len(calls) == 5 and len(retried) == 4


def test_backoff_doubles_to_its_cap_with_full_jitter() -> None:
    """The bound is base * 2**(attempt-1), capped; the wait is a uniform draw below it
    (the same seeded draw scaled by each bound: ratios of exactly 2 until the cap)."""
    policy = RetryPolicy(attempts=10, base_delay_s=0.01, max_delay_s=0.1)
    bounds = [0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1]
    for seed in range(5):
        waits = [backoff_delay(a, policy, random.Random(seed)) for a in range(1, 8)]
        unit = random.Random(seed).uniform(0, 1)
        assert waits == pytest.approx([unit * b for b in bounds], rel=1e-12)
    # Jitter: one generator's successive waits are spread over [0, bound], not the bound.
    jitter = random.Random(7)
    capped = [backoff_delay(9, policy, jitter) for _ in range(200)]
    assert max(capped) <= 0.1 and min(capped) < 0.01 and max(capped) > 0.09
    assert len(set(capped)) == 200


class NoCredentialsError(Exception):
    """Named as botocore's: a credentials error is known by its type's name."""


@pytest.mark.parametrize(
    "exc",
    [FileNotFoundError("gone"), IsADirectoryError("dir"), NotADirectoryError("not a dir"),
     PermissionError("denied"), ValueError("bad bytes"), TypeError("bad type"),
     NoCredentialsError("Unable to locate credentials")],
    ids=lambda e: type(e).__name__,
)  # fmt: skip
def test_each_permanent_error_is_called_once_and_never_retried(exc) -> None:
    """The family of PERMANENT_ERRORS (and credential errors known by name): one call, no
    retry, the error says it failed on attempt 1."""
    calls, retried = [], []

    def fn() -> None:
        calls.append(1)
        raise exc

    policy = RetryPolicy(attempts=5, base_delay_s=0.0001, max_delay_s=0.0001, timeout_s=None)
    with pytest.raises(Exception, match="failed on attempt 1") as info:
        call_with_retries(fn, what="x", policy=policy, on_retry=retried.append)
    assert len(calls) == 1 and not retried
    assert isinstance(info.value, (type(exc), PermissionError))
