"""Training images from Parquet through iolib against DALI's own file reader, as a ratio.

Both legs do the same work per image: read a JPEG, decode only a random window
(``image_random_crop`` / iolib's slice decode), resize to SIZE, random flip, hand out
uint8 NHWC batches of 64 on the CPU.

- iolib: ``ImagePipeline(size, train=True, layout="NHWC", dtype="uint8", device="cpu",
  backend="dali")`` in ``iolib.DataLoader`` over ``ParquetSource`` with 2 persistent
  workers, on shards written by ``iolib convert`` with its defaults (as a user would).
  A warm-up loader reads a few batches and is dropped before the measured loader's epoch.
- DALI: ``fn.readers.file`` + ``fn.decoders.image_random_crop`` + ``fn.resize`` +
  ``fn.flip`` over the same JPEGs, with as many threads as cores; a few warm-up batches,
  then one epoch's worth.

Every leg runs in a fresh process; a pair is one iolib leg and one DALI leg back to back
(the order alternating pair by pair), and its ratio is iolib / DALI images/s, so a noisy
moment on a shared machine sinks both legs of a pair rather than one side of the ratio.
The rate is counted from the first batch to the last (worker start and pipeline build
are left out on both sides); the first-batch time is reported beside it.

``--root PATH`` (repeatable) runs the iolib leg with the iolib of another checkout
(a git worktree of another commit), pairs interleaved across roots, on the same shards.

    python benchmarks/bench_images_vs_dali.py                  # 3,000 JPEGs, 5 pairs
    python benchmarks/bench_images_vs_dali.py --pairs 3 --root /tmp/a --root /tmp/b
    python benchmarks/bench_images_vs_dali.py --quick          # before a merge, < 2 min

``--quick`` (``make bench-premerge``): 1,200 JPEGs, 2 pairs, this checkout; prints the
table and a one-line verdict against the targets and writes no results file unless
``--out`` is given.

Writes benchmarks/results/images-vs-dali.md and .json (median, min-max and every pair,
with ``uptime``'s load at each pair).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def make_images(root: Path, n: int, side: int) -> None:
    """n JPEGs of side x side in 10 class folders, smooth content plus noise."""
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side]
    for i in range(n):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        base = np.stack([(x + 3 * i) % 256, (y * 2 + i) % 256, ((x + y) // 2 + 5 * i) % 256], -1)
        img = np.clip(base + rng.integers(-30, 30, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"{i:06d}.jpg", quality=90)


def prepare(data: Path, n: int, side: int) -> tuple[Path, Path]:
    """JPEG folder and its `iolib convert` shards (defaults), made once per data dir."""
    jpegs, shards = data / "jpeg", data / "parquet"
    if not (data / ".jpegs-done").exists():
        make_images(jpegs, n, side)
        (data / ".jpegs-done").write_text(str(n))
    if not (data / ".convert-done").exists():
        cmd = [sys.executable, "-m", "iolib.cli", "convert", str(jpegs), str(shards)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        (data / ".convert-done").write_text(" ".join(cmd))
    return jpegs, shards


# --- the legs, each run in its own process (``--leg``) ---------------------------------


def tree_counts(sampler: PeakRss | None = None) -> tuple[float, int]:
    """CPU seconds (user + system) and minor page faults of this process and its live
    children so far: work counted, which a loaded machine changes far less than time.
    The memory sampler's own CPU (`sampler`, reading /proc every 50 ms) is left out."""
    import psutil

    me = psutil.Process()
    cpu, faults = -(sampler.cpu if sampler else 0.0), 0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            stat = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue
        cpu += t.user + t.system
        faults += int(stat[7])  # minflt, field 10 of proc(5)
    return cpu, faults


class PeakRss:
    """Peak resident set of this process and its children, summed, sampled every 50 ms
    (RSS counts shared pages once per process: a ceiling, compared like for like)."""

    def __init__(self) -> None:
        import threading

        self.peak, self.cpu, self._stop = 0, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(0.05):
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    continue
            self.peak = max(self.peak, total)
            self.cpu = time.thread_time()  # this thread's CPU so far, left out of the counts

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 1e6


def figures(n: int, start: float, first: float, end: float, c0: tuple, c1: tuple) -> dict:
    return {
        "rate": n / (end - first),
        "first_s": first - start,
        "images": n,
        "cpu_ms_per_image": 1e3 * (c1[0] - c0[0]) / n,
        "faults_per_image": (c1[1] - c0[1]) / n,
    }


def iolib_leg(shards: Path, size: int, batch: int, workers: int, warmup: int) -> dict:
    import iolib
    from iolib.decode.images import ImagePipeline
    from iolib.loader import DataLoader
    from iolib.sources import ParquetSource

    urls = sorted(str(p) for p in shards.glob("*.parquet"))

    def loader():  # type: ignore[no-untyped-def]
        decode = ImagePipeline(
            size=size, train=True, layout="NHWC", dtype="uint8", device="cpu", backend="dali"
        )
        return DataLoader(
            ParquetSource(urls),
            batch_size=batch,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            seed=0,
            decode=decode,
        )

    warm = loader()
    for i, _ in enumerate(warm):
        if i + 1 >= warmup:
            break
    del warm, _

    peak = PeakRss()
    start = time.perf_counter()
    first = c0 = None
    n = 0
    measured = loader()
    for b in measured:
        if first is None:
            first, c0 = time.perf_counter(), tree_counts(peak)
        else:
            n += len(b["label"])
    end, c1 = time.perf_counter(), tree_counts(peak)  # persistent workers still alive
    return {
        "iolib": iolib.__file__,
        **figures(n, start, first, end, c0, c1),
        "peak_rss_mb": peak.stop(),
    }


def dali_leg(jpegs: Path, size: int, batch: int, threads: int, warmup: int) -> dict:
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def graph():  # type: ignore[no-untyped-def]
        data, labels = fn.readers.file(file_root=str(jpegs), random_shuffle=True, name="r")
        images = fn.decoders.image_random_crop(
            data, device="cpu", random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3]
        )
        images = fn.resize(
            images, size=[size, size], interp_type=types.INTERP_LINEAR, antialias=True
        )
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, labels

    pipe = graph(batch_size=batch, num_threads=threads, device_id=None, seed=0, exec_dynamic=True)
    pipe.build()
    epoch = pipe.epoch_size("r")
    peak = PeakRss()
    for _ in range(warmup):
        pipe.run()
    start = time.perf_counter()
    images, _ = pipe.run()
    np.asarray(images.as_tensor())
    first, c0 = time.perf_counter(), tree_counts(peak)
    n = 0
    while n + batch < epoch:
        images, _ = pipe.run()
        np.asarray(images.as_tensor())  # the batch as one array, no copy
        n += len(images)
    end, c1 = time.perf_counter(), tree_counts(peak)
    return {**figures(n, start, first, end, c0, c1), "peak_rss_mb": peak.stop()}


def run_leg(leg: str, root: Path, args: SimpleNamespace, jpegs: Path, shards: Path) -> dict:
    """One leg in a fresh process; the iolib leg imports iolib from `root`."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--leg",
        leg,
        "--data",
        str(args.data),
        "--size",
        str(args.size),
        "--batch",
        str(args.batch),
        "--workers",
        str(args.workers),
        "--threads",
        str(args.threads),
        "--warmup",
        str(args.warmup),
        *(["--dali-imports-torch"] if args.dali_imports_torch else []),
    ]
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"{leg} leg in {root} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if leg == "iolib" and not result["iolib"].startswith(str(root)):
        raise RuntimeError(f"iolib came from {result['iolib']}, not {root}")
    return result


def load() -> str:
    return (
        subprocess.run(["uptime"], capture_output=True, text=True)
        .stdout.split("average:")[-1]
        .strip()
    )


def commit_of(root: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True, text=True
    )
    return out.stdout.strip() or str(root)


@click.command(help=__doc__.split("\n")[0])
@click.option("--images", type=int, default=3000, show_default=True)
@click.option("--side", type=int, default=256, show_default=True)
@click.option("--size", type=int, default=224, show_default=True)
@click.option("--batch", type=int, default=64, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True, help="iolib loader workers")
@click.option(
    "--threads", type=int, default=os.cpu_count() or 2, show_default=True, help="DALI threads"
)
@click.option("--warmup", type=int, default=4, show_default=True, help="warm-up batches")
@click.option("--pairs", type=int, default=5, show_default=True)
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="checkout whose iolib the iolib leg imports (repeatable; default: this one)",
)
@click.option(
    "--data",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="keep the JPEGs and shards here and reuse them (default: a temporary folder)",
)
@click.option(
    "--quick", is_flag=True, help="1,200 JPEGs, 2 pairs, print only (the pre-merge check)"
)
@click.option(
    "--dali-imports-torch",
    is_flag=True,
    help="the DALI leg imports torch first, as a PyTorch script feeding from DALI does",
)
@click.option("--leg", type=click.Choice(["iolib", "dali"]), default=None, hidden=True)
@click.option(
    "--render",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    default=None,
    help="write the tables again from an earlier run's .json, measuring nothing",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="[default: benchmarks/results/images-vs-dali.md; none with --quick]",
)
def main(**options: object) -> None:
    args = SimpleNamespace(**options)
    if args.quick:
        args.images, args.pairs = 1200, 2
    elif args.out is None:
        args.out = ROOT / "benchmarks/results/images-vs-dali.md"
    if args.render:
        saved = json.loads(args.render.read_text())
        for key in ("images", "side", "size", "batch", "workers", "threads", "pairs"):
            setattr(args, key, int(saved["options"][key]))
        args.dali_imports_torch = saved["options"].get("dali_imports_torch") == "True"
        roots = [Path(r) for r in saved["results"]]
        args.roots = tuple(roots)
        runs = {r: row["pairs"] for r, row in saved["results"].items()}
        write(args, roots, runs, saved["when"])
        return
    if args.leg:  # one leg, in this process: print its figures as one JSON line
        jpegs, shards = args.data / "jpeg", args.data / "parquet"
        if args.leg == "iolib":
            result = iolib_leg(shards, args.size, args.batch, args.workers, args.warmup)
        else:
            if args.dali_imports_torch:
                import torch  # noqa: F401
            result = dali_leg(jpegs, args.size, args.batch, args.threads, args.warmup)
        print(json.dumps(result), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.data = (args.data or Path(tmp)).resolve()
        args.data.mkdir(parents=True, exist_ok=True)
        jpegs, shards = prepare(args.data, args.images, args.side)
        roots = [r.resolve() for r in args.roots] or [ROOT]
        runs = {str(r): [] for r in roots}
        for p in range(args.pairs):
            for i, r in enumerate(roots):
                pair = {"load": load(), "commit": commit_of(r)}
                legs = ["iolib", "dali"] if (p + i) % 2 == 0 else ["dali", "iolib"]
                for leg in legs:
                    pair[leg] = run_leg(leg, r, args, jpegs, shards)
                pair["ratio"] = pair["iolib"]["rate"] / pair["dali"]["rate"]
                runs[str(r)].append(pair)
                print(
                    f"pair {p + 1} {commit_of(r)[:40]}: iolib {pair['iolib']['rate']:,.0f} "
                    f"DALI {pair['dali']['rate']:,.0f} images/s -> {pair['ratio']:.2f}x "
                    f"(load {pair['load']})",
                    flush=True,
                )
    write(args, roots, runs)


def write(
    args: SimpleNamespace, roots: list[Path], runs: dict[str, list[dict]], when: str = ""
) -> None:
    when = when or f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    summary = {}
    lines = [
        "# iolib images vs DALI's own reader",
        "",
        f"{when}, {os.cpu_count()} CPUs, {args.images} JPEGs {args.side}x{args.side} -> "
        f"{args.size}, batch {args.batch}, uint8 NHWC on the CPU; iolib: {args.workers} "
        f"persistent workers on `iolib convert` default shards; DALI: {args.threads} threads. "
        f"{args.pairs} pairs, each leg a fresh process, legs alternating; rate from the first "
        "batch to the last"
        + ("; the DALI leg imports torch first" if args.dali_imports_torch else "")
        + ". Command: `python benchmarks/bench_images_vs_dali.py "
        + " ".join(f"--root {r}" for r in args.roots)
        + (" --quick" if args.quick else f" --images {args.images} --pairs {args.pairs}")
        + (" --dali-imports-torch" if args.dali_imports_torch else "")
        + "`.",
        "",
        "Timed ratio: iolib / DALI images/s within a pair. Counted (steadier on a loaded "
        "machine): CPU ms and minor page faults per image of each leg's process tree, and "
        "the CPU ratio, DALI's CPU per image / iolib's (images per CPU second, iolib over "
        "DALI); peak RSS of the tree (sampled, shared pages once per process). The "
        "memory sampler's own CPU is left out of both legs' counts.",
        "",
        "| iolib from | timed ratio median | min-max | pairs (ratio, load 1/5/15 min) | "
        "iolib / DALI images/s | CPU ratio median (min-max) | CPU ms/image iolib / DALI | "
        "faults/image iolib / DALI | peak RSS MB iolib / DALI | first batch s iolib / DALI |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    med = statistics.median
    for r in roots:
        pairs = runs[str(r)]
        ratios = [p["ratio"] for p in pairs]
        row = {
            "commit": pairs[0].get("commit") or commit_of(r),
            "ratio_median": med(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "pairs": pairs,
        }
        cpu = [p["dali"]["cpu_ms_per_image"] / p["iolib"]["cpu_ms_per_image"] for p in pairs]
        row["cpu_ratio_median"] = med(cpu)
        summary[str(r)] = row
        each = "; ".join(f"{p['ratio']:.2f} ({p['load']})" for p in pairs)

        def both(key: str, fmt: str, pairs: list[dict] = pairs) -> str:
            a, b = (med(p[leg].get(key, float("nan")) for p in pairs) for leg in ("iolib", "dali"))
            return f"{a:{fmt}} / {b:{fmt}}"

        lines.append(
            f"| {row['commit'][:60]} | {row['ratio_median']:.2f}x | "
            f"{row['ratio_min']:.2f}-{row['ratio_max']:.2f} | {each} | {both('rate', ',.0f')} | "
            f"{med(cpu):.2f}x ({min(cpu):.2f}-{max(cpu):.2f}) | "
            f"{both('cpu_ms_per_image', '.2f')} | {both('faults_per_image', '.0f')} | "
            f"{both('peak_rss_mb', ',.0f')} | {both('first_s', '.2f')} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    for r in roots:
        print(verdict(summary[str(r)]))
    if args.out is None:
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    meta = {k: str(v) for k, v in vars(args).items() if k not in ("roots", "out")}
    args.out.with_suffix(".json").write_text(
        json.dumps({"when": when, "options": meta, "results": summary}, indent=1) + "\n"
    )


def verdict(row: dict) -> str:
    """One line against the targets: images/s >= 1.0x DALI's reader, peak memory within
    1.5x its (docs/benchmarks.md says how to read it on a loaded machine)."""
    pairs, med = row["pairs"], statistics.median
    cpu, faults, rss = (
        [med(p[leg][key] for p in pairs) for leg in ("iolib", "dali")]
        for key in ("cpu_ms_per_image", "faults_per_image", "peak_rss_mb")
    )
    return (
        f"images vs DALI's reader ({row['commit'][:12]}): timed {row['ratio_median']:.2f}x "
        f"({row['ratio_min']:.2f}-{row['ratio_max']:.2f}, target >= 1.0), per CPU "
        f"{row['cpu_ratio_median']:.2f}x ({cpu[0]:.2f} / {cpu[1]:.2f} ms an image), faults "
        f"{faults[0]:.0f} / {faults[1]:.0f} an image, peak RSS {rss[0]:,.0f} / {rss[1]:,.0f} "
        f"MB = {rss[0] / rss[1]:.2f}x (target <= 1.5), load {pairs[-1]['load']}"
    )


if __name__ == "__main__":
    main()
