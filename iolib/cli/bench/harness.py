"""Run a grid of configurations for iolib and torch through one measurement loop.

`BenchSpec` describes what to run (immutable); `run_bench` executes it and returns
observation rows (iolib.cli.bench.records). A Ctrl-C stops after the configuration being
measured, whose partial result is kept with `complete=False`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import os
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from iolib.base.redact import redact_text, secrets_in
from iolib.base.resources import cpu_count
from iolib.cli.bench import probes
from iolib.cli.bench.datasets import (
    Collate,
    FileSampleDataset,
    ParquetRowDataset,
    TokenRangeDataset,
)
from iolib.cli.bench.loop import BenchTimeout, bounded, measure
from iolib.cli.bench.profiles import Storage, prepare_storage
from iolib.cli.bench.records import machine_description, versions
from iolib.cli.bench.workloads import Workload, inspect_dataset, make_images, make_tokens

LOADERS = ("iolib", "torch")
SHUFFLES = ("none", "block", "global")
# What torch's Dataset reads (`--torch-reads`), and the words the verdict names it with.
TORCH_READS = {
    "row-groups": "a map-style Dataset that reads whole Parquet row groups and keeps the last "
    "one (what a user would otherwise write for these shards)",
    "samples": "a map-style Dataset that makes one request per sample (one JPEG file per "
    "image, one byte range of a flat token file per sequence)",
}


@dataclass(frozen=True)
class Config:
    loader: str
    workers: int
    depth: int
    shuffle: str
    batch_size: int
    step_ms: float
    cache: bool


@dataclass(frozen=True)
class BenchSpec:
    """Everything one `iolib bench` invocation measures."""

    workloads: tuple[str, ...] = ("images",)
    data: str | None = None
    data_options: dict[str, Any] | None = None
    samples: int = 1024
    image_size: int = 256
    seq_len: int = 2048
    rows_per_group: int = 256
    decode: bool = True
    decoder: str = "auto"  # with `data`: ImagePipeline's backend, as `iolib tune` decodes
    profiles: tuple[str, ...] = ("local",)
    overrides: dict[str, float | None] = field(default_factory=dict)
    loaders: tuple[str, ...] = LOADERS
    workers: tuple[int, ...] = (2,)
    depths: tuple[int, ...] = (4,)
    shuffles: tuple[str, ...] = ("none",)
    batch_sizes: tuple[int, ...] = (32,)
    step_ms: tuple[float, ...] = (0.0,)
    caches: tuple[bool, ...] = (False,)
    cache_max_bytes: int | None = None
    repeats: int = 1
    batches: int = 20
    max_seconds: float = 30.0
    step_mode: str = "sleep"
    seed: int = 0
    data_dir: str | None = None
    command: str = ""
    sweep_minutes: float | None = None  # time-bounded; the grid runs in a seeded random order
    torch_reads: str = "row-groups"  # a key of TORCH_READS; --data always reads row groups
    # (profile, step_ms) pairs: a profile named here runs that step only (the demo: a
    # step both loaders keep up with on local disk, a short one on the object store).
    profile_steps: tuple[tuple[str, float], ...] = ()

    def runs_step(self, profile: str, step_ms: float) -> bool:
        steps = dict(self.profile_steps)
        return profile not in steps or steps[profile] == step_ms

    def __post_init__(self) -> None:
        # The command line lands in observations, run.json and reports: never a credential
        # given in --data (s3://KEY:SECRET@...) or --storage-options.
        secrets = secrets_in([self.data or ""], self.data_options)
        object.__setattr__(self, "command", redact_text(self.command, secrets))

    def configs(self) -> list[Config]:
        grid = itertools.product(
            self.batch_sizes, self.step_ms, self.shuffles, self.caches, self.workers,
            self.depths, self.loaders,
        )  # fmt: skip
        return [Config(lo, w, d, sh, b, s, c) for b, s, sh, c, w, d, lo in grid]


@dataclass
class _Prepared:
    workload: Workload
    storage: Storage
    features: dict[str, dict[str, float]]  # loader -> feature columns


def _make_workload(spec: BenchSpec, kind: str, root: str) -> Workload:
    if kind == "images":
        return make_images(root, spec.samples, spec.image_size, spec.rows_per_group, spec.seed)
    return make_tokens(root, spec.samples, spec.seq_len, spec.rows_per_group, spec.seed)


def _features(wl: Workload, st: Storage, spec: BenchSpec) -> dict[str, dict[str, float]]:
    first = f"{st.raw_root}/{wl.parquet[0]}"
    storage = probes.probe_storage(first, st.raw_options)
    values = probes.first_samples(first, st.raw_options, wl.column)
    if wl.kind == "images" and spec.decode:
        # The file as the user named it: without the throttle's "throttled::" prefix.
        probes.check_images(values, wl.column, first.split("::")[-1])
    decode_ms = probes.probe_decode(values, wl.kind, spec.decode)
    parquet_bytes = _total_size(st.raw_root, st.raw_options, wl.parquet) / wl.num_samples
    torch_rows = 1
    if _torch_reads(wl, spec) == "row-groups":
        torch_bytes, torch_rows = parquet_bytes, wl.rows_per_group
    elif wl.samples:
        torch_bytes = sum(len(v) for v in values) / max(len(values), 1)
    else:
        torch_bytes = wl.seq_len * 4
    common = {**storage, "decode_ms_per_sample": decode_ms, "cpu_count": cpu_count()}
    return {
        "iolib": {**common, "bytes_per_sample": parquet_bytes, "rows_per_read": wl.rows_per_group},
        "torch": {**common, "bytes_per_sample": torch_bytes, "rows_per_read": torch_rows},
    }


def _torch_reads(wl: Workload, spec: BenchSpec) -> str:
    """What torch's Dataset reads: per-sample objects exist for synthetic data only."""
    return spec.torch_reads if wl.synthetic else "row-groups"


def _total_size(root: str, options: dict | None, rel: tuple[str, ...]) -> int:
    from iolib.storage import open_filesystem

    fs, base = open_filesystem(root, options)
    return sum(fs.size(f"{base}/{p}") for p in rel)


def make_loader(cfg: Config, wl: Workload, st: Storage, spec: BenchSpec) -> Any:
    """The loader a user would write for this layout, with `cfg`'s knobs."""
    decode = spec.decode and wl.kind == "images"
    # Real images (--data) decode as `iolib tune` decodes them (one ImagePipeline, in
    # both loaders); synthetic ones with Pillow in the collate.
    pipeline = None
    if decode and spec.data is not None:
        from iolib.cli.common import image_pipeline

        pipeline = image_pipeline(spec.image_size, spec.decoder)
    wanted = Collate(wl.column, decode and pipeline is None, spec.image_size, pipeline)
    collate = wanted if (decode or cfg.loader == "torch") else None
    root, options = (st.root, st.options) if cfg.cache else (st.raw_root, st.raw_options)
    if cfg.loader == "iolib":
        import iolib
        from iolib.sources import ParquetSource

        columns = [wl.column, "label"] if wl.labels else [wl.column]
        source = ParquetSource(
            [f"{root}/{p}" for p in wl.parquet], columns=columns, storage_options=options
        )
        shuffle = {"none": False, "block": "block", "global": "global"}[cfg.shuffle]
        return iolib.DataLoader(
            source, batch_size=cfg.batch_size, shuffle=shuffle, num_workers=cfg.workers,
            prefetch=cfg.depth, seed=spec.seed, drop_last=True,
            collate_fn=None if pipeline else collate, decode=pipeline,
        )  # fmt: skip
    import torch

    if _torch_reads(wl, spec) == "row-groups":
        ds: Any = ParquetRowDataset(root, options, wl.parquet, wl.column, bool(wl.labels))
    elif wl.samples:
        ds = FileSampleDataset(root, options, wl.samples, wl.labels)
    else:
        ds = TokenRangeDataset(root, options, wl.token_file, wl.seq_len, wl.num_samples)
    workers = cfg.workers
    return torch.utils.data.DataLoader(
        ds, batch_size=cfg.batch_size, shuffle=cfg.shuffle != "none",
        generator=torch.Generator().manual_seed(spec.seed), num_workers=workers,
        prefetch_factor=_torch_prefetch(cfg) if workers else None, drop_last=True,
        collate_fn=collate, persistent_workers=False,
    )  # fmt: skip


def _torch_prefetch(cfg: Config) -> int:
    return max(1, -(-cfg.depth // max(cfg.workers, 1)))


def effective(cfg: Config) -> tuple[int, str]:
    """(depth, shuffle) as the loader really runs them."""
    if cfg.loader == "torch":
        depth = _torch_prefetch(cfg) * cfg.workers if cfg.workers else 0
        return depth, "none" if cfg.shuffle == "none" else "global"
    return cfg.depth, cfg.shuffle


def run_one(cfg: Config, prep: _Prepared, spec: BenchSpec, on_batch=None) -> dict[str, Any]:
    """Measure one configuration once: features + config + outcomes (no meta)."""
    loader = make_loader(cfg, prep.workload, prep.storage, spec)
    stats = getattr(loader, "stats", None)
    m = measure(
        lambda: loader, batch_size=cfg.batch_size, step_ms=cfg.step_ms, batches=spec.batches,
        max_seconds=spec.max_seconds, step_mode=spec.step_mode, on_batch=on_batch, stats=stats,
    )  # fmt: skip
    if m.timed_out:
        where = f"{cfg.loader} with {cfg.workers} worker(s) on {prep.storage.name}"
        raise BenchTimeout(
            f"{where} handed over no batch within --max-seconds {spec.max_seconds:g} (the "
            f"loader waits on storage); it was left behind and the run stopped. Lower "
            "--latency-ms or --jitter, or raise --max-seconds."
        )
    depth, shuffle = effective(cfg)
    if cfg.loader == "iolib" and not m.interrupted:
        from iolib.tuning.run_history import record_measured

        outcomes = m.outcomes(0.0, depth)
        record_measured(
            None, loader, kind="bench", workers=cfg.workers, depth=depth,
            utilization=outcomes["utilization"], batches=int(outcomes["batches"]),
            step_ms=cfg.step_ms, lateness_ms=m.stalls[1:],
        )  # fmt: skip
    features = prep.features[cfg.loader]
    row = {
        **features, "batch_size": cfg.batch_size, "step_ms": cfg.step_ms,
        "workers": cfg.workers, "depth": int(m.loader_stats.get("depth", depth)),
        "shuffle": shuffle, "cache": cfg.cache,
        **m.outcomes(features["bytes_per_sample"], depth),
        "bytes_read": int(m.loader_stats.get("bytes_read", -1)),
        "retries": int(m.loader_stats.get("retries", -1)),
        "complete": not m.interrupted,
    }  # fmt: skip
    return row


@contextlib.contextmanager
def _s3_if_needed(spec: BenchSpec) -> Iterator[dict | None]:
    if "s3" in spec.profiles:
        from iolib.cli.bench.s3server import moto_s3

        with moto_s3() as options:
            yield options
    else:
        yield None


def run_bench(
    spec: BenchSpec,
    progress: Callable[[int], Any] | None = None,
    on_row: Callable[[dict], None] | None = None,
) -> tuple[list[dict[str, Any]], bool]:
    """Run `spec`; returns (rows, interrupted). `progress(total)` returns a tqdm-like bar.
    A wait past `spec.max_seconds` raises BenchTimeout, with the rows measured before it
    as its `rows`."""
    rows: list[dict[str, Any]] = []
    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]
    meta = {"run_id": run_id, "machine": machine_description(), "versions": versions(),
            "command": spec.command, "schema_version": 1}  # fmt: skip
    configs = spec.configs()
    n_work = len(spec.workloads) if spec.data is None else 1
    pairs = sum(spec.runs_step(p, c.step_ms) for p in spec.profiles for c in configs)
    total = n_work * pairs * spec.repeats
    bar = progress(total) if progress else None
    deadline = time.monotonic() + 60 * spec.sweep_minutes if spec.sweep_minutes else None
    with contextlib.ExitStack() as stack:
        base = spec.data_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="iolib-"))
        s3_options = stack.enter_context(_s3_if_needed(spec))
        try:
            preps = list(_prepared(spec, base, s3_options))
            work = [
                (p, i, c) for p in preps for i, c in enumerate(configs)
                if spec.runs_step(p.storage.name, c.step_ms)
            ]  # fmt: skip
            if spec.sweep_minutes is not None:  # interleave profiles and workloads
                random.Random(spec.seed).shuffle(work)
            for prep, i, cfg in work:
                if deadline is not None and time.monotonic() > deadline:
                    return rows, False
                config_id = f"{prep.workload.name}/{prep.storage.name}/{i}"
                for repeat in range(spec.repeats):
                    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
                    row = run_one(cfg, prep, spec)
                    row.update(meta, workload=prep.workload.name, loader=cfg.loader,
                               storage_profile=prep.storage.name, config_id=config_id,
                               repeat=repeat, timestamp=started)  # fmt: skip
                    rows.append(row)
                    if on_row:
                        on_row(row)
                    if bar is not None:
                        bar.update(1)
                    if not row["complete"]:
                        return rows, True
        except KeyboardInterrupt:
            return rows, True
        except BenchTimeout as exc:
            exc.rows = rows  # what was measured before the wait that ran out
            raise
        finally:
            if bar is not None:
                bar.close()
    return rows, False


def _prepared(spec: BenchSpec, base: str, s3_options: dict | None) -> Iterator[_Prepared]:
    works: list[tuple[Workload, str]] = []
    if spec.data is not None:
        root, wl = inspect_dataset(spec.data, spec.data_options, spec.workloads[0])
        works.append((wl, root))
    else:
        for kind in spec.workloads:
            local = os.path.join(base, f"{kind}-{spec.samples}-{spec.seed}")
            works.append((_make_workload(spec, kind, local), local))
    for profile in spec.profiles:
        for wl, root in works:
            cache_dir = None
            if any(spec.caches):
                cache_dir = os.path.join(base, f"cache-{uuid.uuid4().hex[:6]}")
            st = _storage_for(spec, profile, root, s3_options, cache_dir)
            features = bounded(
                lambda wl=wl, st=st: _features(wl, st, spec),
                spec.max_seconds,
                f"Probing the {profile} storage (latency, bandwidth, decode cost)",
            )
            yield _Prepared(wl, st, features)


def _storage_for(spec, profile, root, s3_options, cache_dir) -> Storage:
    if spec.data is not None:
        from iolib.cli.bench.profiles import throttle_options
        from iolib.storage import wrap_url

        throttle = None if profile == "local" else throttle_options(profile, spec.overrides, 0)
        url, options = root, spec.data_options
        if throttle:
            url, options = wrap_url(url, options, "throttled", throttle)
        return Storage(profile, url, options, url, options, throttle)
    return prepare_storage(
        profile, root, overrides=spec.overrides, seed=spec.seed, s3_options=s3_options,
        cache_dir=cache_dir, cache_max_bytes=spec.cache_max_bytes,
    )  # fmt: skip
