"""moto's S3 server on 127.0.0.1 for tests: started and stopped by the fixture itself."""

from __future__ import annotations

import pytest


def moto_options():
    """s3fs storage options of a fresh moto server with bucket `iolib-bench`, while it runs
    (skips where s3fs or moto's server is not installed)."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from iolib.cli.bench.s3server import moto_s3

    with moto_s3() as options:
        yield options


@pytest.fixture(scope="module")
def s3_options():
    yield from moto_options()
