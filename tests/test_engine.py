"""The engine: ordered delivery, bounded depth, live resizing, clean shutdown, no hangs."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import torch
from torch.utils.data import Dataset

from iolib import DataLoader
from iolib.engine import Engine
from iolib.errors import WorkerDied, WorkerError


def slow_first(task: int) -> int:
    """Task 0 is slow; the rest are fast."""
    time.sleep(0.4 if task == 0 else 0.0)
    return task


def test_ordered_delivery_and_others_buffer_behind_a_slow_batch() -> None:
    engine = Engine(slow_first, workers=3, depth=6)
    engine.start(list(range(12)))
    first, _ = engine.next()
    assert first == 0
    assert engine.batches_ready() >= 3, "finished later batches must wait in the buffer"
    rest = [engine.next()[0] for _ in range(11)]
    assert rest == list(range(1, 12))
    engine.close()


def test_depth_bounds_work_in_flight_and_can_change_live() -> None:
    running = {"now": 0, "peak": 0}
    lock = threading.Lock()

    def tracked(task: int) -> int:
        with lock:
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
        time.sleep(0.01)
        with lock:
            running["now"] -= 1
        return task

    engine = Engine(tracked, workers=8, depth=2)
    engine.start(list(range(40)))
    out = [engine.next()[0] for _ in range(20)]
    assert running["peak"] <= 2
    engine.set_depth(6)
    engine.set_workers(3)
    out += [engine.next()[0] for _ in range(20)]
    assert out == list(range(40))
    engine.close()


def test_loader_batches_unchanged_by_live_changes(token_dir) -> None:
    from iolib.sources import ParquetSource

    def run(change: bool) -> list[list[int]]:
        loader = DataLoader(
            ParquetSource(str(token_dir)), batch_size=5, shuffle=True, num_workers=2
        )
        out = []
        for k, batch in enumerate(loader):
            if change and k == 3:
                loader.set_prefetch(depth=7, workers=4)
            if change and k == 9:
                loader.set_prefetch(depth=1, workers=1)
            out.append(batch["id"].tolist())
        return out

    assert run(True) == run(False)


def test_no_threads_leaked_after_early_break_or_error(token_dir) -> None:
    from iolib.sources import ParquetSource

    before = {t for t in threading.enumerate() if t.name.startswith("iolib-worker")}
    loader = DataLoader(ParquetSource(str(token_dir)), batch_size=5, num_workers=4)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = {t for t in threading.enumerate() if t.name.startswith("iolib-worker")} - before
        if not alive:
            break
        time.sleep(0.05)
    assert not alive, f"leaked worker threads: {alive}"


class Sleepy(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        if index == 5:
            time.sleep(30)
        return torch.tensor(index)


def test_timeout_raises_instead_of_hanging() -> None:
    loader = DataLoader(Sleepy(), batch_size=2, num_workers=2, worker_mode="thread", timeout=0.5)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"timed out after 0.5 seconds .* for batch 2"):
        list(loader)
    assert time.monotonic() - start < 10


class SelfKilling(Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int):
        if index == 9:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tensor(index)


def test_killed_process_worker_is_reported_with_exit_code() -> None:
    loader = DataLoader(SelfKilling(), batch_size=2, num_workers=2, worker_mode="process")
    start = time.monotonic()
    with pytest.raises(WorkerDied, match=r"exited with code -9 while holding batches \[[0-9, ]*4"):
        list(loader)
    assert time.monotonic() - start < 30
    stats = loader.stats()
    assert not stats["worker_pids"], "workers must be released after an error"


def test_persistent_workers_survive_epochs_and_close() -> None:
    class Plain(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, index):
            return torch.tensor(index)

    loader = DataLoader(
        Plain(), batch_size=3, num_workers=2, worker_mode="thread", persistent_workers=True
    )
    list(loader)
    threads = loader.stats()["worker_threads"]
    assert threads, "persistent workers outlive the epoch"
    list(loader)
    assert loader.stats()["worker_threads"] == threads, "persistent workers are reused"
    loader.close()
    assert loader.stats()["worker_threads"] == []


class Numbers(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return torch.tensor(index)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_stats_name_the_live_workers_and_none_once_closed(mode: str) -> None:
    loader = DataLoader(
        Numbers(), batch_size=2, num_workers=2, worker_mode=mode, persistent_workers=True
    )
    next(iter(loader))
    stats = loader.stats()
    if mode == "process":
        children = {p.pid for p in psutil.Process().children()}
        assert len(stats["worker_pids"]) == 2 and set(stats["worker_pids"]) <= children
    else:
        ours = {t.native_id for t in threading.enumerate()}
        assert stats["worker_threads"] and set(stats["worker_threads"]) <= ours
    loader.close()
    assert loader.stats()["worker_pids"] == loader.stats()["worker_threads"] == []


def test_follow_reads_the_next_sequence_ahead_and_advance_keeps_it() -> None:
    engine = Engine(lambda task: task, workers=2, depth=3)
    engine.start([0, 1, 2])
    engine.follow(lambda: [10, 11, 12, 13])
    assert [engine.next()[0] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(StopIteration):
        engine.next()  # the followed sequence starts only when advanced to
    deadline = time.monotonic() + 10
    while engine.batches_ready() < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert engine.batches_ready() == 3, "the next sequence's first batches, up to the depth"
    assert list(engine.advance()) == [10, 11, 12, 13]
    assert [engine.next()[0] for _ in range(4)] == [10, 11, 12, 13]
    with pytest.raises(StopIteration):
        engine.next()
    with pytest.raises(RuntimeError, match="advance"):
        engine.advance()  # nothing followed
    engine.start([5, 6])  # a new start discards whatever was read ahead
    engine.follow(lambda: [99])
    engine.start([7])
    assert engine.next()[0] == 7
    with pytest.raises(RuntimeError, match="advance"):
        engine.advance()
    engine.close()


def test_superseded_iterator_does_not_stop_the_live_one(token_dir) -> None:
    from iolib.sources import ParquetSource

    loader = DataLoader(ParquetSource(str(token_dir)), batch_size=4, num_workers=2, timeout=20)
    first = iter(loader)
    next(first)
    second = iter(loader)
    head = next(second)
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    del first
    rest = list(second)
    assert head["id"].tolist() == [0, 1, 2, 3] and len(rest) == 24
