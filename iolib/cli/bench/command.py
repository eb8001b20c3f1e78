"""`iolib bench`: measure loading configurations, iolib and torch side by side.

With no arguments: synthetic 256x256 JPEGs on the `local` and `object-store` profiles,
4 workers, depth 8, about a minute on 2 cores. Grids are
comma-separated lists (`--workers 1,2,4 --depth 2,8`). See docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import warnings
from typing import Any

import click

from iolib.base.redact import redact_text, secrets_in
from iolib.cli.bench.harness import SHUFFLES, TORCH_READS, BenchSpec
from iolib.cli.bench.profiles import PROFILE_NAMES
from iolib.cli.bench.workloads import WORKLOAD_KINDS
from iolib.cli.common import (
    IMAGE_BATCH,
    IMAGE_SIZE,
    Number,
    NumberList,
    decoder_option,
    require_report_extra,
    storage_options_option,
)

# The sweep behind `--sweep` (a training set for the predictor; time-bounded).
SWEEP = {
    "workloads": ("images", "tokens"),
    "profiles": ("local", "nvme", "nas", "object-store"),
    "workers": (1, 2, 4, 8),
    "depths": (1, 2, 4, 8, 16),
    "step_ms": (5.0, 10.0, 20.0, 40.0),  # > 0: utilization needs a training step
    "batch_sizes": (32, 64),
    "shuffles": ("none", "block"),
}


# The demo's (`iolib bench` with no --profile or --step-ms) step on a profile, where it
# differs from --step-ms: 5 ms on the object store, where the loader sets the pace.
DEMO_STEPS = {"object-store": 5.0}


# Bounds of the numeric options: far past any real use, short of what would run for hours
# or start a process per core of a cluster. A wait never exceeds the run's --max-seconds.
MAX_WORKERS = 256
MAX_LATENCY_MS = 60_000.0  # a minute to first byte: past that, storage is down, not slow


def _grid(choices: tuple[str, ...]):
    """A comma-separated list of names out of `choices` (numbers go through NumberList)."""

    def convert(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        if value is None:
            return None
        out = []
        for item in (v.strip() for v in str(value).split(",") if v.strip()):
            if item not in choices:
                raise click.BadParameter(
                    f"{item!r} is not one of {', '.join(choices)}.", param=param
                )
            out.append(item)
        if not out:
            raise click.BadParameter("give at least one value.", param=param)
        return tuple(out)

    return convert


@click.command("bench", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--workload",
    "-w",
    default="images",
    metavar="KIND[,KIND]",
    callback=_grid(WORKLOAD_KINDS),
    show_default=True,
    help="What to measure: images (JPEGs decoded with Pillow), tokens (int32 sequences) or "
    "both (images,tokens). Synthetic data of that kind is made; with --data, the kind of "
    "column to read (images: a binary column; tokens: a list of integers).",
)
@click.option(
    "--data",
    default=None,
    metavar="URL",
    help="Measure this Parquet dataset (a path or fsspec URL, e.g. what `iolib convert` "
    "wrote) instead of synthetic data. Default: synthetic data.",
)
@storage_options_option
@click.option(
    "--samples",
    type=Number(int, 64, 10_000_000),
    default=1024,
    show_default=True,
    help="Synthetic samples per workload.",
)
@click.option(
    "--image-size",
    type=Number(int, 16, 4096, unit="pixels"),
    default=256,
    show_default=True,
    help="Side in pixels of the synthetic JPEGs; every decoded image is resized to this "
    "square, so a --data folder of mixed sizes batches.",
)
@click.option(
    "--seq-len",
    type=Number(int, 1, 1 << 20),
    default=2048,
    show_default=True,
    help="Tokens per synthetic sequence (tokens workload).",
)
@click.option(
    "--rows-per-group",
    type=Number(int, 1, 10_000_000),
    default=256,
    show_default=True,
    help="Parquet row-group size of synthetic data (rows per iolib read).",
)
@click.option(
    "--decode/--no-decode",
    default=True,
    show_default=True,
    help="Decode JPEGs in both loaders (else measure reads only): Pillow in the collate on "
    "synthetic data; with --data the decode `iolib tune` measures (--decoder, at 224 px and "
    "batch 64 unless given).",
)
@decoder_option
@click.option(
    "--profile",
    "-p",
    default="local,object-store",
    show_default=True,
    callback=_grid(PROFILE_NAMES),
    help=f"Storage profiles, comma-separated: {', '.join(PROFILE_NAMES)} (docs/benchmarks.md "
    "gives each one's latency and bandwidth).",
)
@click.option(
    "--latency-ms",
    type=Number(float, 0, MAX_LATENCY_MS, unit="ms"),
    default=None,
    help="Throttle: per-request latency in ms (for custom, or overrides a profile's). "
    "Default: the profile's.",
)
@click.option(
    "--bandwidth-mbps",
    type=Number(float, 0, 1e6, unit="MB/s"),
    default=None,
    help="Throttle: per-request bandwidth, MB/s. Default: the profile's.",
)
@click.option(
    "--jitter",
    type=Number(float, 0, 3),
    default=None,
    help="Throttle: lognormal sigma of the latency (3 puts p99 at ~1000x the median). "
    "Default: the profile's.",
)
@click.option(
    "--shuffle",
    default="none",
    show_default=True,
    callback=_grid(SHUFFLES),
    help="Sample order, comma-separated: none, block (iolib's row-group windows; torch runs "
    "global) or global.",
)
@click.option(
    "--batch-size",
    "-b",
    default="32",
    show_default=True,
    type=NumberList(Number(int, 1, 1_000_000)),
    help="Samples per batch (comma-separated to compare several).",
)
@click.option(
    "--workers",
    default="4",
    show_default=True,
    type=NumberList(Number(int, 0, MAX_WORKERS)),
    help="Workers per loader, comma-separated: iolib's threads, torch's processes; 0 reads "
    "in the training loop.",
)
@click.option(
    "--depth",
    default="8",
    show_default=True,
    type=NumberList(Number(int, 1, 4096)),
    help="Batches in flight or ready (torch: prefetch_factor = depth / workers).",
)
@click.option(
    "--step-ms",
    default="40",
    show_default=True,
    type=NumberList(Number(float, 0, 60_000, unit="ms")),
    help="Simulated training step per batch in ms (the GPU's time), comma-separated. The "
    "default, 40, is about a ResNet-50 training step at batch 32 on a V100-class GPU; 0 "
    "measures the loaders flat out (no utilization then: nothing to keep busy).",
)
@click.option(
    "--step-mode",
    type=click.Choice(["sleep", "spin"]),
    default="sleep",
    show_default=True,
    help="How the step passes: sleep (a GPU step: the CPU is free) or spin (a CPU-bound step).",
)
@click.option(
    "--repeats",
    type=Number(int, 1, 1000),
    default=3,
    show_default=True,
    help="Runs of each configuration; the table shows the median and min-max.",
)
@click.option(
    "--batches",
    type=Number(int, 2, 1_000_000),
    default=32,
    show_default=True,
    help="Batches measured per configuration (the first is start-up); the default is one "
    "pass over the default 1,024 samples at batch 32.",
)
@click.option(
    "--max-seconds",
    type=Number(float, 0.1, 86_400, unit="s"),
    default=30.0,
    show_default=True,
    help="Cap on one configuration's measured time, and on every wait: a storage probe, or "
    "a first batch, that takes longer stops the run with what to change.",
)
@click.option(
    "--compare",
    type=click.Choice(["torch", "none"]),
    default="torch",
    show_default=True,
    help="torch: also run torch.utils.data.DataLoader on the same samples; none: iolib only.",
)
@click.option(
    "--torch-reads",
    type=click.Choice(list(TORCH_READS)),
    default="row-groups",
    show_default=True,
    help="What torch's Dataset reads (synthetic data): row-groups, the Parquet shards iolib "
    "reads, a row group at a time, keeping the last one (what a user would otherwise "
    "write); samples, one request per sample (a JPEG file per image, a byte range of a "
    "flat token file). With --data: row-groups.",
)
@click.option(
    "--loaders",
    default=None,
    callback=_grid(("iolib", "torch")),
    help="Loaders to run, comma-separated: iolib, torch (overrides --compare). "
    "Default: from --compare.",
)
@click.option(
    "--cache",
    type=click.Choice(["off", "on", "both"]),
    default="off",
    show_default=True,
    help="Local disk cache of remote shards: off, on, or both (measure each).",
)
@click.option(
    "--cache-max-gb",
    type=Number(float, 0, 1e6, low_open=True, unit="GB"),
    default=None,
    help="Size bound of that cache in GB (LRU eviction). Default: unbounded.",
)
@click.option("--sweep", is_flag=True, help="Run the predictor's training grid (time-bounded).")
@click.option(
    "--sweep-minutes",
    type=Number(float, 0.1, 10_080, unit="minutes"),
    default=15.0,
    show_default=True,
    help="Time bound of --sweep, in minutes.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Write observations (Parquet, JSON) and run.json here.",
)
@click.option("--plot", is_flag=True, help="Write PNG plots (into --out, else ./bench-plots).")
@click.option(
    "--seed",
    type=Number(int, 0, 2**63 - 1),
    default=0,
    show_default=True,
    help="Seed of the synthetic data, the shuffles and the throttle's jitter.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where synthetic data is written (default: a temporary directory).",
)
@click.option(
    "--progress/--no-progress",
    default=True,
    show_default=True,
    help="Show a progress bar on stderr when it is a terminal (never in a log file, where "
    "it would share a line with the table).",
)
def bench(**kw: Any) -> None:
    """Measure data-loading configurations, iolib and torch's DataLoader side by side."""
    require_report_extra("iolib bench")
    spec = _spec(kw)
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    from tqdm import tqdm

    from iolib.cli.bench import display
    from iolib.cli.bench.harness import run_bench

    def progress(total: int):
        # disable=None: tqdm's "off unless stderr is a terminal", so a log of stdout and
        # stderr together never holds a bar's carriage returns before the table.
        return tqdm(total=total, desc="iolib bench", unit="run",
                    disable=None if kw["progress"] else True,
                    file=sys.stderr, leave=False)  # fmt: skip

    from iolib.cli.bench.loop import BenchTimeout

    try:
        rows, interrupted = run_bench(spec, progress=progress)
    except BenchTimeout as exc:
        _write(getattr(exc, "rows", []), spec, kw["out"], kw["plot"])  # what came before it
        raise
    if rows:
        click.echo(display.summary_table(rows))
        click.echo(display.LEGEND)
        if spec.data is not None and spec.decode and "images" in spec.workloads:
            from iolib.cli.common import image_pipeline

            backend = image_pipeline(spec.image_size, spec.decoder).resolved_backend()
            click.echo(
                f"Decoder: {backend} (ImagePipeline, {spec.image_size} px, batch "
                f"{','.join(map(str, spec.batch_sizes))}; what `iolib tune` measures)"
            )
        said = display.verdict(rows, TORCH_READS[spec.torch_reads] if spec.data is None else
                              TORCH_READS["row-groups"])  # fmt: skip
        if said:
            click.echo("")
            click.echo(click.wrap_text(said, width=100))
    _write(rows, spec, kw["out"], kw["plot"])
    if interrupted:
        click.echo(f"Stopped by Ctrl-C after {len(rows)} measurements.", err=True)
        raise click.Abort()


def writable_directory(path: str, option: str) -> None:
    """Create `path` if needed and check it can be written, before any work is done."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise click.BadParameter(
            f"cannot write to {path!r}: {exc.strerror or exc}.", param_hint=option
        ) from None


def _spec(kw: dict[str, Any]) -> BenchSpec:
    for option in ("out", "data_dir"):
        if kw[option]:
            writable_directory(kw[option], f"--{option.replace('_', '-')}")
    if kw["plot"] and not kw["out"]:
        writable_directory("bench-plots", "--plot")
    options = kw["storage_options"] or None
    if kw["data"] is not None:
        if "::" in kw["data"]:
            raise click.BadParameter("give a plain URL; --profile adds the throttle.",
                                     param_hint="--data")  # fmt: skip
        bad = [p for p in kw["profile"] if p in ("memory", "s3")]
        if bad:
            raise click.BadParameter(
                f"{bad[0]} applies to synthetic data; with --data use local, nvme, nas, "
                "object-store or custom.", param_hint="--profile",
            )  # fmt: skip
        if len(kw["workload"]) > 1:
            raise click.BadParameter("with --data give one workload.", param_hint="--workload")
        # Real images decode as `iolib tune` decodes them: the same size and batch.
        ctx = click.get_current_context()
        default = click.core.ParameterSource.DEFAULT
        if ctx.get_parameter_source("image_size") == default:
            kw["image_size"] = IMAGE_SIZE
        if ctx.get_parameter_source("batch_size") == default:
            kw["batch_size"] = (IMAGE_BATCH,)
    loaders = kw["loaders"] or (("iolib", "torch") if kw["compare"] == "torch" else ("iolib",))
    caches = {"off": (False,), "on": (True,), "both": (False, True)}[kw["cache"]]
    grid: dict[str, Any] = {
        "workloads": kw["workload"], "profiles": kw["profile"], "workers": kw["workers"],
        "depths": kw["depth"], "step_ms": kw["step_ms"], "batch_sizes": kw["batch_size"],
        "shuffles": kw["shuffle"],
    }  # fmt: skip
    ctx = click.get_current_context()
    demo = all(ctx.get_parameter_source(n) == click.core.ParameterSource.DEFAULT
               for n in ("profile", "step_ms", "sweep", "data"))  # fmt: skip
    profile_steps: tuple[tuple[str, float], ...] = ()
    if demo:  # the loader as the bottleneck too: a short step on the object store
        grid["step_ms"] = tuple(dict.fromkeys((*kw["step_ms"], *DEMO_STEPS.values())))
        profile_steps = tuple((p, DEMO_STEPS.get(p, kw["step_ms"][0])) for p in kw["profile"])
    if kw["sweep"]:
        for key, name in (("workloads", "workload"), ("profiles", "profile"),
                          ("workers", "workers"), ("depths", "depth"), ("step_ms", "step_ms"),
                          ("batch_sizes", "batch_size"), ("shuffles", "shuffle")):  # fmt: skip
            if ctx.get_parameter_source(name) == click.core.ParameterSource.DEFAULT:
                grid[key] = SWEEP[key]
        for name, value in (("batches", 40), ("max_seconds", 8.0)):  # many short runs
            if ctx.get_parameter_source(name) == click.core.ParameterSource.DEFAULT:
                kw[name] = value
    return BenchSpec(
        **grid, data=kw["data"], data_options=options, samples=kw["samples"],
        image_size=kw["image_size"], seq_len=kw["seq_len"], rows_per_group=kw["rows_per_group"],
        decode=kw["decode"], decoder=kw["decoder"], loaders=tuple(loaders), caches=caches,
        overrides={"latency_ms": kw["latency_ms"], "bandwidth_mbps": kw["bandwidth_mbps"],
                   "jitter": kw["jitter"]},
        cache_max_bytes=int(kw["cache_max_gb"] * 1e9) if kw["cache_max_gb"] else None,
        repeats=kw["repeats"], batches=kw["batches"], max_seconds=kw["max_seconds"],
        step_mode=kw["step_mode"], seed=kw["seed"], data_dir=kw["data_dir"],
        command=_command_line(secrets_in([kw["data"] or ""], options)),
        sweep_minutes=kw["sweep_minutes"] if kw["sweep"] else None,
        torch_reads=kw["torch_reads"], profile_steps=profile_steps,
    )  # fmt: skip


def _command_line(secrets: frozenset[str] = frozenset()) -> str:
    """`iolib bench` plus every option the user set (not the defaults), reproducibly quoted,
    each argument redacted before quoting (quoting would split a secret holding a quote)."""
    ctx = click.get_current_context()
    parts = ["iolib", "bench"]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) == click.core.ParameterSource.DEFAULT:
            continue
        raw = ctx.params[param.name]
        flag = param.opts[0]
        if isinstance(param, click.Option) and param.is_flag:
            parts.append(flag if raw else (param.secondary_opts or [flag])[0])
            continue
        if isinstance(param, click.Option) and param.multiple:
            for value in raw:
                parts += [flag, redact_text(str(value), secrets)]
            continue
        if isinstance(raw, tuple):
            raw = ",".join(str(v) for v in raw)
        parts += [flag, redact_text(str(raw), secrets)]
    return shlex.join(parts)


def _write(rows: list[dict[str, Any]], spec: BenchSpec, out: str | None, plot: bool) -> None:
    from iolib.cli.bench import display, records

    if out and rows:
        paths = records.write_observations(rows, out)
        run = {"command": spec.command, "machine": records.machine_description(),
               "versions": json.loads(records.versions()), "rows": len(rows),
               "schema_version": records.SCHEMA_VERSION}  # fmt: skip
        with open(os.path.join(out, "run.json"), "w") as f:
            json.dump(run, f, indent=1)
        click.echo(f"Observations: {', '.join(paths)}", err=True)
    if plot and rows:
        pngs = display.plot(rows, out or "bench-plots")
        click.echo(f"Plots: {', '.join(pngs)}", err=True)
