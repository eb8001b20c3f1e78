"""The CPU of threads a library starts (iolib.decode.native_threads), on Linux."""

from __future__ import annotations

import sys
import threading
import time

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


def test_a_thread_that_names_itself_after_the_block_still_counts() -> None:
    # DALI's pool threads name themselves as they start; on a loaded machine the
    # build can return first (CI once charged 0 s of a decode's pool CPU).
    named, stop = threading.Event(), threading.Event()

    def late_named() -> None:
        named.wait()
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write("[DALI]late")
        _spin_until(stop)

    with started_threads("[DALI]") as pool:
        worker = threading.Thread(target=late_named)
        worker.start()
    try:
        assert worker.native_id not in pool.ids  # not named yet
        named.set()
        deadline = time.monotonic() + 10
        while worker.native_id not in pool.ids and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.native_id in pool.ids
        before = cpu_seconds(pool.ids)
        stop.wait(0.2)
        assert cpu_seconds(pool.ids) > before
    finally:
        named.set()
        stop.set()
        worker.join()
