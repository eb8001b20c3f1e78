"""The CPU of threads a library starts (iolib.decode.native_threads), on Linux."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from iolib.decode import native_threads
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
        _assert_cpu_counted(pool, worker, stop)
    finally:
        stop.set()
        worker.join(timeout=10)


def _assert_cpu_counted(pool, worker: threading.Thread, stop: threading.Event) -> None:
    assert worker.native_id in pool.ids
    before = cpu_seconds(pool.ids)
    stop.wait(0.2)
    assert cpu_seconds(pool.ids) > before


def test_threads_of_another_name_are_left_out() -> None:
    # A loader's own thread that starts while a pipeline is built counts itself.
    stop = threading.Event()
    with started_threads("[DALI]") as pool:
        worker = threading.Thread(target=stop.wait, args=(10,))
        worker.start()
    stop.set()
    worker.join(timeout=10)
    assert worker.native_id not in pool.ids


def _named_later(named: threading.Event, stop: threading.Event) -> None:
    named.wait(10)
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
        comm.write("[DALI]late")
    _spin_until(stop)


def test_a_thread_that_names_itself_after_the_block_still_counts() -> None:
    # DALI's pool threads name themselves as they start; on a loaded machine the
    # build can return first (CI once charged 0 s of a decode's pool CPU).
    named, stop = threading.Event(), threading.Event()
    with started_threads("[DALI]") as pool:
        worker = threading.Thread(target=_named_later, args=(named, stop))
        worker.start()
    try:
        assert worker.native_id not in pool.ids  # not named yet
        named.set()
        deadline = time.monotonic() + 10
        while worker.native_id not in pool.ids and time.monotonic() < deadline:
            time.sleep(0.01)
        _assert_cpu_counted(pool, worker, stop)
    finally:
        named.set()
        stop.set()
        worker.join(timeout=10)


def test_names_are_read_only_while_a_pool_may_still_be_naming_itself(monkeypatch) -> None:
    # `ids` is read every batch: past the naming window a thread of another name is
    # another library's, and its /proc entry is not read again.
    monkeypatch.setattr(native_threads, "NAMING_S", 0.0)
    named, stop = threading.Event(), threading.Event()
    with started_threads("[DALI]") as pool:
        worker = threading.Thread(target=_named_later, args=(named, stop))
        worker.start()
    try:
        time.sleep(0.01)
        assert pool.ids == ()
        named.set()
        time.sleep(0.05)
        assert worker.native_id not in pool.ids
    finally:
        named.set()
        stop.set()
        worker.join(timeout=10)
