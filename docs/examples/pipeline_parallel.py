"""A two-stage pipeline-parallel model on two processes, each stage fed by iolib.

    torchrun --standalone --nproc-per-node 2 docs/examples/pipeline_parallel.py

Stage 0 (rank 0) holds a small conv net: it gets the images, decoded by iolib, and
sends its activations to stage 1. Stage 1 (rank 1) holds the classifier head: it gets
only the labels, computes the loss and sends the activations' gradient back (GPipe:
all microbatches forward, then all backward). The stages never exchange data-loading
information: each builds the same loader (same seed, same data-parallel rank) and
``loader.for_stage`` gives it its columns, split into the same microbatches. Stage 1
neither reads the image column from storage nor decodes it: the script prints the
bytes each stage read. With more processes (a multiple of 2), consecutive pairs form
data-parallel replicas (``iolib.loader.distributed.pipeline_rank``); gradients would then
also be averaged across replicas (left out here).
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from PIL import Image

from iolib import DataLoader
from iolib.decode.images import ImagePipeline
from iolib.loader.distributed import pipeline_rank
from iolib.sources import ParquetSource

SIZE, HIDDEN, CLASSES = 32, 32, 4


def make_data(directory: Path, rows: int) -> None:
    """Synthetic JPEGs (noise tinted by class) and their labels, in Parquet shards."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, CLASSES, size=rows)
    tints = rng.integers(0, 255, size=(CLASSES, 3))
    images = []
    for label in labels:
        noise = rng.integers(0, 64, size=(40, 40, 3))
        pixels = np.clip(tints[label] + noise, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        images.append(buffer.getvalue())
    table = pa.table({"image": images, "label": labels.astype(np.int64)})
    directory.mkdir(parents=True, exist_ok=True)
    for s, part in enumerate(np.array_split(np.arange(rows), 2)):
        pq.write_table(table.take(part), directory / f"part-{s}.parquet", row_group_size=16)


def stage_model(stage: int) -> torch.nn.Module:
    torch.manual_seed(stage)
    if stage == 0:
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(8 * 16, HIDDEN),
            torch.nn.ReLU(),
        )
    return torch.nn.Linear(HIDDEN, CLASSES)


def train_step(stage: int, model: torch.nn.Module, microbatches: list) -> float | None:
    """GPipe on two ranks: forward every microbatch, then backward every one."""
    kept, losses = [], []
    for mb in microbatches:
        if stage == 0:
            out = model(mb["image"])
            dist.send(out.detach().contiguous(), dst=1)
            kept.append(out)
        else:
            incoming = torch.empty(len(mb["label"]), HIDDEN)  # the size the labels say
            dist.recv(incoming, src=0)
            incoming.requires_grad_()
            loss = torch.nn.functional.cross_entropy(model(incoming), mb["label"])
            kept.append((incoming, loss / len(microbatches)))
            losses.append(loss.item())
    for item in kept:
        if stage == 0:
            grad = torch.empty_like(item)
            dist.recv(grad, src=1)
            item.backward(grad)
        else:
            incoming, loss = item
            loss.backward()
            dist.send(incoming.grad.contiguous(), dst=0)
    return sum(losses) / len(losses) if losses else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    where = pipeline_rank(num_stages=2)  # stage = rank % 2, replica = rank // 2
    if dist.get_world_size() != 2:
        raise SystemExit("This example runs one replica: --nproc-per-node 2.")
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch, "data")
        if where.stage == 0:
            make_data(data, args.rows)
        paths = [str(data)]
        dist.broadcast_object_list(paths, src=0)  # stage 1 learns where (and when) it is
        loader = DataLoader(
            ParquetSource(paths[0]),
            batch_size=args.batch_size,
            shuffle=True,
            seed=0,
            rank=where.replica,
            world_size=where.replicas,  # the replica's, not the process's
            decode=ImagePipeline(size=SIZE, backend="pil", device="cpu"),
        )
        feed = loader.for_stage(where.stage, 2, microbatches=args.microbatches)
        model = stage_model(where.stage)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for step, microbatches in enumerate(feed):
            if step == args.steps:
                break
            optimizer.zero_grad()
            loss = train_step(where.stage, model, microbatches)
            optimizer.step()
            if loss is not None:
                print(f"step {step} loss {loss:.4f}", flush=True)
        stats = feed.stats()
        seen = stats["stage"]
        dist.barrier()  # print the byte counts after every loss
        print(
            f"stage {where.stage} read {stats['bytes_read']} bytes "
            f"(reads {seen['reads']}, columns {seen['columns']}, decodes {seen['decodes']})",
            flush=True,
        )
        dist.barrier()  # stage 0 keeps the files until stage 1 is done with them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
