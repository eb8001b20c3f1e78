"""DistributedSampler with a real process group: two gloo processes (started with
torch.multiprocessing), each rank building its loader over a DistributedSampler that
takes the rank and world size from the group, as a DDP script does."""

from __future__ import annotations

import datetime
import json
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DistributedSampler

from tests.conformance.conftest import Numbers, batches

WORLD, N, BATCH = 2, 22, 4


def rank_main(rank: int, world: int, init_file: str, out: str, which: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )
    record: dict = {"rank": rank, "error": None, "epochs": []}
    try:
        if which == "torch":
            loader_class = torch.utils.data.DataLoader
        else:
            from iolib import DataLoader as loader_class
        for epoch in (0, 1):
            samplers = []
            for _ in range(2):
                sampler = DistributedSampler(Numbers(N), shuffle=True, seed=0)  # from the group
                sampler.set_epoch(epoch)
                samplers.append(sampler)
            got = batches(loader_class(Numbers(N), batch_size=BATCH, sampler=samplers[0]))
            expected = batches(
                torch.utils.data.DataLoader(Numbers(N), batch_size=BATCH, sampler=samplers[1])
            )
            record["epochs"].append(
                {
                    "equal": got == expected,
                    "ids": [i for b in got for i in b[1][0][3]],
                    "expected_ids": [i for b in expected for i in b[1][0][3]],
                }
            )
    except Exception as exc:  # reported to the test, which fails with it
        record["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


def test_distributed_sampler_in_a_gloo_group(Loader, tmp_path) -> None:
    which = "torch" if Loader is torch.utils.data.DataLoader else "iolib"
    context = mp.get_context("spawn")
    init = tmp_path / "init"
    procs = [
        context.Process(target=rank_main, args=(r, WORLD, str(init), str(tmp_path), which))
        for r in range(WORLD)
    ]
    start = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=max(0.0, 90 - (time.monotonic() - start)))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()  # our own children only, and only past the bound
    assert codes == [0] * WORLD, f"exit codes {codes}"
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for record in records:
        assert record["error"] is None, f"rank {record['rank']}: {record['error']}"
        assert [e["equal"] for e in record["epochs"]] == [True, True], record["epochs"]
    for epoch in (0, 1):
        ids = sorted(i for r in records for i in r["epochs"][epoch]["ids"])
        assert ids == list(range(N))  # the ranks split the dataset, as torch's do
