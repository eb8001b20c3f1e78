"""Lifecycle: once a loader with two workers is dropped (``del loader; gc.collect()``),
after a full pass, a partial one, or an exception in the training loop, no worker process
remains and the thread count is back to what it was."""

from __future__ import annotations

import gc
import threading
import time

import psutil
import pytest

from tests.conformance.conftest import Numbers, batches, reference

DEADLINE_S = 8.0  # generous for a loaded machine; a clean shutdown takes well under 1 s
HELPERS = ("resource_tracker", "forkserver")  # multiprocessing's own, not workers


def children() -> set[int]:
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if not any(h in " ".join(child.cmdline()) for h in HELPERS):
                found.add(child.pid)
        except psutil.Error:  # exited meanwhile
            continue
    return found


def settle(baseline_children: set[int], baseline_threads: int) -> tuple[set[int], int]:
    """Wait (up to the deadline) for new children to exit and threads to end."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        gc.collect()
        extra = children() - baseline_children
        threads = threading.active_count()
        if (not extra and threads <= baseline_threads) or time.monotonic() > deadline:
            return extra, threads
        time.sleep(0.05)


@pytest.fixture
def baseline():
    gc.collect()
    return children(), threading.active_count()


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_no_workers_left_after_full_epochs(Loader, baseline, persistent) -> None:
    loader = Loader(Numbers(40), batch_size=4, num_workers=2, persistent_workers=persistent)
    for _ in range(2):
        seen = 0
        for batch in loader:
            seen += len(batch[0])
            if seen == 4:
                assert children() - baseline[0], "the workers should be running"
        assert seen == 40
    del loader, batch
    extra, threads = settle(*baseline)
    assert not extra, f"worker processes still alive: {sorted(extra)}"
    assert threads <= baseline[1], f"{threads} threads, {baseline[1]} before"


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_no_workers_left_after_a_partial_epoch(Loader, baseline, persistent) -> None:
    loader = Loader(Numbers(400), batch_size=4, num_workers=2, persistent_workers=persistent)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    del iterator, loader
    extra, threads = settle(*baseline)
    assert not extra, f"worker processes still alive: {sorted(extra)}"
    assert threads <= baseline[1], f"{threads} threads, {baseline[1]} before"


class TrainingDiverged(Exception):
    pass


def train_until_it_raises(loader) -> None:
    for step, _batch in enumerate(loader):
        if step == 2:
            raise TrainingDiverged("loss is nan at step 2")


@pytest.mark.parametrize("persistent", [False, True], ids=["transient", "persistent"])
def test_exception_in_the_loop_body_leaves_no_workers(Loader, baseline, persistent) -> None:
    loader = Loader(Numbers(400), batch_size=4, num_workers=2, persistent_workers=persistent)
    try:
        train_until_it_raises(loader)
    except TrainingDiverged:
        pass  # the traceback (which holds the iterator) is released when this block ends
    else:
        raise AssertionError("the training loop should have raised")
    del loader
    extra, threads = settle(*baseline)
    assert not extra, f"worker processes still alive: {sorted(extra)}"
    assert threads <= baseline[1], f"{threads} threads, {baseline[1]} before"


def test_persistent_workers_give_torch_batches_every_epoch(Loader) -> None:
    loader = Loader(Numbers(10), batch_size=3, num_workers=2, persistent_workers=True)
    expected = reference(Numbers(10), batch_size=3)
    for epoch in range(3):
        assert batches(loader) == expected, f"epoch {epoch}"
    del loader
