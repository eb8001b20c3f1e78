"""A real S3 endpoint on 127.0.0.1: moto's ThreadedMotoServer in a child process.

Why a child process: moto serves every request in Python; in the benchmark's own process
it would compete with the loader being measured for the GIL.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
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
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.strip().isdigit():
            raise ConfigError("moto's S3 server did not start. Fix: pip install 'moto[server]'.")
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
            proc.wait()
