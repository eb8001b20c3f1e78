"""A real S3 endpoint on 127.0.0.1: moto's ThreadedMotoServer in a child process.

Why a child process: moto serves every request in Python; in the benchmark's own process
it would compete with the loader being measured for the GIL.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from iolib.errors import ConfigError

_SERVER = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # runs until the parent closes our stdin (or dies)
server.stop()
"""


_START_S = 120.0  # moto's imports take seconds; on a loaded machine, tens of them


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The child's first line of output, or "" when none came within `timeout` seconds
    (a child stuck before printing would otherwise hold the caller forever)."""
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout
    if stdout is None:
        return ""
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return ""


@contextlib.contextmanager
def moto_s3(bucket: str = "iolib-bench") -> Iterator[dict[str, Any]]:
    """Start moto's S3 server, create `bucket`; yield s3fs storage options; stop it.

    >>> with moto_s3() as options:  # doctest: +SKIP
    ...     fs = s3fs.S3FileSystem(**options)
    """
    try:
        import moto.server  # noqa: F401
        import s3fs
    except ImportError as exc:
        raise ConfigError(
            f"The s3 profile needs moto[server] and s3fs ({exc.name} is missing). "
            "Fix: pip install 'moto[server]' s3fs."
        ) from exc
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = _first_line(proc, _START_S)
        if not line.strip().isdigit():
            raise ConfigError(
                f"moto's S3 server did not start (no port within {_START_S:g} s). "
                "Fix: pip install 'moto[server]'."
            )
        options = {
            "endpoint_url": f"http://127.0.0.1:{int(line)}",
            "key": "testing",
            "secret": "testing",
            "skip_instance_cache": True,
        }
        s3fs.S3FileSystem(**options).mkdir(bucket)
        yield options
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
