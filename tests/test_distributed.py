"""Data-parallel and pipeline-parallel feeding with real processes (gloo, CPU), plus the
elastic-resume combinatorics simulated in one process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from iolib import DataLoader
from iolib.errors import ConfigError
from iolib.loader.distributed import resolve_rank
from iolib.plan import RankSchedule
from tests import _dist_workers as workers

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
pytestmark = pytest.mark.distributed


def launch_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def read_ranks(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def spawn(target, world: int, *args, bound_s: float = 90) -> tuple[list[int | None], float]:
    """Start `world` processes with torch.multiprocessing; return exit codes and seconds."""
    context = mp.get_context("spawn")
    procs = [context.Process(target=target, args=(r, world, *args)) for r in range(world)]
    start = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=max(0.0, bound_s - (time.monotonic() - start)))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()  # only our own children, and only if the bound was missed
    return codes, time.monotonic() - start


# -- single process: rank resolution and elastic-resume combinatorics ----------------------
def test_rank_from_env_and_explicit_arguments(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert resolve_rank() == (2, 3)
    assert resolve_rank(0, 1) == (0, 1)  # explicit arguments win
    assert DataLoader(list(range(9)), batch_size=1).world_size == 3
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="must be integers"):
        resolve_rank()


def epoch_ids(total: int, world: int, start_state: dict | None = None, **kw) -> list[list[int]]:
    """Each rank's samples (ids) of epoch 0, optionally resumed from a state."""
    per_rank = []
    for rank in range(world):
        loader = DataLoader(list(range(total)), rank=rank, world_size=world, **kw)
        if start_state is not None:
            loader.load_state_dict(start_state)
        per_rank.append([int(i) for batch in loader for i in batch])
    return per_rank


@pytest.mark.parametrize("total", [61, 64, 67])
@pytest.mark.parametrize("new_world", [1, 2, 3, 5, 7])
def test_elastic_resume_delivers_the_rest_exactly_once(total, new_world) -> None:
    options = dict(batch_size=3, shuffle=True, seed=5, num_workers=0)
    # One rank's sampler is the whole epoch's order (torch's `loader.sampler` contract).
    order = list(DataLoader(list(range(total)), rank=0, world_size=1, **options).sampler)
    for steps in (1, 3, 4):  # resume points of a run at W=4
        loader = DataLoader(list(range(total)), rank=1, world_size=4, **options)
        iterator = iter(loader)
        for _ in range(steps):
            next(iterator)
        state = json.loads(json.dumps(loader.state_dict()))
        del iterator
        done = state["position"]
        assert done == min(steps * 3 * 4, total)
        rest = epoch_ids(total, new_world, state, **options)
        # Equal batch counts; every remaining sample once, plus the documented padding
        # (the epoch's first samples, when fewer samples remain than ranks).
        counts = {len(RankSchedule(total, done, 3, new_world, r)) for r in range(new_world)}
        assert len(counts) == 1
        padded = RankSchedule(total, done, 3, new_world, 0).padded
        delivered = Counter(i for ids in rest for i in ids)
        assert delivered == Counter(order[done:]) + Counter(order[:padded])


def test_tail_padding_is_accounted_when_fewer_samples_than_ranks() -> None:
    # 25 samples, 4 ranks x 3: after 2 steps (24) one sample remains for 5 new ranks.
    options = dict(batch_size=3, shuffle=True, seed=5)
    state = DataLoader(list(range(25)), rank=0, world_size=4, **options).state_dict()
    state["position"] = 24
    rest = epoch_ids(25, 5, state, **options)
    assert [len(ids) for ids in rest] == [1] * 5
    order = list(DataLoader(list(range(25)), rank=0, world_size=1, **options).sampler)
    assert rest[0] == [order[24]] and [r[0] for r in rest[1:]] == order[:4]


# -- torchrun: ranks from the env and the group; disjoint, complete; stage loaders ---------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("dist")
    workers.write_dataset(root / "data")
    (root / "subset").mkdir()
    shutil.copy(root / "data" / "part-0.parquet", root / "subset")
    return root / "data", root / "subset"


@pytest.fixture(scope="module")
def torchrun_run(dataset, tmp_path_factory) -> tuple[list[dict], Path, float]:
    if not TORCHRUN.exists():
        pytest.skip(f"torchrun not found next to {sys.executable}")
    out = tmp_path_factory.mktemp("torchrun")
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", "4"]
    command += [str(ROOT / "tests" / "_dist_workers.py"), str(out), str(dataset[0])]
    start = time.monotonic()
    done = subprocess.run(command, env=launch_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_ranks(out, 4), out, time.monotonic() - start


def test_ranks_come_from_torchrun_env_then_the_process_group(torchrun_run) -> None:
    records, _, _ = torchrun_run
    for rank, record in enumerate(records):
        assert record["env"] == record["from_env"] == [rank, 4]
        assert record["from_group"] == [rank, 4]


def test_ranks_are_disjoint_complete_with_equal_batch_counts(torchrun_run) -> None:
    records, _, _ = torchrun_run
    batches = [r["epoch"] for r in records]
    assert {len(b) for b in batches} == {6}  # 90 samples, 4 ranks x 4: 5 steps + a tail
    seen = [i for per_rank in batches for batch in per_rank for i in batch]
    assert sorted(seen) == list(range(90))  # 90 = 5*16 + 10: the tail needs no padding
    assert len({json.dumps(r["state"], sort_keys=True) for r in records}) == 1
    assert records[0]["state"]["position"] == 32 and records[0]["state"]["world_size"] == 4


def test_stage_feeds_agree_microbatch_by_microbatch(torchrun_run) -> None:
    records, _, _ = torchrun_run
    stages = {tuple(r["stage"]["where"]): r["stage"] for r in records}  # (stage, replica, n)
    for replica in (0, 1):
        first, last = stages[(0, replica, 2)], stages[(1, replica, 2)]
        assert first["hashes"] == last["hashes"] and len(first["hashes"]) == 12
        assert all(len(mbs) == 2 for mbs in first["hashes"][:-1])
        assert first["keys"] == ["id", "payload"] and last["keys"] == ["label"]
        assert 0 < last["bytes_read"] < first["bytes_read"] / 20
    assert stages[(0, 0, 2)]["hashes"] != stages[(0, 1, 2)]["hashes"]  # replicas differ


# -- torch.multiprocessing: elastic resume at another world size, state errors ------------
def test_resume_at_world_size_3_from_state_saved_at_4(torchrun_run, dataset, tmp_path) -> None:
    records, _, _ = torchrun_run
    state = records[0]["state"]
    (tmp_path / "state.json").write_text(json.dumps(state))
    init = tmp_path / "init"
    codes, _ = spawn(workers.resume, 3, str(init), str(tmp_path), str(dataset[0]), str(dataset[1]))
    assert codes == [0, 0, 0]
    resumed = read_ranks(tmp_path, 3)
    assert [r["rank"] for r in resumed] == [[0, 3], [1, 3], [2, 3]]
    assert {len(r["rest"]) for r in resumed} == {5}  # 58 left: 4 steps of 12, a tail of 10
    first_two_steps = {i for r in records for batch in r["epoch"][:2] for i in batch}
    rest = [i for r in resumed for batch in r["rest"] for i in batch]
    assert sorted(rest) == sorted(set(range(90)) - first_two_steps)
    for record in resumed:
        errors = record["errors"]
        assert "seed: state has 7, loader has 8" in errors["seed"]
        assert "batch_size: state has 4, loader has 5" in errors["batch_size"]
        assert "dataset:" in errors["dataset"] and "num_samples" in errors["dataset"]


def test_a_failing_rank_raises_there_and_the_others_do_not_hang(tmp_path) -> None:
    codes, seconds = spawn(
        workers.failing_rank, 3, str(tmp_path / "init"), str(tmp_path), 1, bound_s=60
    )
    assert None not in codes, f"a rank was still running after 60 s: {codes}"
    records = read_ranks(tmp_path, 3)
    assert codes[1] != 0
    # The dataset's own exception type, as torch re-raises it.
    assert records[1]["outcome"].startswith("OSError: disk error on sample")
    for other in (0, 2):  # finished their epoch, then the barrier failed instead of hanging
        assert "batches" in records[other] and records[other]["batches"] == 4
        assert records[other]["outcome"] != "finished" and codes[other] != 0
    assert seconds < 60


# -- the examples, launched with torchrun -------------------------------------------------
def run_example(args: list[str], nproc: int, tmp_path: Path) -> str:
    command = [str(TORCHRUN), "--standalone", "--nproc-per-node", str(nproc), *args]
    done = subprocess.run(
        command, env=launch_env(), capture_output=True, text=True, timeout=180, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_pipeline_parallel_example_trains_and_reports_bytes(tmp_path) -> None:
    if not TORCHRUN.exists():
        pytest.skip("torchrun not found")
    script = str(ROOT / "docs" / "examples" / "pipeline_parallel.py")
    out = run_example([script, "--steps", "3", "--rows", "64"], 2, tmp_path)
    assert "step 2" in out and "stage 1 read" in out
    # Two processes share stdout, so their lines can interleave: match, don't split lines.
    read = {int(k): int(v) for k, v in re.findall(r"stage (\d+) read (\d+)", out)}
    assert 0 < read[1] < read[0]


def test_ddp_example_checkpoints_and_resumes_at_another_world_size(tmp_path) -> None:
    if not TORCHRUN.exists():
        pytest.skip("torchrun not found")
    script = str(ROOT / "docs" / "examples" / "ddp_train.py")
    common = ["--workdir", str(tmp_path), "--rows", "72", "--batch-size", "4", "--epochs", "1"]
    run_example([script, *common, "--stop-after", "3", "--log-ids"], 2, tmp_path)
    out = run_example([script, *common, "--resume", "--log-ids"], 3, tmp_path)
    assert "resumed at epoch 0, sample 24" in out
    seen = []
    for path in sorted((tmp_path / "ids").glob("*.json")):
        seen += json.loads(path.read_text())
    assert sorted(seen) == list(range(72))
