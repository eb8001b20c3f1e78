"""One retry loop for S3: iolib's policy outside, botocore set to one attempt beneath it,
unless the user configured botocore's retries."""

from __future__ import annotations

import copy
import http.server
import threading
from collections.abc import Iterator

import pytest

from iolib.storage import RetryPolicy, call_with_retries, open_filesystem
from iolib.storage.retries import BOTOCORE_RETRIES
from tests.fixtures_s3 import s3_options  # noqa: F401

pytestmark = pytest.mark.s3

USER_CONFIGS = [
    None,
    {"max_pool_connections": 3},
    {"retries": {"mode": "adaptive", "total_max_attempts": 7}},
    {"retries": {"max_attempts": 0}, "max_pool_connections": 3},
]


@pytest.mark.parametrize("chained", [False, True], ids=["plain", "chained"])
@pytest.mark.parametrize("user", USER_CONFIGS, ids=["none", "no-retries", "retries", "both"])
def test_botocore_retries_default_to_one_attempt_and_a_users_config_is_kept(
    s3_options,  # noqa: F811
    user,
    chained,
    monkeypatch,
) -> None:
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    inner = dict(s3_options)
    if user is not None:
        inner["config_kwargs"] = user
    options = {"s3": inner, "throttled": {"skip_instance_cache": True}} if chained else inner
    given = copy.deepcopy(options)
    url = "throttled::s3://iolib-bench/x" if chained else "s3://iolib-bench/x"
    fs, _ = open_filesystem(url, options)
    s3 = fs.fs if chained else fs
    expected = {**(user or {}), "retries": (user or {}).get("retries", BOTOCORE_RETRIES)}
    assert s3.config_kwargs == expected
    s3.ls("iolib-bench")  # the client is built: its config is what botocore runs with
    live, asked = s3.s3.meta.config.retries, expected["retries"]
    total = asked.get("total_max_attempts", asked.get("max_attempts", -1) + 1)
    assert live["total_max_attempts"] == total
    assert live.get("mode", "legacy") == asked.get("mode", "legacy")
    assert options == given, "the caller's storage options were changed"


def test_aws_retry_environment_variables_are_the_users_choice(s3_options, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    fs, _ = open_filesystem("s3://iolib-bench/x", s3_options)
    assert "retries" not in (fs.config_kwargs or {})


class _Failing(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint whose every request fails with 500 InternalError."""

    hits = 0

    def _fail(self) -> None:
        type(self).hits += 1
        body = b"<Error><Code>InternalError</Code><Message>down</Message></Error>"
        self.send_response(500)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _fail

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def failing_s3() -> Iterator[dict]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Failing.hits = 0
    try:
        yield {
            "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}",
            "key": "testing",
            "secret": "testing",
            "skip_instance_cache": True,
        }
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("attempts", [1, 3])
def test_a_failing_s3_read_is_tried_as_often_as_the_policy_says(
    failing_s3, attempts, monkeypatch
) -> None:
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    fs, path = open_filesystem("s3://iolib-bench/x.parquet", failing_s3)
    policy = RetryPolicy(attempts=attempts, base_delay_s=0.001, max_delay_s=0.001)
    with pytest.raises(OSError, match=r"s3://iolib-bench/x\.parquet"):
        call_with_retries(
            lambda: fs.cat_file(path, start=0, end=10), what="s3://iolib-bench/x.parquet",
            policy=policy,
        )  # fmt: skip
    assert _Failing.hits == attempts, "retry loops beneath iolib's multiplied its attempts"
