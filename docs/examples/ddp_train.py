"""Data-parallel training (DDP, gloo on CPU) fed by iolib, with checkpoint and elastic resume.

    torchrun --standalone --nproc-per-node 4 docs/examples/ddp_train.py --stop-after 5
    torchrun --standalone --nproc-per-node 3 docs/examples/ddp_train.py --resume

The first command trains 5 steps on 4 ranks and saves a checkpoint (the model, the
optimizer and ``loader.state_dict()``), as a preempted job would. The second resumes it
on 3 ranks (both in --workdir, by default iolib-ddp-example in the system's temporary
directory): the loader's cursor counts global samples, so the rest of the epoch is
delivered exactly once across the new ranks. The loader takes its rank and world size
from the initialized process group; no collective is needed to agree on the order.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from iolib import DataLoader
from iolib.sources import ParquetSource

FEATURES, CLASSES = 16, 4


def make_data(directory: Path, rows: int) -> None:
    """Synthetic Parquet shards: `id`, `features` (16 floats), `label` (a linear rule)."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    labels = (features @ rng.normal(size=(FEATURES, CLASSES))).argmax(1)
    directory.mkdir(parents=True)
    for s, part in enumerate(np.array_split(np.arange(rows), 3)):
        table = pa.table(
            {
                "id": part.astype(np.int64),
                "features": pa.FixedSizeListArray.from_arrays(
                    pa.array(features[part].ravel()), FEATURES
                ),
                "label": labels[part].astype(np.int64),
            }
        )
        pq.write_table(table, directory / f"part-{s}.parquet", row_group_size=16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # A fixed folder under the system's temporary directory, not the current one: the
    # resume run must find the first run's checkpoint, and a checkout stays clean.
    default_workdir = Path(tempfile.gettempdir()) / "iolib-ddp-example"
    parser.add_argument(
        "--workdir", default=str(default_workdir), help="data and checkpoint go here (%(default)s)"
    )
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop-after", type=int, help="save a checkpoint after N steps, exit")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    parser.add_argument("--log-ids", action="store_true", help="write the sample ids trained")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun's env: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    workdir, checkpoint = Path(args.workdir), Path(args.workdir) / "checkpoint.pt"
    if rank == 0:
        print(f"data and checkpoint in {workdir}", flush=True)
    if rank == 0 and not (workdir / "data").exists():
        make_data(workdir / "data", args.rows)
    dist.barrier()

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # Rank and world size come from the process group; the same seed on every rank.
    loader = DataLoader(
        ParquetSource(str(workdir / "data")),
        batch_size=args.batch_size,
        shuffle=True,
        seed=0,
        num_workers=1,
    )
    if args.resume:
        saved = torch.load(checkpoint, weights_only=True)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])  # saved at another world size: fine
        loader.set_epoch(saved["loader"]["epoch"])
        if rank == 0:
            print(
                f"resumed at epoch {loader.epoch}, sample {saved['loader']['position']} "
                f"(saved on {saved['loader']['world_size']} ranks, now {world})"
            )
    start = loader.state_dict()["position"]
    seen, steps = [], 0
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += batch["id"].tolist()
            steps += 1
            if rank == 0 and steps % 5 == 0:
                print(f"epoch {epoch} step {steps} loss {loss.item():.4f}")
            if steps == args.stop_after:
                break
        if steps == args.stop_after:
            break

    if rank == 0:  # every rank's loader state is the same: rank 0 saves it
        torch.save(
            {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "loader": loader.state_dict(),
            },
            checkpoint,
        )
        print(f"saved {checkpoint} at {loader.state_dict()} after {steps} steps")
    if args.log_ids:
        (workdir / "ids").mkdir(exist_ok=True)
        (workdir / "ids" / f"from{start}-w{world}-r{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
