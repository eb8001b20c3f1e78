"""Worker hygiene and lifecycle, side by side with torch's DataLoader where it can run.

Real threads and processes; scripts run in subprocesses where a test needs a fresh
interpreter (the parent's thread pool, SIGKILL, what prints at exit). psutil counts what
is left. Nothing here asserts a speed: deadlines are generous bounds against hangs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import weakref
from pathlib import Path

import psutil
import pytest
import torch
from torch.utils.data import Dataset

from iolib import DataLoader
from iolib.engine import Engine
from iolib.errors import WorkerDied, WorkerError
from tests.conftest import write_parquet_shards

REPO = Path(__file__).resolve().parents[1]
LOADERS = {"torch": torch.utils.data.DataLoader, "iolib": DataLoader}


def _run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `script` from a file (spawn's children import their target from it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "script.py"
        path.write_text(textwrap.dedent(script))
        return subprocess.run(
            [sys.executable, str(path), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _iolib_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("iolib-")}


def _released(before_threads: set, before_kids: set[int], timeout: float = 10.0) -> tuple:
    """Wait until the threads and child processes started since `before` are gone."""
    deadline = time.monotonic() + timeout
    while True:
        kids = {p.pid for p in psutil.Process().children(recursive=True)} - before_kids
        threads = _iolib_threads() - before_threads
        if (not kids and not threads) or time.monotonic() > deadline:
            return kids, threads
        time.sleep(0.05)


# -- 1. one intra-op thread per process worker -----------------------------------------

DEADLOCK = """
import sys, torch
import iolib
from torch.utils.data import Dataset

class Images(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        x = torch.rand(3, 224, 224).mul(2).sum(0)  # a parallel op in the worker
        return torch.tensor([i, torch.get_num_threads(), x.shape[0]])

a = torch.rand(1500, 1500)
a @ a  # the parent's intra-op pool is now in use
make = torch.utils.data.DataLoader if sys.argv[1] == "torch" else iolib.DataLoader
print([b.tolist() for b in make(Images(), batch_size=2, num_workers=2)], flush=True)
"""


@pytest.mark.parametrize("kind", ["torch", "iolib"])
def test_parallel_op_in_worker_after_parent_used_its_thread_pool(kind: str) -> None:
    run = _run(DEADLOCK, kind, timeout=180)  # it hung forever before the fix
    assert run.returncode == 0, run.stderr
    batches = eval(run.stdout)  # our own script's list of lists
    assert batches == [[[i, 1, 224], [i + 1, 1, 224]] for i in range(0, 8, 2)]


# -- 2. parent death ------------------------------------------------------------------

ORPHANS = """
import os, sys, threading, time, torch
from iolib import DataLoader
from torch.utils.data import Dataset

class Slow(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        time.sleep({sample_s})
        return torch.tensor(i)

loader = DataLoader(Slow(), batch_size=2, num_workers=2, worker_mode="process")
it = iter(loader)
print(" ".join(str(pid) for pid in loader.stats()["worker_pids"]), flush=True)
threading.Thread(target=next, args=(it,), daemon=True).start()  # the workers take tasks
time.sleep(600)
"""


@pytest.mark.parametrize("sample_s", [0.01, 3600], ids=["between-tasks", "stuck-in-a-task"])
def test_process_workers_exit_soon_after_the_trainer_is_killed(sample_s: float) -> None:
    # A worker inside a task that never returns (a read stuck on storage) is an orphan
    # too: it must not outlive the trainer any more than an idle one.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    script = ORPHANS.replace("{sample_s}", str(sample_s))
    trainer = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    workers: list[psutil.Process] = []
    try:
        workers = [psutil.Process(int(p)) for p in trainer.stdout.readline().split()]
        assert len(workers) == 2 and all(w.is_running() for w in workers)
        time.sleep(1.5)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        _, alive = psutil.wait_procs(workers, timeout=5)  # the acceptance bound
        assert not alive, f"workers alive 5 s after the trainer's SIGKILL: {alive}"
    finally:
        trainer.kill()
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()


# -- 3, 4. a worker's death reaches next(), with its type and message -----------------


class Plain(Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return torch.tensor(index)


def bad_init(worker_id: int) -> None:
    if worker_id == 1:
        raise ValueError(f"bad init in worker {worker_id}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["torch", "thread", "process"])
def test_worker_init_fn_error_keeps_its_type_message_and_worker(kind: str) -> None:
    if kind == "torch":
        loader = torch.utils.data.DataLoader(
            Plain(), batch_size=2, num_workers=2, worker_init_fn=bad_init
        )
    else:
        loader = DataLoader(
            Plain(), batch_size=2, num_workers=2, worker_mode=kind, worker_init_fn=bad_init
        )
    with pytest.raises(ValueError, match=r"(?s)Caught ValueError in .*worker.* 1.*bad init") as e:
        list(loader)
    assert "Traceback" in str(e.value) and "bad_init" in str(e.value)
    # Free torch's iterator now, by its reference count: its frames in the traceback hold
    # it and the error (a cycle); left to the cyclic collector (during a later test), its
    # queues can go before its __del__ shuts its workers down, which then waits 5 s each.
    traceback.clear_frames(e.tb)
    del e


@pytest.mark.timeout(120)
def test_a_failed_process_worker_waits_to_be_stopped_and_is() -> None:
    """The failed worker stays until stopped, so its error always beats its exit to the
    consumer; once the error is raised, no worker process is left."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    for _ in range(5):
        loader = DataLoader(
            Plain(), batch_size=2, num_workers=2, worker_mode="process", worker_init_fn=bad_init
        )
        with pytest.raises(ValueError, match="bad init in worker 1"):
            list(loader)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = {p.pid for p in psutil.Process().children(recursive=True)} - before
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"worker processes outlived their loader: {sorted(left)}"


class ExitsAt(Dataset):
    """Sample 5 raises `kind` (a BaseException that fetchers do not catch)."""

    def __init__(self, kind: type[BaseException]) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        if index == 5:
            raise self.kind("stop here")
        return torch.tensor(index)


class Custom(BaseException):
    pass


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("kind", [SystemExit, KeyboardInterrupt, Custom])
def test_base_exception_in_a_worker_is_reported_not_hung(mode: str, kind: type) -> None:
    before, kids = _iolib_threads(), {p.pid for p in psutil.Process().children()}
    loader = DataLoader(ExitsAt(kind), batch_size=2, num_workers=2, worker_mode=mode)
    name = kind.__name__
    with pytest.raises(WorkerDied, match=rf"worker {mode} \d \(running a task\) died of {name}"):
        list(loader)
    left_kids, left_threads = _released(before, kids)
    assert not left_kids and not left_threads


def test_thread_killed_by_base_exception_from_init_is_reported() -> None:
    def init(worker_id: int) -> None:
        raise SystemExit(3)

    engine = Engine(lambda task: task, workers=2, depth=2, worker_init_fn=init)
    engine.start(list(range(4)))
    with pytest.raises(WorkerDied, match=r"worker thread \d \(worker_init_fn\) died of SystemExit"):
        engine.next()
    engine.close()


def slow_init(worker_id: int) -> None:
    if worker_id == 1:
        time.sleep(3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["torch", "thread", "process"])
def test_an_init_that_does_not_finish_times_out_under_timeout(kind: str) -> None:
    # In thread mode the other worker can do every batch; the epoch's end still waits
    # for the init (a failure would fail the epoch), and `timeout` bounds that wait.
    options = dict(batch_size=2, num_workers=2, worker_init_fn=slow_init, timeout=1)
    if kind == "torch":
        loader = torch.utils.data.DataLoader(Plain(), **options)
    else:
        loader = DataLoader(Plain(), worker_mode=kind, **options)
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        list(loader)


# -- 5. get_worker_info ---------------------------------------------------------------


class Introspect(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        info = torch.utils.data.get_worker_info()
        same = info is not None and info.dataset is self
        return torch.tensor([info.id, info.num_workers, info.seed, same])


@pytest.mark.parametrize("kind", ["torch", "iolib"])
def test_get_worker_info_in_process_workers_as_in_torch(kind: str) -> None:
    extra = {"worker_mode": "process", "seed": 7} if kind == "iolib" else {}
    loader = LOADERS[kind](Introspect(), batch_size=1, num_workers=2, **extra)
    rows = [b[0].tolist() for b in loader]
    assert torch.utils.data.get_worker_info() is None, "None in the main process"
    assert {r[0] for r in rows} == {0, 1} and {r[1] for r in rows} == {2}
    assert all(r[3] == 1 for r in rows), "info.dataset is the worker's own dataset"
    assert all(r[2] - r[0] == rows[0][2] - rows[0][0] for r in rows), "seed = base + id"


def _info_row(task: int) -> tuple:
    from torch.utils.data import get_worker_info  # bound in the worker, as scripts do

    info = get_worker_info()
    name = threading.current_thread().name
    return (task, info.id, info.num_workers, info.seed, info.dataset, id(info.dataset), name)


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_get_worker_info_in_each_thread_and_process_worker(mode: str) -> None:
    dataset = ["my", "dataset"]
    engine = Engine(
        _info_row, workers=2, depth=4, mode=mode, worker_info_dataset=dataset, base_seed=100
    )
    engine.start(list(range(8)))
    rows = [engine.next()[0] for _ in range(8)]
    engine.close()
    assert [r[0] for r in rows] == list(range(8))
    assert {r[1] for r in rows} <= {0, 1} and {r[2] for r in rows} == {2}
    assert all(r[3] == 100 + r[1] for r in rows), "seed = base_seed + worker id"
    assert all(r[4] == dataset for r in rows)
    if mode == "thread":
        assert all(r[5] == id(dataset) for r in rows), "the dataset itself, not a copy"
        assert all(r[6] == f"iolib-worker-{r[1]}" for r in rows), "each thread its own id"
    assert torch.utils.data.get_worker_info() is None, "None in the main thread"


def test_process_workers_are_seeded_once_per_worker_deterministically() -> None:
    def draws() -> list:
        engine = Engine(_draw, workers=2, depth=2, mode="process", base_seed=11)
        engine.start([0, 1])
        out = [engine.next()[0] for _ in range(2)]
        engine.close()
        return out

    first = draws()
    assert first == draws(), "a pure function of base_seed and the worker id"
    assert {row[0] for row in first} <= {11, 12}


def _draw(task: int) -> tuple:
    import random

    import numpy as np

    return (torch.initial_seed(), random.random(), float(np.random.random()))


def test_thread_batches_are_not_collated_into_shared_memory() -> None:
    """default_collate stacks into shared memory when it sees worker info, to cross a
    process boundary; a thread's batch does not cross one."""
    loader = DataLoader(Plain(), batch_size=4, num_workers=2, worker_mode="thread")
    assert not any(batch.is_shared() for batch in loader)


# -- 6. lifecycle -----------------------------------------------------------------------


def _counts() -> tuple[int, int, set[int]]:
    me = psutil.Process()
    return me.num_fds(), len(_iolib_threads()), {p.pid for p in me.children(recursive=True)}


def _settled(before: tuple[int, int, set[int]], timeout: float = 10.0) -> tuple:
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        fds, threads, kids = _counts()
        extra = (fds - before[0], threads - before[1], kids - before[2])
        extra = (max(0, extra[0]), max(0, extra[1]), extra[2])
        if extra == (0, 0, set()) or time.monotonic() > deadline:
            return extra
        time.sleep(0.05)


class Training(Exception):
    pass


def _train(loader: DataLoader) -> None:
    for _ in loader:
        raise Training  # the training step fails


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("end", ["close", "del", "error", "break"])
def test_nothing_survives_the_loader(mode: str, end: str) -> None:
    make = lambda: DataLoader(Plain(), batch_size=2, num_workers=2, worker_mode=mode)  # noqa: E731
    list(make())  # a first run: lazy imports and their file descriptors
    before = _counts()
    loader = make()
    if end == "error":
        with contextlib.suppress(Training):
            _train(loader)
    else:
        it = iter(loader)
        next(it)
        held = weakref.ref(loader)
    if end == "close":
        loader.close()
        assert _settled(before)[1:] == (0, set()), "close() joins its threads and processes"
        del it  # its frame holds the last batch: in process mode, a shared-memory fd
    elif end == "del":
        del it, loader
        assert held() is None, "the loader (and its workers) is freed without a collection"
    elif end == "break":
        for _batch in it:
            break
        del it, _batch
    fds, threads, kids = _settled(before)
    assert (fds, threads, kids) == (0, 0, set()), f"left: {fds} fds, {threads} threads, {kids}"


def test_a_dropped_engine_stops_its_workers_without_a_collection() -> None:
    before = _counts()
    gc.disable()
    try:
        engine = Engine(lambda task: task, workers=3, depth=3)
        engine.start(list(range(6)))
        engine.next()
        ref = weakref.ref(engine)
        del engine  # no cycle: reference counting frees it, and its finalizer runs
        assert ref() is None
    finally:
        gc.enable()
    assert _settled(before)[1] <= 0


def test_huge_worker_count_starts_only_threads_that_can_have_work() -> None:
    before = _iolib_threads()
    loader = DataLoader(
        Plain(), batch_size=1, num_workers=100_000, worker_mode="thread", prefetch=4
    )
    for k, _ in enumerate(loader):
        assert len(loader.stats()["worker_threads"]) <= 4, "one thread per batch in flight"
        if k == 5:
            break
    assert not loader.stats()["worker_threads"]
    assert not _iolib_threads() - before, "close() joins every thread it started"


FORKED = """
import gc, os, sys, torch
from iolib import DataLoader
from torch.utils.data import Dataset

class Plain(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.tensor(i)

loader = DataLoader(Plain(), batch_size=2, num_workers=2, worker_mode=sys.argv[1])
it = iter(loader)
first = next(it)
pid = os.fork()
if pid == 0:  # a copy of the loader in a forked child: its workers are not the child's
    del it, loader
    gc.collect()
    sys.stderr.flush()
    os._exit(0)
os.waitpid(pid, 0)
rest = list(it)  # the parent's workers still serve it
print(len(rest) + 1, flush=True)
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_forked_copy_never_stops_or_joins_its_parents_workers(mode: str) -> None:
    run = _run(FORKED, mode)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "20"
    assert "Exception ignored" not in run.stderr and "Traceback" not in run.stderr, run.stderr


IN_CHILD = """
import multiprocessing as mp, sys
from iolib import DataLoader
from iolib.sources import ParquetSource

def child():
    # Large batches, deep prefetch: each task's indices (64 KiB) fill the task pipe, so
    # the queue's feeder thread waits in a write that only the worker's reads finish.
    loader = DataLoader(ParquetSource(sys.argv[2]), batch_size=8192, num_workers=2,
                        worker_mode="process", prefetch=16)
    for k, _ in enumerate(loader):
        if k == 1:
            raise RuntimeError("the training step failed")

if __name__ == "__main__":
    proc = mp.get_context(sys.argv[1]).Process(target=child)
    proc.start()
    proc.join(60)
    print("exit", proc.exitcode, flush=True)
    if proc.is_alive():
        proc.kill()
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_loader_in_a_child_process_that_raises_lets_it_exit(context: str, tmp_path: Path) -> None:
    write_parquet_shards(tmp_path, 200_000, shards=1, row_group_size=8192, seq_len=1)
    run = _run(IN_CHILD, context, str(tmp_path / "part-000.parquet"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "exit 1", "the child exits (it hung at exit before)"
    # Only the child's own error: no queue feeder's or finalizer's traceback.
    assert run.stderr.count("Traceback") == 1 and "the training step failed" in run.stderr


AT_EXIT = """
import sys, torch
from iolib import DataLoader
from torch.utils.data import Dataset

class Plain(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.tensor(i)

loader = DataLoader(Plain(), batch_size=2, num_workers=2, worker_mode=sys.argv[1],
                    persistent_workers=True)
list(loader)
it = iter(loader)
next(it)  # exit mid-epoch, with the next batches in flight
print("ok", flush=True)
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_nothing_printed_at_exit_with_persistent_workers(mode: str) -> None:
    run = _run(AT_EXIT, mode)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    assert run.stderr == ""


DALI_AT_EXIT = """
import io, sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from PIL import Image
from iolib import DataLoader
from iolib.decode.images import ImagePipeline
from iolib.sources import ParquetSource

def jpeg(i):
    out = io.BytesIO()
    Image.fromarray(np.full((24, 24, 3), i, np.uint8)).save(out, format="JPEG")
    return out.getvalue()

blobs = pa.array([jpeg(i) for i in range(32)], pa.binary())
pq.write_table(pa.table({"image": blobs, "label": list(range(32))}), sys.argv[1])
decode = ImagePipeline(size=16, device="cpu", threads=1, backend="dali")
loader = DataLoader(ParquetSource(sys.argv[1]), batch_size=4, num_workers=2, decode=decode,
                    persistent_workers=True)
for epoch in range(2):
    for batch in loader:
        pass
print("ok", flush=True)
"""


def test_nothing_printed_at_exit_with_dali_and_persistent_workers(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    for attempt in range(3):  # DALI's exit hook printed about one run in three before
        run = _run(DALI_AT_EXIT, str(tmp_path / f"images-{attempt}.parquet"))
        assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
        assert "Traceback" not in run.stderr and "AssertionError" not in run.stderr, run.stderr


# -- 7. the consumer's wait --------------------------------------------------------------


def test_process_results_reach_the_buffer_without_the_consumer_asking() -> None:
    """A reader thread delivers each result as it lands (the consumer once moved them
    only while polling inside next(), one per 50 ms poll)."""
    engine = Engine(_identity, workers=2, depth=6, mode="process")
    engine.start(list(range(12)))
    assert engine.next()[0] == 0
    deadline = time.monotonic() + 60
    while engine.batches_ready() < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.batches_ready() == 6
    assert [engine.next()[0] for _ in range(11)] == list(range(1, 12))
    engine.close()


def _identity(task: int) -> int:
    return task


def _tensor(task: int) -> torch.Tensor:
    return torch.full((256,), task)  # crosses processes by file descriptor


def test_shrinking_process_workers_loses_no_result() -> None:
    """A retiring worker once exited right after sending its last batches: their
    tensors, fetched from the sender while unpickling, were lost with it, and the
    consumer reported it dead 'with code 0 while holding batches'."""
    engine = Engine(_tensor, workers=3, depth=6, mode="process")
    for round_ in range(3):
        engine.start(list(range(24)))
        out = [int(engine.next()[0][0])]
        engine.set_workers(1)
        out += [int(engine.next()[0][0]) for _ in range(11)]
        engine.set_workers(3)
        out += [int(engine.next()[0][0]) for _ in range(12)]
        assert out == list(range(24)), f"round {round_}"
    engine.close()


def test_an_error_type_that_cannot_cross_processes_still_brings_its_message() -> None:
    class LocalError(Exception):  # pickle cannot send a local class by reference
        pass

    def init(worker_id: int) -> None:
        raise LocalError(f"worker {worker_id} has no shard")

    engine = Engine(_identity, workers=1, depth=1, mode="process", worker_init_fn=init,
                    mp_context="fork")  # fmt: skip
    engine.start([0])
    with pytest.raises(WorkerError, match=r"(?s)Caught LocalError in .*process 0.*has no shard"):
        engine.next()
    engine.close()


def test_a_dropped_persistent_loader_is_freed_without_the_cycle_collector() -> None:
    """After an epoch, persistent workers read the next epoch ahead; what they keep for
    that must not point back at the loader, or a dropped loader lives on (with its
    workers) until gc runs."""
    import gc
    import weakref

    from iolib import DataLoader

    gc.disable()
    try:
        loader = DataLoader(
            list(range(40)), batch_size=4, num_workers=2, worker_mode="thread",
            persistent_workers=True, shuffle=True,
        )  # fmt: skip
        assert len(list(loader)) == 10  # the next epoch is now being read ahead
        alive = weakref.ref(loader)
        del loader
        assert alive() is None, "a reference cycle keeps the dropped loader alive"
    finally:
        gc.enable()


# What interpreter exit does once the atexit hooks ran: module globals become None
# (CPython's _PyModule_ClearDict), then the script's own globals are dropped. The hook is
# registered before torch and iolib are imported, so it runs after multiprocessing's.
_AT_EXIT = """
import atexit, sys

def teardown():
    for name, module in list(sys.modules.items()):
        if module is not None and name.split(".")[0] == "iolib":
            for key in list(vars(module)):
                if not key.startswith("__"):
                    vars(module)[key] = None
    for key in ("iterator", "loader"):
        vars(sys.modules["__main__"]).pop(key, None)

atexit.register(teardown)

import torch
from torch.utils.data import TensorDataset
from {module} import DataLoader

loader = DataLoader(TensorDataset(torch.arange(100)), batch_size=4, shuffle=True, {options})
iterator = iter(loader)  # nanoGPT's get_batch keeps one in module globals
next(iterator)
print("trained")
"""


@pytest.mark.parametrize("kind", ["torch", "iolib"])
@pytest.mark.parametrize(
    "options",
    ["num_workers=0", "num_workers=2", "num_workers=2, persistent_workers=True"],
    ids=["inline", "processes", "persistent"],
)
def test_a_loader_and_iterator_in_module_globals_print_nothing_at_exit(
    kind: str, options: str
) -> None:
    module = "torch.utils.data" if kind == "torch" else "iolib"
    done = _run(_AT_EXIT.format(module=module, options=options), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "trained"
    assert done.stderr == "", f"{kind} printed at exit:\n{done.stderr}"


def _collate_with_lock(samples: list) -> dict:
    return {"x": torch.utils.data.default_collate(samples), "meta": [threading.Lock()]}


def _collate_to_generator(samples: list) -> object:
    return (s for s in samples)


def _collate_lock_on_batch_one(samples: list) -> object:
    batch = torch.utils.data.default_collate(samples)
    return threading.Lock() if int(batch[0]) == 4 else batch


@pytest.mark.parametrize(
    ("collate", "where", "kind"),
    [
        (_collate_with_lock, "batch['meta'][0]", "_thread.lock"),
        (_collate_to_generator, "batch", "builtins.generator"),
    ],
    ids=["nested", "top"],
)
def test_an_unpicklable_collate_result_is_a_worker_error_naming_its_type(
    collate, where: str, kind: str
) -> None:
    # `timeout` bounds the test: before the fix the batch was dropped and awaited forever.
    loader = DataLoader(
        Plain(), batch_size=4, num_workers=2, collate_fn=collate, worker_mode="process", timeout=60
    )
    with pytest.raises(WorkerError) as caught:
        next(iter(loader))
    message = str(caught.value)
    assert where in message and kind in message, message
    assert "timed out" not in message
    assert caught.value.stage == "send" and caught.value.samples == [0, 1, 2, 3]


def test_after_an_unsendable_batch_the_pass_goes_on() -> None:
    loader = DataLoader(
        Plain(),
        batch_size=4,
        num_workers=2,
        collate_fn=_collate_lock_on_batch_one,
        worker_mode="process",
        timeout=60,
    )
    iterator, got, failed = iter(loader), [], []
    for _ in range(len(loader)):
        try:
            got.append(next(iterator)[0].item())
        except WorkerError as exc:
            failed.append(exc.batch)
    assert failed == [1] and got == [0, 8]
