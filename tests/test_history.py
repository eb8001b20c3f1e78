"""The run history: what prefetch="auto" records, where a warm run starts, and a history
that is corrupted, crafted, foreign or written by 64 processes at once."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from iolib import DataLoader
from iolib.sources import ParquetSource
from predictors.history import (
    MAX_SAMPLES,
    HistoryWarning,
    RunHistory,
    RunRecord,
    WarmStart,
    WorkloadKey,
)
from tests.conftest import run_cli
from tests.fixtures_s3 import s3_options  # noqa: F401

KEY = WorkloadKey("0123abcd", 8, "", 20.0, 2, 8 << 30, "")


def record(run: str, workers: int = 2, depth: int = 4, **changes) -> RunRecord:
    fields = dict(
        workload=KEY.digest(), run_id=run, rank=0, started=time.time(), source="auto",
        workers=workers, depth=depth, batch_size=8, storage_ms=3.0, decode_ms=0.0,
        cpu_ms=1.0, service_ms=[4.0, 5.0, 4.5, 9.0], lateness_ms=[0.0, 0.5],
        utilization=0.95, utilization_se=0.01, memory_bytes=depth * 1000, step_ms=20.0,
        batches=40, target=0.9, met=True, settled=True, base=KEY.base_digest(),
    )  # fmt: skip
    fields.update(changes)
    return RunRecord(**fields)


class Sleepy(torch.utils.data.Dataset):
    """Each sample waits `delay` seconds, as a read from slow storage would."""

    delay = 0.003

    def __len__(self) -> int:
        return 192

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.tensor([i, i * 7])


def _train(history, *, step_s: float = 0.008, epochs: int = 1, seed: int = 0, **kw):
    """One run of a training loop with a sleeping step: (batches, the loader)."""
    loader = DataLoader(
        Sleepy(), batch_size=4, shuffle=True, seed=seed, num_workers=6, worker_mode="thread",
        prefetch="auto", target_utilization=0.9, history=history, **kw,
    )  # fmt: skip
    batches = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            batches.append(batch.clone())
            time.sleep(step_s)
    loader.close()
    return batches, loader


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# -- recording and warm runs ---------------------------------------------------------------
def test_a_run_records_what_it_measured_and_the_next_starts_where_it_met(tmp_path) -> None:
    _, cold = _train(tmp_path)
    store = RunHistory(tmp_path)
    [workload] = store.workloads()
    records = store.runs(workload)
    assert records and all(r.source == "auto" and (r.batches >= 8 or r.settled) for r in records)
    assert sum(r.settled for r in records) <= 1  # 0 if it changed in its last batches
    cold_report = cold.stats()["tuner"]["history"]
    assert cold_report["runs"] == 0 and cold_report["started_from"] is None
    assert cold.stats()["tuner"]["decisions"][0]["batch"] > 0  # cold: it started at (1, 1)

    expected = WarmStart.from_records(records, 0.9, max_workers=6)
    _, warm = _train(tmp_path)
    report = warm.stats()["tuner"]["history"]
    assert report["runs"] == 1 and report["workload"] == workload
    assert report["started_from"] == expected.describe()
    # The warm run's first batch was served at the recorded configuration: the tuner's
    # start, applied before the first batch (no decision needed to get there).
    assert warm.autotune.tuner.start == expected.start
    # Both recorded (under another digest if the load moved the measured step a bucket).
    assert len({r.run_id for w in store.workloads() for r in store.runs(w)}) == 2


def test_the_warm_start_is_the_least_memory_that_met(tmp_path) -> None:
    store = RunHistory(tmp_path)
    store.append([record("a", 4, 16, utilization=0.97, memory_bytes=16_000, settled=False)])
    store.append([record("a", 2, 4, utilization=0.80, memory_bytes=4_000)])
    store.append([record("b", 3, 8, utilization=0.93, memory_bytes=8_000)])
    warm = WarmStart.from_records(store.runs(KEY.digest()), 0.9)
    assert warm.start == (3, 8) and warm.met and warm.runs == 2
    # Within a budget that excludes it, the next cheapest that met; none: the last settled.
    assert WarmStart.from_records(store.runs(KEY.digest()), 0.9, memory_budget=5_000).start == (
        2,
        4,
    )
    assert not WarmStart.from_records(store.runs(KEY.digest()), 0.99).met


def test_a_few_batches_that_met_between_bursts_are_no_warm_start() -> None:
    # 8 batches at 2/4 met by chance (between two bursts); 4/8 met over 40: the start.
    few = record("a", 2, 4, utilization=0.97, batches=8, memory_bytes=4_000)
    long = record("a", 4, 8, utilization=0.93, batches=40, memory_bytes=8_000)
    short_miss = record("b", 2, 4, utilization=0.85, batches=40, memory_bytes=4_000)
    assert WarmStart.from_records([few, long], 0.9).start == (4, 8)
    # Pooled by batches: 8 batches at 0.97 and 40 at 0.85 do not meet.
    assert WarmStart.from_records([few, short_miss, long], 0.9).start == (4, 8)
    # Nothing measured long enough: a short meet still starts the run.
    assert WarmStart.from_records([few], 0.9).start == (2, 4)


def test_a_meet_inside_its_own_noise_is_no_warm_start() -> None:
    # 2/4 met on its mean over 32 bursty batches (0.91, give or take 0.04); 4/8 met by
    # more than its spread: the start. A meet that clears its spread stays the cheapest.
    noisy = record("a", 2, 4, utilization=0.91, utilization_se=0.04, batches=32)
    sure = record("b", 4, 8, utilization=0.95, utilization_se=0.01, batches=32)
    warm = WarmStart.from_records([noisy, sure], 0.9)
    assert warm.start == (4, 8) and warm.met
    calm = record("a", 2, 4, utilization=0.95, utilization_se=0.02, batches=32)
    assert WarmStart.from_records([calm, sure], 0.9).start == (2, 4)
    # Nothing clears its spread: the cheapest that met on the mean still starts the run.
    assert WarmStart.from_records([noisy], 0.9).start == (2, 4)


def _states(service_ms: float, step_ms: float, n: int = 40):
    from predictors.state import TunerState

    for i in range(n):
        yield TunerState(
            batch_index=i, workers=2, depth=4, batch_size=8, step_ms=step_ms, stall_ms=0.0,
            read_ms=service_ms, decode_ms=0.0, bytes_per_batch=1000.0, memory_bytes=4000.0,
            cpu_count=2,
        )  # fmt: skip


@pytest.mark.parametrize(
    "service_ms, step_ms, why",
    [(10.0, 20.0, None), (100.0, 20.0, "regime shift (slower)"), (10.0, 60.0, "step 60.0 ms")],
)
def test_the_detector_tells_another_workload_from_the_history(service_ms, step_ms, why) -> None:
    from predictors.tuner import LearnedTuner

    history = [record(f"r{i}", service_ms=[9.0, 10.0, 11.0, 10.0] * 4) for i in range(3)]
    warm = WarmStart.from_records(history, 0.9)
    tuner = LearnedTuner(target_utilization=0.9, warm=warm)
    first = tuner.decide(next(_states(service_ms, step_ms)))
    assert (first.workers, first.depth) == (2, 4)  # the warm start, before any batch
    for state in _states(service_ms, step_ms):
        tuner.decide(state)
    assert (tuner.warm_set_aside or "").startswith(why or "") and (why is None) == (
        tuner.warm_set_aside is None
    )


def test_a_workload_that_changed_sets_the_history_aside_once(tmp_path, caplog) -> None:
    _train(tmp_path)
    Sleepy.delay = 0.06  # storage twenty times slower: the same dataset, another regime
    try:
        with caplog.at_level(logging.INFO, logger="iolib.tuning"):
            _, slow = _train(tmp_path)
    finally:
        Sleepy.delay = 0.003
    report = slow.stats()["tuner"]["history"]
    assert report["runs"] == 1
    # The detector reads it (test above); on a loaded machine the step measured may
    # drift past the history's first, which sets the history aside too.
    assert report["set_aside"].startswith(("regime shift (slower)", "step "))
    said = [r for r in caplog.records if "history is set aside" in r.getMessage()]
    assert len(said) == 1


def test_another_step_time_sets_the_history_aside(tmp_path) -> None:
    _train(tmp_path, step_s=0.008)
    _, slower_step = _train(tmp_path, step_s=0.04)
    report = slower_step.stats()["tuner"]["history"]
    assert report["runs"] == 1 and report["set_aside"].startswith("step ")
    # Recorded as a workload of its own (the step is part of the key).
    assert len(RunHistory(tmp_path).workloads()) == 2


def test_history_false_and_off_write_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("IOLIB_HISTORY", str(tmp_path / "env"))
    _, loader = _train(False)
    assert not (tmp_path / "env").exists() and loader.stats()["tuner"]["history"] is None
    monkeypatch.setenv("IOLIB_HISTORY", "off")
    _, loader = _train(None)
    assert loader.stats()["tuner"]["history"] is None
    monkeypatch.setenv("IOLIB_HISTORY", str(tmp_path / "env"))
    _train(None)  # the default: $IOLIB_HISTORY
    assert _files(tmp_path / "env")


def test_batches_are_the_same_with_history_off_cold_and_warm(tmp_path) -> None:
    off, _ = _train(False, epochs=2, seed=3)
    cold, _ = _train(tmp_path, epochs=2, seed=3)
    warm, loader = _train(tmp_path, epochs=2, seed=3)
    assert loader.stats()["tuner"]["history"]["runs"] == 1
    assert len(off) == len(cold) == len(warm) == 96
    for a, b, c in zip(off, cold, warm, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_no_secret_reaches_the_history(tmp_path) -> None:
    import fsspec

    secret = "SECRETVALUE9HIST"
    url = f"memory://AKIAFAKEKEY7:{secret}@hist-bucket"
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": np.arange(96), "x": np.arange(96) * 2}), buffer)
    fsspec.filesystem("memory").pipe(
        f"{url.split('://')[1]}/train/part-0.parquet", buffer.getvalue().to_pybytes()
    )
    source = ParquetSource(f"{url}/train", storage_options={"secret": secret})
    loader = DataLoader(
        source, batch_size=4, num_workers=2, prefetch="auto", history=tmp_path, seed=0
    )
    for _ in range(3):
        for _batch in loader:
            time.sleep(0.004)
    loader.close()
    written = _files(tmp_path)
    assert written
    for path in written:
        assert secret.encode() not in path.read_bytes() and b"AKIAFAKEKEY7" not in path.read_bytes()
    assert secret not in json.dumps(loader.stats(), default=str)


# -- a history that is not sound -----------------------------------------------------------
def _crafted(directory: Path, name: str, **changes) -> Path:
    """A file in the history's own format holding one record changed past what is sound."""
    row = dataclasses.asdict(record("crafted"))
    row.update(changes)
    from predictors.history import _schema

    path = directory / name
    pq.write_table(pa.Table.from_pylist([row], schema=_schema()), path)
    return path


def test_broken_files_are_skipped_with_a_warning_naming_each(tmp_path) -> None:
    store = RunHistory(tmp_path)
    [good] = store.append([record("good", 3, 8)])
    directory = Path(good).parent
    truncated = directory / "00000000000000000002-truncated-r0.parquet"
    truncated.write_bytes(Path(good).read_bytes()[:-40])
    (directory / "00000000000000000003-empty-r0.parquet").write_bytes(b"")
    (directory / "00000000000000000004-garbage-r0.parquet").write_bytes(b"PAR1 not at all")
    pq.write_table(
        pa.table({"workers": [1], "note": ["another tool"]}),
        directory / "00000000000000000005-foreign-r0.parquet",
    )
    _crafted(directory, "00000000000000000006-negative-r0.parquet", workers=-3)
    _crafted(directory, "00000000000000000007-nan-r0.parquet", utilization=float("nan"))
    _crafted(directory, "00000000000000000008-long-r0.parquet", service_ms=[0.0] * 1_000_000)
    other = dataclasses.replace(record("x"), workload="f" * 16, base="f" * 16)
    _crafted(directory, "00000000000000000009-other-r0.parquet", **dataclasses.asdict(other))
    bad = sorted(p.name for p in directory.iterdir() if "good" not in p.name)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = store.runs(KEY.digest())
    named = [str(w.message) for w in caught if issubclass(w.category, HistoryWarning)]
    assert [r.run_id for r in records] == ["good"]
    for name in bad:
        assert sum(name in text for text in named) == 1, (name, named)
    # And the plan is the sound file's: the crafted ones change nothing.
    assert WarmStart.from_records(records, 0.9).start == (3, 8)


def test_a_record_that_is_not_sound_is_refused_on_write(tmp_path) -> None:
    store = RunHistory(tmp_path)
    with pytest.raises(ValueError, match="utilization"):
        store.append([record("r", utilization=float("nan"))])
    assert not _files(tmp_path)
    store.append([record("r", service_ms=[1.0] * (3 * MAX_SAMPLES))])
    assert len(store.runs(KEY.digest())[0].service_ms) == MAX_SAMPLES  # bounded, kept


def test_a_broken_history_never_stops_a_run(tmp_path) -> None:
    _train(tmp_path)
    for path in _files(tmp_path):
        path.write_bytes(b"\x00" * 10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, loader = _train(tmp_path)
    assert loader.stats()["tuner"]["history"]["runs"] == 0
    assert any(issubclass(w.category, HistoryWarning) for w in caught)


def _write_one(location: str, i: int, barrier) -> None:
    barrier.wait(timeout=60)
    RunHistory(location, max_runs=1000).append([record(f"w{i:02d}", 1 + i % 4, 2 + i % 8)])


def test_64_processes_writing_at_once_lose_nothing(tmp_path) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(64)
    processes = [
        context.Process(target=_write_one, args=(str(tmp_path), i, barrier)) for i in range(64)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in processes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HistoryWarning)
        records = RunHistory(tmp_path, max_runs=1000).runs(KEY.digest())
    assert sorted(r.run_id for r in records) == [f"w{i:02d}" for i in range(64)]
    assert all((r.workers, r.depth) == (1 + int(r.run_id[1:]) % 4, 2 + int(r.run_id[1:]) % 8)
               for r in records)  # fmt: skip
    assert not [p for p in _files(tmp_path) if p.name.endswith(".tmp")]  # no temporary left


def test_the_history_keeps_the_last_runs_and_clears(tmp_path) -> None:
    store = RunHistory(tmp_path, max_runs=3)
    for i in range(5):
        store.append([record(f"r{i}", started=1000.0 + i)])
    assert [r.run_id for r in store.runs(KEY.digest())] == ["r2", "r3", "r4"]
    assert len(list(tmp_path.glob("*/*.parquet"))) == 3  # the older runs' files are gone
    assert store.workloads() == [KEY.digest()]
    assert store.clear(KEY.digest()) == 3 and store.workloads() == []


def test_the_key_digest_is_stable_and_steps_within_a_factor_share_it() -> None:
    assert KEY.digest() == WorkloadKey("0123abcd", 8, "", 20.0, 2, 8 << 30, "").digest()
    assert KEY.digest() == dataclasses.replace(KEY, step_ms=21.0).digest()
    assert KEY.digest() != dataclasses.replace(KEY, step_ms=80.0).digest()
    assert KEY.base_digest() == dataclasses.replace(KEY, step_ms=80.0).base_digest()
    assert KEY.digest() != dataclasses.replace(KEY, batch_size=16).digest()


def test_the_history_command_lists_shows_and_clears(tmp_path, capsys) -> None:
    store = RunHistory(tmp_path)
    store.append([record("run-one", 3, 8, label="Sleepy (map-style Dataset), batch 8")])
    code, out, _ = run_cli(capsys, "history", "--at", str(tmp_path), "list")
    assert code == 0 and KEY.digest() in out and "Sleepy" in out
    code, out, _ = run_cli(capsys, "history", "--at", str(tmp_path), "show", KEY.digest())
    assert code == 0 and "0.95" in out and "run-one"[-8:] in out
    code, _, err = run_cli(capsys, "history", "--at", str(tmp_path), "show", "nothing")
    assert code == 2 and "iolib history list" in err
    code, out, _ = run_cli(capsys, "history", "--at", str(tmp_path), "clear", "--yes")
    assert code == 0 and not store.workloads()


def _recorded(kind: str) -> list[RunRecord]:
    import os

    store = RunHistory(os.environ["IOLIB_HISTORY"])
    return [r for w in store.workloads() for r in store.runs(w) if r.source == kind]


def test_tune_records_its_probe_and_each_verification(token_dir, tmp_path) -> None:
    from click.testing import CliRunner

    from iolib.cli.tune import tune

    args = [str(token_dir), "--step-ms", "2", "--batch-size", "10", "--batches", "30"]
    args += ["--verify-batches", "12", "--max-workers", "2", "--out", str(tmp_path / "r")]
    result = CliRunner().invoke(tune, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    records = _recorded("tune")
    verified = {(r.workers, r.depth) for r in records if r.run_id != records[0].run_id}
    assert len({r.run_id for r in records}) >= 2 and verified
    assert all(r.target == 0.9 and r.batch_size == 10 for r in records)


def test_bench_records_each_iolib_configuration(tmp_path, capsys) -> None:
    from tests.test_bench import TINY
    from tests.test_bench import run_cli as bench

    code, _, err = bench([*TINY, "--profile", "local", "--workload", "tokens"], capsys)
    assert code == 0, err
    records = _recorded("bench")
    assert records and all((r.workers, r.depth) == (1, 2) and r.lateness_ms for r in records)


@pytest.mark.s3
def test_a_history_on_s3_is_shared_by_writers(s3_options) -> None:  # noqa: F811
    url = "s3://iolib-bench/iolib-history"
    RunHistory(url, storage_options=s3_options).append([record("node-a", 2, 4)])
    RunHistory(url, storage_options=s3_options).append([record("node-b", 3, 8)])
    store = RunHistory(url, storage_options=s3_options)
    assert store.find(KEY.base_digest()) == [KEY.digest()]
    assert sorted(r.run_id for r in store.runs(KEY.digest())) == ["node-a", "node-b"]
    assert store.clear() == 2 and store.workloads() == []


def test_a_skipped_file_is_named_without_credentials() -> None:
    store = RunHistory("memory://AKIAFAKEKEY7:SECRETVALUE9@histbucket/h")
    store.append([record("ok")])
    [path] = [p for p in store._fs.find(store._root) if p.endswith(".parquet")]
    store._fs.pipe_file(path.replace("ok", "zz"), b"broken")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.runs(KEY.digest())
    [text] = [str(w.message) for w in caught if issubclass(w.category, HistoryWarning)]
    assert "SECRETVALUE9" not in text and "zz" in text


def test_a_bad_history_argument_is_refused_at_construction() -> None:
    from iolib.errors import ConfigError

    with pytest.raises(ConfigError, match="`history` must be a path or fsspec URL"):
        DataLoader(Sleepy(), batch_size=4, prefetch="auto", history=3)


def _train_rank(location: str, rank: int, barrier) -> None:
    # torchrun sets these for every rank of one job (and the restart count).
    import os

    os.environ.update(TORCHELASTIC_RUN_ID="job-41", TORCHELASTIC_RESTART_COUNT="0")
    barrier.wait(timeout=60)
    _train(location, rank=rank, world_size=2)


def test_the_ranks_of_one_torchrun_job_are_one_run(tmp_path) -> None:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    ranks = [
        context.Process(target=_train_rank, args=(str(tmp_path), r, barrier)) for r in range(2)
    ]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=120)
    assert all(p.exitcode == 0 for p in ranks)
    store = RunHistory(tmp_path)
    records = [r for w in store.workloads() for r in store.runs(w, max_runs=1)]
    # The last one run holds both ranks' records: the job counts once, not twice.
    assert {r.rank for r in records} == {0, 1}
    assert len({r.run_id for r in records}) == 1
    # A later job (another id) is another run: the last one run is that job alone.
    store.append([record("job-42"), record("job-42", rank=1)])
    assert {r.run_id for r in store.runs(KEY.digest(), max_runs=1)} == {"job-42"}


def test_two_launches_with_one_rdzv_id_are_two_runs() -> None:
    """Scripts often pass the same `--rdzv-id` to every launch: the ranks of a launch
    share a run id, and the next launch is another run."""
    rank = "from predictors.history import new_run_id; print(new_run_id())"
    launch = (
        "import os, subprocess, sys\n"
        "env = dict(os.environ, TORCHELASTIC_RUN_ID='fixed-id', TORCHELASTIC_RESTART_COUNT='0')\n"
        "ids = [subprocess.run([sys.executable, '-c', sys.argv[1]], env=env, text=True,\n"
        "       capture_output=True, timeout=120, check=True).stdout.strip() for _ in (0, 1)]\n"
        "print(*ids)\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", launch, rank],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.split()
        for _ in (0, 1)
    ]
    assert all(len(ids) == 2 and ids[0] == ids[1] for ids in runs), runs
    assert runs[0][0] != runs[1][0], runs


def test_the_report_says_what_the_next_run_tries_and_it_does(tmp_path) -> None:
    _, first = _train(tmp_path)
    said = first.stats()["tuner"]["history"]["next_run"]
    assert said is not None and said["why"], said
    _, second = _train(tmp_path)
    planned = second.stats()["tuner"]["history_model"]
    if planned is None:  # nothing met: the run starts where the history said, no model
        tried = (*second.autotune.tuner.start, False)
    else:
        tried = (planned["workers"], planned["depth"], planned["probe"])
    assert (said["workers"], said["depth"], said["probe"]) == tried, (said, planned)
    word = "probe" if said["probe"] else "start at"
    assert said["why"].startswith(word)
