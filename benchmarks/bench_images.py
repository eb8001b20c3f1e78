"""Image loading, side by side in one run: torch DataLoader + Pillow, DALI's own file
reader, and iolib (its loader on Parquet shards, and its decoder alone).

All legs do the same work per image: decode a JPEG, random-resized crop to SIZE,
random flip, normalize to float32 NCHW, batch. Each leg runs one full pass over the
images per repeat (after one warm-up pass), passes interleaved leg by leg; images/s is
the median over repeats.

Fairness: DALI's reader does its crop the fastest way DALI offers
(``decoders.image_random_crop``: only the window is decoded, as iolib's
``decoders.image_slice`` does), and both DALI legs decode with the same number of DALI
threads in all (``--threads``: the reader's pool, and the pool of iolib's one pipeline,
which its ``--iolib-workers`` loader workers take turns on). Both hand torch their float32
output buffers without a copy (DALI's dynamic executor).

    python benchmarks/bench_images.py                 # 4000 256x256 JPEGs -> 224, batch 64
    python benchmarks/bench_images.py --images 512 --repeats 2   # a quick look

Writes benchmarks/results/images.md. Run it on a quiet machine: the numbers are only
comparable within one run. The iolib loader leg needs ``iolib.loader``; without it
that leg is reported as skipped and the others still run.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def make_images(root: Path, n: int, side: int) -> list[Path]:
    """n JPEGs of side x side in 10 class folders, with smooth content plus noise."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side]
    paths = []
    for i in range(n):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        base = np.stack([(x + 3 * i) % 256, (y * 2 + i) % 256, ((x + y) // 2 + 5 * i) % 256], -1)
        img = np.clip(base + rng.integers(-30, 30, base.shape), 0, 255).astype(np.uint8)
        path = folder / f"{i:06d}.jpg"
        Image.fromarray(img).save(path, quality=90)
        paths.append(path)
    return paths


def write_parquet(paths: list[Path], out: Path, shards: int = 4) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    urls = []
    for s in range(shards):
        part = paths[s::shards]
        table = pa.table(
            {
                "image": pa.array([p.read_bytes() for p in part], pa.binary()),
                "label": pa.array([int(p.parent.name[5:]) for p in part], pa.int64()),
                "path": pa.array([str(p) for p in part], pa.string()),
            }
        )
        url = str(out / f"part-{s:03d}.parquet")
        pq.write_table(table, url, row_group_size=256)
        urls.append(url)
    return urls


# --- leg 1: torch DataLoader + torchvision-style Pillow transforms (written by hand) ---


def _rrc_params(rng: random.Random, width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision RandomResizedCrop.get_params with scale (0.08, 1), ratio (3/4, 4/3)."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side, side


class PillowFolder(torch.utils.data.Dataset):
    """ImageFolder + RandomResizedCrop + RandomHorizontalFlip + ToTensor + Normalize."""

    def __init__(self, paths: list[Path], size: int) -> None:
        self.paths, self.size = paths, size
        self.rng = random.Random(0)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[i]) as img:
            img = img.convert("RGB")
        x, y, w, h = _rrc_params(self.rng, *img.size)
        img = img.resize(
            (self.size, self.size), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h)
        )
        if self.rng.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        t = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float().div_(255)
        return (t - MEAN) / STD, int(self.paths[i].parent.name[5:])


def torch_leg(paths: list[Path], size: int, batch: int, workers: int) -> Callable[[], int]:
    loader = torch.utils.data.DataLoader(
        PillowFolder(paths, size),
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
    )

    def epoch() -> int:
        return sum(len(labels) for _, labels in loader)

    return epoch


# --- leg 2: DALI's own reader ----------------------------------------------------------


def dali_reader_leg(
    root: Path, size: int, batch: int, threads: int, roi_decode: bool = True
) -> Callable[[], int]:
    """DALI's file reader with the random-resized crop done its fastest way (by default
    ``decoders.image_random_crop``: region-of-interest decoding, as iolib does)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def graph():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.file(file_root=str(root), random_shuffle=True, name="r")
        if roi_decode:  # DALI's ResNet-50 recipe: decode only the random window
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3]
            )
            images = fn.resize(
                images, size=[size, size], interp_type=types.INTERP_LINEAR, antialias=True
            )
        else:  # decode the whole image, then crop and resize it
            images = fn.decoders.image(jpegs, device="cpu")
            images = fn.random_resized_crop(images, size=[size, size], antialias=True)
        images = fn.crop_mirror_normalize(
            images,
            mirror=fn.random.coin_flip(),
            mean=[0.485 * 255, 0.456 * 255, 0.406 * 255],
            std=[0.229 * 255, 0.224 * 255, 0.225 * 255],
            dtype=types.FLOAT,
            output_layout="CHW",
        )
        return images, labels

    # The dynamic executor hands out its output buffers (as iolib's CPU decode does), so
    # torch takes the batch without a copy; DALI's default prefetch queue (2) stays.
    pipe = graph(batch_size=batch, num_threads=threads, device_id=None, seed=0, exec_dynamic=True)
    pipe.build()
    n = pipe.epoch_size("r")

    def epoch() -> int:
        done = 0
        while done < n:
            images, _ = pipe.run()
            torch.from_dlpack(images.as_tensor())  # zero copy: the tensor owns the buffer
            done += len(images)
        return done

    return epoch


# --- leg 3: iolib ----------------------------------------------------------------------


def iolib_loader_leg(urls: list[str], size: int, batch: int, workers: int, threads: int):
    try:
        from iolib.loader import DataLoader
        from iolib.sources import ParquetSource
    except ImportError as exc:
        return None, f"skipped: iolib.loader not importable ({exc})"
    from iolib.decode.images import ImagePipeline

    decode = ImagePipeline(size=size, device="cpu", threads=threads)
    source = ParquetSource(urls)
    loader = DataLoader(
        source, batch_size=batch, shuffle=True, num_workers=workers, seed=0, decode=decode
    )
    state = {"epoch": 0}

    def epoch() -> int:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(state["epoch"])
        state["epoch"] += 1
        return sum(len(b["label"]) for b in loader)

    return epoch, ""


def iolib_decoder_leg(urls: list[str], size: int, batch: int, threads: int) -> Callable[[], int]:
    """ImagePipeline alone, fed from the Parquet bytes in one thread (no loader)."""
    import pyarrow.parquet as pq

    from iolib.decode.images import ImagePipeline

    table = pq.read_table(urls[0]) if len(urls) == 1 else _concat(urls)
    images = table.column("image").to_pylist()
    labels = torch.tensor(table.column("label").to_pylist())
    decode = ImagePipeline(size=size, device="cpu", threads=threads)
    state = {"epoch": 0}

    def epoch() -> int:
        order = np.random.default_rng(state["epoch"]).permutation(len(images))
        state["epoch"] += 1
        done = 0
        for lo in range(0, len(order), batch):
            idx = order[lo : lo + batch]
            out, _ = decode(
                {"image": [images[i] for i in idx], "label": labels[idx]},
                idx,
                seed=0,
                epoch=state["epoch"],
            )
            done += len(out["label"])
        return done

    return epoch


def _concat(urls: list[str]):  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(u) for u in urls])


def measure(legs: dict[str, Callable[[], int]], repeats: int) -> dict[str, list[float]]:
    """images/s per pass, passes interleaved leg by leg (round-robin), so a noisy moment
    on a shared machine spreads over all legs instead of sinking one."""
    for epoch in legs.values():
        epoch()  # warm-up: workers start, pipelines build, page cache fills
    rates: dict[str, list[float]] = {name: [] for name in legs}
    for _ in range(repeats):
        for name, epoch in legs.items():
            start = time.perf_counter()
            n = epoch()
            rates[name].append(n / (time.perf_counter() - start))
    return rates


@click.command(help=__doc__.split("\n")[0])
@click.option("--images", type=int, default=4000, show_default=True)
@click.option("--side", type=int, default=256, show_default=True)
@click.option("--size", type=int, default=224, show_default=True)
@click.option("--batch", type=int, default=64, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True, help="torch DataLoader workers")
@click.option(
    "--threads",
    type=int,
    default=os.cpu_count() or 2,
    show_default=True,
    help="DALI reader's decode threads",
)
@click.option(
    "--iolib-workers", type=int, default=2, show_default=True, help="iolib loader workers"
)
@click.option(
    "--iolib-threads",
    type=int,
    default=0,
    help="DALI threads of iolib's pipeline, one per process (default: --threads, as many "
    "DALI threads in all as DALI's reader)",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=ROOT / "benchmarks/results/images.md",
    show_default=True,
)
def main(**options: object) -> None:
    args = SimpleNamespace(**options)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "folder"
        paths = make_images(folder, args.images, args.side)
        urls = write_parquet(paths, Path(tmp) / "parquet")
        iolib_threads = args.iolib_threads or args.threads
        legs: dict[str, Callable[[], int] | str] = {
            f"torch DataLoader + Pillow ({args.workers} workers)": torch_leg(
                paths, args.size, args.batch, args.workers
            ),
            f"DALI fn.readers.file, CPU decode ({args.threads} threads)": dali_reader_leg(
                folder, args.size, args.batch, args.threads
            ),
        }
        loader_epoch, why = iolib_loader_leg(
            urls, args.size, args.batch, args.iolib_workers, iolib_threads
        )
        name = (
            f"iolib DataLoader on Parquet, DALI CPU decode ({args.iolib_workers} workers, "
            f"one pipeline of {iolib_threads} DALI thread{'s' if iolib_threads > 1 else ''})"
        )
        legs[name] = loader_epoch or why
        legs[f"iolib ImagePipeline alone (1 feeding thread, {args.threads} DALI threads)"] = (
            iolib_decoder_leg(urls, args.size, args.batch, args.threads)
        )
        timed = {k: v for k, v in legs.items() if not isinstance(v, str)}
        rates = measure(timed, args.repeats)
        results: dict[str, list[float] | str] = {
            k: (v if isinstance(v, str) else rates[k]) for k, v in legs.items()
        }
        for name, value in results.items():
            print(f"{name}: {_fmt(value)}", flush=True)
    report = render(results, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)


def _fmt(value: list[float] | str) -> str:
    return value if isinstance(value, str) else f"{statistics.median(value):,.0f} images/s"


def render(results: dict[str, list[float] | str], args: SimpleNamespace) -> str:
    medians = {k: statistics.median(v) for k, v in results.items() if not isinstance(v, str)}
    torch_ref = next((v for k, v in medians.items() if k.startswith("torch")), None)
    dali_ref = next((v for k, v in medians.items() if k.startswith("DALI")), None)
    lines = [
        "# Image loading benchmark",
        "",
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, "
        f"{args.images} JPEGs {args.side}x{args.side} -> {args.size}, batch {args.batch}, "
        f"median of {args.repeats} passes (after one warm-up pass; passes interleaved "
        "leg by leg).",
        "",
        "| loader | images/s (median) | passes | vs DALI reader | vs torch |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for name, value in results.items():
        if isinstance(value, str):
            lines.append(f"| {name} | {value} | | | |")
            continue
        med = medians[name]
        passes = ", ".join(f"{r:,.0f}" for r in value)
        vs_dali = f"{med / dali_ref:.2f}x" if dali_ref else "-"
        vs_torch = f"{med / torch_ref:.2f}x" if torch_ref else "-"
        lines.append(f"| {name} | {med:,.0f} | {passes} | {vs_dali} | {vs_torch} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
