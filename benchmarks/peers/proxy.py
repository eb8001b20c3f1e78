"""A throttling HTTP reverse proxy on 127.0.0.1, in front of an S3 endpoint (moto).

Every system under test reads through it, so each pays the same per request and per
byte: `latency` seconds before the first byte of each response, at most `conn_rate`
bytes/s on one connection and `total_rate` bytes/s over all of them. It counts
requests (by method) and response body bytes; `GET /__proxy__/stats` returns the
counts as JSON and `POST /__proxy__/reset` zeroes them (neither is counted).

    with ThrottlingProxy("http://127.0.0.1:5000", latency=0.04) as proxy:
        s3fs.S3FileSystem(endpoint_url=proxy.url, ...)

Run alone (the benchmark runs it in a child process, away from the measured loaders'
GIL): ``python -m benchmarks.peers.proxy --upstream URL``; it prints its port.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

CHUNK = 64 * 1024  # bytes paced at a time: small enough that pacing is smooth
CONTROL = "/__proxy__/"
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailers", "transfer-encoding", "upgrade",
}  # fmt: skip


class Pacer:
    """A virtual clock for one byte stream: `take(n)` returns when `n` more bytes may
    pass at `rate` bytes/s (None: unlimited). Shared by threads under its own lock."""

    def __init__(self, rate: float | None) -> None:
        self.rate, self.free_at, self.lock = rate, 0.0, threading.Lock()

    def reserve(self, n: int, now: float) -> float:
        """Book `n` bytes; the time at which they have passed."""
        if not self.rate:
            return now
        with self.lock:
            self.free_at = max(self.free_at, now) + n / self.rate
            return self.free_at


class Counters:
    """Requests by method and response body bytes, since the last reset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.requests: dict[str, int] = {}
            self.bytes_out = 0
            self.bytes_in = 0
            self.connections = 0
            self.max_active = 0
            self.active = 0

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": sum(self.requests.values()),
                "requests_by_method": dict(self.requests),
                "bytes": self.bytes_out,
                "bytes_uploaded": self.bytes_in,
                "connections": self.connections,
                "max_concurrent_requests": self.max_active,
            }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real S3 clients use it
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet: one line per request is noise
        pass

    def setup(self) -> None:
        super().setup()
        self.pacer = Pacer(self.server.conn_rate)  # this connection's own limit
        self.upstream: http.client.HTTPConnection | None = None
        with self.server.counters.lock:
            self.server.counters.connections += 1

    def finish(self) -> None:
        super().finish()
        if self.upstream is not None:
            self.upstream.close()

    def _control(self) -> None:
        counters = self.server.counters
        if self.path.endswith("reset"):
            counters.reset()
        body = json.dumps(counters.snapshot()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _forward(self) -> None:
        if self.path.startswith(CONTROL):
            return self._control()
        counters = self.server.counters
        with counters.lock:
            counters.requests[self.command] = counters.requests.get(self.command, 0) + 1
            counters.active += 1
            counters.max_active = max(counters.max_active, counters.active)
        try:
            self._relay(counters)
        finally:
            with counters.lock:
                counters.active -= 1

    def _relay(self, counters: Counters) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        response = self._upstream_request(body, headers)
        with counters.lock:
            counters.bytes_in += length
        time.sleep(self.server.latency)  # the store's time to first byte
        self.send_response(response.status, response.reason)
        size = response.getheader("Content-Length")
        data = None if size is not None or self.command == "HEAD" else response.read()
        for key, value in response.getheaders():
            if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                self.send_header(key, value)
        self.send_header("Content-Length", size if data is None else str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            response.read()
            return
        if data is not None:
            self._paced_write(data, counters)
            return
        while chunk := response.read(CHUNK):
            self._paced_write(chunk, counters)

    def _upstream_request(self, body: bytes | None, headers: dict[str, str]):
        for attempt in range(2):  # a kept-alive upstream connection may have closed
            if self.upstream is None:
                host, port = self.server.upstream
                self.upstream = http.client.HTTPConnection(host, port, timeout=120)
            try:
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                return self.upstream.getresponse()
            except (ConnectionError, http.client.HTTPException):
                self.upstream.close()
                self.upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _paced_write(self, data: bytes, counters: Counters) -> None:
        view = memoryview(data)
        for lo in range(0, len(view), CHUNK):
            piece = view[lo : lo + CHUNK]
            now = time.monotonic()
            until = max(
                self.pacer.reserve(len(piece), now), self.server.total.reserve(len(piece), now)
            )
            if until > now:
                time.sleep(until - now)
            with counters.lock:  # before the write: a client may read the stats at once
                counters.bytes_out += len(piece)
            self.wfile.write(piece)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


class ThrottlingProxy:
    """The proxy in a background thread of this process (see the module docstring).

    upstream: the endpoint's URL. latency: seconds to first byte of each response.
    conn_rate, total_rate: bytes/s on one connection and over all (None: unlimited).
    """

    def __init__(
        self,
        upstream: str,
        *,
        latency: float = 0.04,
        conn_rate: float | None = 5e6,
        total_rate: float | None = 20e6,
        port: int = 0,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"`upstream` must be http://HOST:PORT. Found: {upstream!r}.")
        if latency < 0:
            raise ValueError(f"`latency` must be >= 0 seconds. Found: {latency!r}.")
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.server.upstream = (parts.hostname, parts.port)
        self.server.latency = latency
        self.server.conn_rate = conn_rate
        self.server.total = Pacer(total_rate)
        self.server.counters = Counters()
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stats(self) -> dict[str, Any]:
        return self.server.counters.snapshot()

    def reset(self) -> None:
        self.server.counters.reset()

    def start(self) -> ThrottlingProxy:
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> ThrottlingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    import click

    @click.command()
    @click.option("--upstream", required=True, help="The S3 endpoint, http://HOST:PORT.")
    @click.option("--latency", default=0.04, show_default=True, help="Seconds to first byte.")
    @click.option("--conn-mbps", default=5.0, show_default=True, help="MB/s a connection.")
    @click.option("--total-mbps", default=20.0, show_default=True, help="MB/s in all.")
    def run(upstream: str, latency: float, conn_mbps: float, total_mbps: float) -> None:
        proxy = ThrottlingProxy(
            upstream, latency=latency, conn_rate=conn_mbps * 1e6 or None,
            total_rate=total_mbps * 1e6 or None,
        ).start()  # fmt: skip
        print(proxy.server.server_address[1], flush=True)
        sys.stdin.read()  # runs until the parent closes our stdin (or dies)
        proxy.stop()

    run()


if __name__ == "__main__":
    main()
