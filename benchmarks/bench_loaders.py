"""iolib.DataLoader against torch.utils.data.DataLoader, same workload, same run.

Workloads (made on first use under --data, default benchmarks/data/):
  images: Parquet of 256x256 JPEGs, decoded with Pillow and resized to 224 (uint8
    [3, 224, 224]). torch: Pillow decode + Pillow resize in ``__getitem__``; iolib: its
    Pillow backend, ``ImagePipeline(backend="pil")`` (Pillow decode, torch's SIMD
    antialiased resize with DALI's edge rule, written into the batch).
  images-same-transform: both loaders run the identical per-sample Python function
    (Pillow decode + Pillow resize): the loaders alone, doing the same work.
  images-fast-resize: torch's Dataset uses iolib's resize per sample too, against
    iolib's pipeline: how much of the images gain is the resize kernel, not the loader.
  tokens: Parquet of fixed-length int32 sequences (2048 tokens) with a label.
The torch side is what a user would write: a map-style Dataset holding the pyarrow
table, ``__getitem__`` returning one sample as tensors, persistent workers. Each loader
runs one warm-up epoch, then ``--repeats`` timed epochs, the two loaders taking turns
epoch by epoch; samples/s is the median.

    python benchmarks/bench_loaders.py --workers 2 --repeats 5
"""

from __future__ import annotations

import io
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image
from torch.utils.data import Dataset

import iolib
from iolib.decode.images import ImagePipeline
from iolib.decode.resize import resize_window
from iolib.sources import ParquetSource

HERE = Path(__file__).parent
SIZE = 224


# -- data ------------------------------------------------------------------------------
def synthetic_jpeg(rng: np.random.Generator, side: int = 256) -> bytes:
    """A photo-like JPEG: smooth gradients plus texture, so it decodes like a real one."""
    y, x = np.mgrid[0:side, 0:side].astype(np.float32) / side
    base = np.stack([x, y, (x + y) / 2], axis=-1) * rng.uniform(80, 255, size=3)
    texture = rng.normal(0, 20, size=(side, side, 3))
    pixels = np.clip(base + texture, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def make_images(directory: Path, count: int) -> Path:
    path = directory / f"images-{count}.parquet"
    if not path.exists():
        rng = np.random.default_rng(0)
        table = pa.table(
            {
                "image": [synthetic_jpeg(rng) for _ in range(count)],
                "label": np.arange(count, dtype=np.int64) % 1000,
            }
        )
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=256, compression="none")
    return path


def make_tokens(directory: Path, rows: int, length: int = 2048) -> Path:
    path = directory / f"tokens-{rows}x{length}.parquet"
    if not path.exists():
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, 50_000, size=rows * length, dtype=np.int32)
        table = pa.table(
            {
                "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens), length),
                "label": np.arange(rows, dtype=np.int64) % 2,
            }
        )
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=8192, compression="none")
    return path


# -- the same per-sample work on both sides --------------------------------------------
def decode_resize(data: bytes) -> torch.Tensor:
    """JPEG bytes -> [3, 224, 224] uint8, with Pillow (draft mode off: full decode)."""
    image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR)
    return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def decode_fast_resize(data: bytes) -> torch.Tensor:
    """JPEG bytes -> [3, 224, 224] uint8: Pillow decode, iolib's resize (torch kernel)."""
    image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return torch.from_numpy(resize_window(image, np.empty((3, SIZE, SIZE), np.uint8)))


class TorchImages(Dataset):
    def __init__(self, path: Path, decode=decode_resize) -> None:
        self.table = pq.read_table(path)
        self.decode = decode

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int):
        image = self.table.column("image")[index].as_py()
        return self.decode(image), torch.tensor(self.table.column("label")[index].as_py())


class TorchImagesFastResize(TorchImages):
    def __init__(self, path: Path) -> None:
        super().__init__(path, decode_fast_resize)


class TorchTokens(Dataset):
    def __init__(self, path: Path) -> None:
        self.table = pq.read_table(path)

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, index: int):
        tokens = self.table.column("tokens")[index].values.to_numpy()
        label = self.table.column("label")[index].as_py()
        return torch.from_numpy(tokens.copy()), torch.tensor(label)


def iolib_image_transform(sample: dict, rng: np.random.Generator) -> dict:
    return {"image": decode_resize(sample["image"]), "label": sample["label"]}


# iolib's own Pillow path: the whole 256x256 image (crop_fraction=1) resized to 224, as
# uint8 NCHW like the torch side. Eval mode: no random crop, as decode_resize.
PIL_PIPELINE = ImagePipeline(
    size=SIZE, train=False, crop_fraction=1.0, backend="pil", device="cpu",
    layout="NCHW", dtype="uint8",
)  # fmt: skip


def pixel_difference(path: Path, rows: int = 32) -> tuple[int, float]:
    """Max and mean |iolib pipeline - torch side| over the first rows, in uint8 levels:
    both sides do the same work (the borders differ by the edge rule: Pillow truncates
    the filter at the image edge, iolib clamps like DALI)."""
    table = pq.read_table(path).slice(0, rows)
    blobs = table.column("image").to_pylist()
    ours, _ = PIL_PIPELINE({"image": blobs}, np.arange(rows), seed=0, epoch=0)
    theirs = torch.stack([decode_resize(b) for b in blobs])
    diff = (ours["image"].int() - theirs.int()).abs()
    return int(diff.max()), float(diff.float().mean())


# -- measurement -----------------------------------------------------------------------
def epoch_rate(loader, samples: int) -> float:
    """Samples/s over one epoch (checks that every sample came)."""
    start = time.perf_counter()
    count = 0
    for batch in loader:
        count += len(batch[1]) if isinstance(batch, (list, tuple)) else len(batch["label"])
    assert count == samples, f"{count} samples, expected {samples}"
    return count / (time.perf_counter() - start)


def interleaved_rates(loaders: list, samples: int, repeats: int) -> list[list[float]]:
    """One warm-up epoch each (worker start, caches), then `repeats` rounds of one epoch
    per loader in turn: a burst of load on this shared machine hits both sides alike."""
    for loader in loaders:
        epoch_rate(loader, samples)
    rates: list[list[float]] = [[] for _ in loaders]
    for _ in range(repeats):
        for loader, out in zip(loaders, rates, strict=True):
            out.append(epoch_rate(loader, samples))
    return rates


def run(args: SimpleNamespace) -> list[dict]:
    data = Path(args.data)
    images = lambda: make_images(data, args.images)  # noqa: E731
    workloads = {
        "images": (images, TorchImages, {"decode": PIL_PIPELINE}, 64),
        "images-same-transform": (images, TorchImages, {"transform": iolib_image_transform}, 64),
        "images-fast-resize": (images, TorchImagesFastResize, {"decode": PIL_PIPELINE}, 64),
        "tokens": (lambda: make_tokens(data, args.tokens), TorchTokens, {}, 256),
    }  # fmt: skip
    rows = []
    for workload in args.workloads:
        make, torch_ds, iolib_kwargs, batch = workloads[workload]
        path = make()
        dataset = torch_ds(path)
        n = len(dataset)
        torch_loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch,
            shuffle=True,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            prefetch_factor=2 if args.workers else None,
        )
        ours = iolib.DataLoader(
            ParquetSource(str(path)),
            batch_size=batch,
            shuffle="block",
            num_workers=args.workers,
            persistent_workers=True,
            **iolib_kwargs,
        )
        t_all, i_all = interleaved_rates([torch_loader, ours], n, args.repeats)
        t_med, i_med = statistics.median(t_all), statistics.median(i_all)
        del torch_loader
        ours.close()
        pixels = pixel_difference(path) if "decode" in iolib_kwargs else None
        rows.append(
            {
                "pixel_diff_max_mean": pixels,
                "workload": workload,
                "samples": n,
                "batch_size": batch,
                "workers": args.workers,
                "torch_sps": t_med,
                "iolib_sps": i_med,
                "ratio": i_med / t_med,
                "torch_all": t_all,
                "iolib_all": i_all,
            }
        )
        print(
            f"{workload}: torch {t_med:,.0f}/s  iolib {i_med:,.0f}/s  ratio {i_med / t_med:.2f}x",
            flush=True,
        )
    return rows


def write_report(rows: list[dict], args: SimpleNamespace, out: Path) -> None:
    lines = [
        "# iolib.DataLoader vs torch.utils.data.DataLoader",
        "",
        f"Command: `python benchmarks/bench_loaders.py {' '.join(sys.argv[1:])}`  ",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, {_cpu_count()} CPUs; torch {torch.__version__}, "
        f"pyarrow {pa.__version__}, iolib {iolib.__version__}",
        "",
        "| workload | samples | batch | workers | torch samples/s | iolib samples/s | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['samples']} | {r['batch_size']} | {r['workers']} | "
            f"{r['torch_sps']:,.0f} | {r['iolib_sps']:,.0f} | {r['ratio']:.2f}x |"
        )
    lines += [
        "",
        f"Medians of {args.repeats} timed epochs per loader after one warm-up epoch each, "
        "the loaders taking turns epoch by epoch; all rates:",
        "",
    ]
    lines += [
        f"- {r['workload']}: torch {_fmt(r['torch_all'])}; iolib {_fmt(r['iolib_all'])}"
        for r in rows
    ]
    diffs = [(r["workload"], r["pixel_diff_max_mean"]) for r in rows if r["pixel_diff_max_mean"]]
    if diffs:
        lines += [
            "",
            "Same pixels? |iolib - torch| in uint8 levels over 32 images (max, mean):",
            "",
        ]
        lines += [f"- {name}: {d[0]}, {d[1]:.3f}" for name, d in diffs]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2))


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


WORKLOADS = ("images", "images-same-transform", "images-fast-resize", "tokens")


@click.command(help=__doc__.split("\n")[0])
@click.option("--workers", type=int, default=2, help="workers on both sides (default 2)")
@click.option("--repeats", type=int, default=5, help="timed epochs (default 5)")
@click.option("--images", type=int, default=4000, help="JPEGs in the images workload")
@click.option("--tokens", type=int, default=200_000, help="rows in the tokens workload")
@click.option("--data", default=str(HERE / "data"), help="where workloads are made")
@click.option(
    "--workloads",
    type=click.Choice(WORKLOADS),
    multiple=True,
    default=WORKLOADS,
    show_default=True,
    help="repeat the option for several (default: all)",
)
@click.option("--out", default=str(HERE / "results" / "loaders.md"), show_default=True)
def main(**options: object) -> None:
    args = SimpleNamespace(**options)
    args.workloads = list(args.workloads)
    write_report(run(args), args, Path(args.out))


if __name__ == "__main__":
    main()
