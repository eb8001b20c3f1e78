"""Work for the processes of tests/test_distributed.py (spawned, or run by torchrun).

Each process writes what it saw to ``<out>/rank<r>.json``; the test compares the files.
Run by torchrun: ``torchrun --standalone --nproc-per-node 4 tests/_dist_workers.py OUT DATA``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from iolib import DataLoader
from iolib.errors import StateError
from iolib.loader.distributed import pipeline_rank
from iolib.sources import ParquetSource

BATCH, SEED = 4, 7


def write_dataset(directory: Path, rows: int = 90, shards: int = 3) -> None:
    """`id`, `label` (equal to id, so a label-only stage can be matched with the inputs)
    and an incompressible 512-byte `payload` per row."""
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, shards + 1).astype(int)
    rng = np.random.default_rng(0)
    for s in range(shards):
        ids = np.arange(bounds[s], bounds[s + 1], dtype=np.int64)
        payload = [rng.bytes(512) for _ in ids]
        table = pa.table({"id": ids, "label": ids.copy(), "payload": payload})
        pq.write_table(table, directory / f"part-{s}.parquet", row_group_size=10)


def make_loader(data: str, **kwargs: Any) -> DataLoader:
    options = dict(batch_size=BATCH, shuffle=True, seed=SEED)
    return DataLoader(ParquetSource(data), **{**options, **kwargs})


def digest(values: torch.Tensor) -> str:
    return hashlib.sha256(values.numpy().astype(np.int64).tobytes()).hexdigest()[:12]


def _write(out: str, rank: int, record: dict[str, Any]) -> None:
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


# -- torchrun: rank from the environment, then from the process group --------------------
def data_parallel_and_stages(out: str, data: str) -> None:
    env = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    from_env = make_loader(data)
    record: dict[str, Any] = {"env": env, "from_env": [from_env.rank, from_env.world_size]}
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"  # the group wins over the env
    loader = make_loader(data)
    record["from_group"] = [loader.rank, loader.world_size]
    record["epoch"] = [b["id"].tolist() for b in loader]
    loader.set_epoch(0)  # the finished pass moved the loader to epoch 1
    iterator = iter(loader)
    for _ in range(2):
        next(iterator)
    record["state"] = loader.state_dict()
    del iterator
    record["stage"] = _stage_feed(data)
    _write(out, env[0], record)
    dist.barrier()
    dist.destroy_process_group()


def _stage_feed(data: str) -> dict[str, Any]:
    """Two replicas of a two-stage pipeline: each stage hashes each microbatch's ids
    (stage 0: `id`; stage 1: `label`, which equals id)."""
    where = pipeline_rank(2)
    loader = make_loader(data, rank=where.replica, world_size=where.replicas)
    feed = loader.for_stage(where.stage, 2, microbatches=2)
    key = "id" if where.stage == 0 else "label"
    hashes = [[digest(mb[key]) for mb in mbs] for mbs in feed]
    return {
        "where": list(where),
        "hashes": hashes,
        "bytes_read": feed.stats()["bytes_read"],
        "keys": sorted(next(iter(feed))[0]),
    }


# -- torch.multiprocessing: elastic resume and state errors -------------------------------
def _init(rank: int, world: int, init_file: str, timeout_s: float = 30) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def resume(rank: int, world: int, init_file: str, out: str, data: str, subset: str) -> None:
    _init(rank, world, init_file)
    state = json.loads(Path(out, "state.json").read_text())
    loader = make_loader(data)  # rank and world size from the process group
    loader.load_state_dict(state)
    record: dict[str, Any] = {
        "rank": [loader.rank, loader.world_size],
        "rest": [b["id"].tolist() for b in loader],
        "errors": {},
    }
    for name, other in {
        "seed": make_loader(data, seed=SEED + 1),
        "batch_size": make_loader(data, batch_size=BATCH + 1),
        "dataset": make_loader(subset),
    }.items():
        try:
            other.load_state_dict(state)
            record["errors"][name] = "no error"
        except StateError as exc:
            record["errors"][name] = str(exc)
    _write(out, rank, record)
    dist.barrier()
    dist.destroy_process_group()


class FailsOn(Dataset):
    """Sample i is i; reading sample `bad` raises (on the rank that is given one)."""

    def __init__(self, n: int, bad: int | None) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            raise OSError(f"disk error on sample {index}")
        return index


def failing_rank(rank: int, world: int, init_file: str, out: str, bad_rank: int) -> None:
    """Rank `bad_rank` hits a bad sample mid-epoch; the others finish and then wait at a
    barrier, which must fail (peer gone or timeout) rather than hang."""
    _init(rank, world, init_file, timeout_s=10)
    loader = DataLoader(FailsOn(24, bad=None), batch_size=2, shuffle=True, seed=0)
    # The epoch's whole order: what one rank of one reads (`loader.sampler`).
    whole = DataLoader(
        FailsOn(24, bad=None), batch_size=2, shuffle=True, seed=0, rank=0, world_size=1
    )
    first_of_bad_rank = list(whole.sampler)[2 * world + bad_rank * 2]
    bad = loader.replace(dataset=FailsOn(24, bad=first_of_bad_rank))
    record: dict[str, Any] = {"rank": rank}
    try:
        record["batches"] = len([b for b in (bad if rank == bad_rank else loader)])
        dist.barrier()
        record["outcome"] = "finished"
    except Exception as exc:  # what each rank reports
        record["outcome"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
        _write(out, rank, record)
        raise
    _write(out, rank, record)


if __name__ == "__main__":
    data_parallel_and_stages(sys.argv[1], sys.argv[2])
