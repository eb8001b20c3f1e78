"""The CPU of threads a library starts (iolib.decode.native_threads), on Linux."""

from __future__ import annotations

import sys
import threading

import pytest

from iolib.decode.native_threads import cpu_seconds, started_threads

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread CPU clocks by thread id"
)


def _spin_until(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def test_threads_started_in_the_block_are_found_and_their_cpu_read() -> None:
    stop = threading.Event()
    with started_threads() as pool:
        worker = threading.Thread(target=_spin_until, args=(stop,))
        worker.start()
    try:
        assert worker.native_id in pool.ids
        before = cpu_seconds(pool.ids)
        stop.wait(0.2)
        assert cpu_seconds(pool.ids) > before
    finally:
        stop.set()
        worker.join()


def test_threads_of_another_name_are_left_out() -> None:
    # A loader's own thread that starts while a pipeline is built counts itself.
    stop = threading.Event()
    with started_threads("[DALI]") as pool:
        worker = threading.Thread(target=stop.wait)
        worker.start()
    stop.set()
    worker.join()
    assert worker.native_id not in pool.ids
