"""The GPU check (issue 6): GPU decoding speed and what it does for a real model step.

On a CUDA machine, in under 5 minutes:
1. decode throughput, images/s: iolib with DALI ``device="mixed"``, iolib with DALI on
   the CPU, iolib with torchvision nvJPEG (when torchvision is present), and
   ``torch.utils.data.DataLoader`` + Pillow (workers = cores, batches moved to the GPU);
2. a ResNet-50 (torchvision's, else a small conv net) forward/backward in bf16 fed by
   each loader: images/s and GPU utilization = time in the step / wall time;
3. how far GPU-decoded pixels are from the CPU path (mean / max uint8 levels).

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check.md

The iolib legs feed ``ImagePipeline`` from a background thread with a bounded queue
(what the loader's worker does), so the check runs even before ``iolib.loader`` exists.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_images import PillowFolder, make_images  # noqa: E402
from iolib.decode.images import ImagePipeline  # noqa: E402


def feeder(pipe: ImagePipeline, blobs: list[bytes], batch: int, depth: int = 3) -> Iterator:
    """Endless batches decoded by `pipe` in one background thread, `depth` ahead."""
    q: queue.Queue = queue.Queue(maxsize=depth)

    def work() -> None:
        epoch = 0
        while True:
            order = np.random.default_rng(epoch).permutation(len(blobs))
            for lo in range(0, len(order) - batch + 1, batch):
                idx = order[lo : lo + batch]
                out, _ = pipe({"image": [blobs[i] for i in idx]}, idx, seed=0, epoch=epoch)
                q.put(out["image"])
            epoch += 1

    threading.Thread(target=work, daemon=True).start()
    while True:
        yield q.get()


def torch_batches(paths: list[Path], size: int, batch: int, workers: int) -> Iterator:
    loader = torch.utils.data.DataLoader(
        PillowFolder(paths, size),
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=True,
        pin_memory=True,
        drop_last=True,
    )
    while True:
        for images, _ in loader:
            yield images.cuda(non_blocking=True)


def throughput(batches: Iterator, seconds: float) -> float:
    next(batches)  # warm-up: pipelines build, workers start
    torch.cuda.synchronize()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        n += len(next(batches))
    torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def make_model() -> tuple[torch.nn.Module, str]:
    try:
        from torchvision.models import resnet50

        return resnet50(num_classes=1000), "ResNet-50 (torchvision)"
    except ImportError:
        layers, ch = [], 3
        for out in (64, 128, 256, 512):
            layers += [
                torch.nn.Conv2d(ch, out, 3, 2, 1),
                torch.nn.BatchNorm2d(out),
                torch.nn.ReLU(),
            ]
            ch = out
        layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(ch, 1000)]
        return torch.nn.Sequential(*layers), "small conv net (torchvision absent)"


def train(batches: Iterator, model: torch.nn.Module, seconds: float) -> tuple[float, float]:
    """Images/s and utilization (GPU step time / wall time) of bf16 fwd/bwd steps."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(x: torch.Tensor) -> None:
        x = x.float().contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (len(x),), device=x.device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(3):  # warm-up (cuDNN autotune, allocator)
        step(next(batches))
    torch.cuda.synchronize()
    busy, n, start = 0.0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x = next(batches)  # the wait for data is not step time
        t0 = time.perf_counter()
        step(x)
        torch.cuda.synchronize()
        busy += time.perf_counter() - t0
        n += len(x)
    wall = time.perf_counter() - start
    return n / wall, busy / wall


def pixel_gap(blobs: list[bytes], size: int, backend: str) -> str:
    gpu = ImagePipeline(size=size, backend=backend, device="cuda", layout="NHWC")
    cpu = ImagePipeline(size=size, backend="pil", device="cpu", layout="NHWC")
    idx = np.arange(len(blobs))
    a = gpu({"image": blobs}, idx, seed=0, epoch=0)[0]["image"].cpu().int()
    b = cpu({"image": blobs}, idx, seed=0, epoch=0)[0]["image"].int()
    diff = (a - b).abs().float()
    return f"mean {diff.mean():.3f}, max {diff.max():.0f} levels"


@click.command(help=__doc__.split("\n")[0])
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=ROOT / "benchmarks/results/gpu_check.md",
    show_default=True,
)
@click.option("--images", type=int, default=1024, show_default=True)
@click.option("--side", type=int, default=400, show_default=True)
@click.option("--size", type=int, default=224, show_default=True)
@click.option("--batch", type=int, default=128, show_default=True)
@click.option("--seconds", type=float, default=12.0, show_default=True, help="per leg")
def main(**options: object) -> None:
    args = SimpleNamespace(**options)
    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU here; nothing to check.")
    import tempfile

    torch.backends.cudnn.benchmark = True
    cores = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_images(Path(tmp), args.images, args.side)
        blobs = [p.read_bytes() for p in paths]
        legs: dict[str, Callable[[], Iterator]] = {}
        have_dali = _importable("nvidia.dali")
        have_tv = _importable("torchvision")

        def iolib_leg(backend: str, device: str) -> Callable[[], Iterator]:
            pipe = ImagePipeline(size=args.size, backend=backend, device=device)
            return lambda: feeder(pipe, blobs, args.batch)

        if have_dali:
            legs["iolib, DALI mixed (GPU decode)"] = iolib_leg("dali", "cuda")
            legs[f"iolib, DALI CPU decode ({cores} threads)"] = iolib_leg("dali", "cpu")
        if have_tv:
            legs["iolib, nvJPEG (torchvision)"] = iolib_leg("nvjpeg", "cuda")
        legs[f"torch DataLoader + Pillow ({cores} workers)"] = lambda: torch_batches(
            paths, args.size, args.batch, cores
        )
        model, model_name = make_model()
        model = model.cuda().to(memory_format=torch.channels_last)
        rows = []
        for name, make in legs.items():
            batches = _to_cuda(make())
            decode_rate = throughput(batches, args.seconds)
            rate, util = train(batches, model, args.seconds)
            batches.close()  # stops torch's workers; an iolib feeder thread just idles
            rows.append((name, decode_rate, rate, util))
            print(f"{name}: decode {decode_rate:,.0f}/s, train {rate:,.0f}/s, util {util:.0%}")
        gaps = {
            b: pixel_gap(blobs[:64], args.size, b)
            for b, ok in [("dali", have_dali), ("nvjpeg", have_tv)]
            if ok
        }
    report = _render(rows, gaps, model_name, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)


def _to_cuda(batches: Iterator) -> Iterator:
    for x in batches:
        yield x if x.is_cuda else x.cuda(non_blocking=True)


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _render(rows, gaps, model_name, args) -> str:  # type: ignore[no-untyped-def]
    gpu = torch.cuda.get_device_name()
    lines = [
        "# GPU check",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC on {gpu}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}. {args.images} JPEGs {args.side}x{args.side} -> "
        f"{args.size}, batch {args.batch}, {args.seconds:.0f} s per leg. Model: {model_name}, "
        "bf16 autocast, SGD. Utilization = time inside the step / wall time.",
        "",
        "| loader | decode images/s | training images/s | GPU utilization |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {n} | {d:,.0f} | {r:,.0f} | {u:.0%} |" for n, d, r, u in rows]
    lines += ["", "GPU-decoded pixels vs the Pillow CPU path (same windows, 64 images, uint8):", ""]
    lines += [f"- {backend}: {gap}" for backend, gap in gaps.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
