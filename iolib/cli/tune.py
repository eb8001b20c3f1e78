"""`iolib tune`: recommend workers and prefetch depth for a dataset and a step time.

It runs the learned tuner on the real data for `--batches` batches, across epochs
(the probe: the tuner measures storage, decode, CPU and step times through telemetry),
then runs the probe's configuration and a few others on their own for
`--verify-batches` each, and recommends only what it measured: the least memory that
met the target, else the best measured, said to miss it and why. The report
(predictors.report) shows every run's own measurement and what drives the result.

    iolib tune s3://bucket/train/ --step-ms 50 --target 0.9 --out tune-report

The cross-workload model's training and evaluation are research, outside the package:
`python -m benchmarks.tuner_lab evaluate|retrain` from a source checkout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from iolib.cli.common import (
    IMAGE_BATCH,
    IMAGE_SIZE,
    ByteSize,
    Number,
    decoder_option,
    image_pipeline,
    require_report_extra,
    storage_options_option,
)
from iolib.cli.tune_probe import TuneRequest


def _source(data: str, storage_options: dict[str, Any], column: str | None) -> Any:
    from iolib.sources import ImageFolderSource, ParquetSource
    from iolib.storage import open_filesystem

    fs, path = open_filesystem(data, storage_options)
    is_dir = fs.isdir(path)
    if is_dir and not any(p.endswith((".parquet", ".pq")) for p in fs.find(path)):
        return ImageFolderSource(data, storage_options)
    return ParquetSource(data, [column] if column else None, storage_options)


def _decoder(source: Any, size: int, decoder: str) -> Any:
    names = getattr(source, "schema", None)
    names = names.names if names is not None else ["image"]
    if "image" not in names:
        return None
    return image_pipeline(size, decoder)


def _loader_args(request: TuneRequest, decode: Any) -> dict[str, str]:
    """Every loader setting the measurements used, as Python source for the snippet."""
    args = {"batch_size": str(request.batch_size), "shuffle": repr(request.shuffle)}
    if decode is not None:
        backend = "" if decode.backend == "auto" else f", backend={decode.backend!r}"
        args["decode"] = f"ImagePipeline(size={decode.size}, train={decode.train}{backend})"
    args["persistent_workers"] = "True"
    return args


def _recommend(request: TuneRequest) -> dict[str, Path]:
    import pandas as pd

    from iolib.cli import tune_probe
    from iolib.loader import DataLoader
    from iolib.tuning.run_history import HistoryAs, next_run_of, record_measured
    from predictors.report import write_report

    source = _source(request.data, request.storage_options, request.column)
    decode = _decoder(source, request.image_size, request.decoder) if request.decode else None
    decoder = "none (reads only)" if decode is None else decode.resolved_backend()
    common = dict(
        batch_size=request.batch_size, shuffle=request.shuffle, decode=decode,
        persistent_workers=True,
    )  # fmt: skip
    with click.progressbar(length=2, label="tuning", file=sys.stderr) as bar:
        loader = DataLoader(
            source,
            **common,
            prefetch="auto",
            num_workers=request.max_workers,
            target_utilization=request.target,
            memory_budget=request.memory_budget,
            history=HistoryAs(None, "tune"),  # recorded, and warm from earlier runs
        )
        probe = tune_probe.run(loader, request.batches, request.step_ms)
        tuner, last = loader.autotune.tuner, loader.autotune.last
        final = (probe["stats"]["workers"], probe["stats"]["depth"])
        bar.update(1)
        drivers = tune_probe.drivers(probe, tuner, request)
        batch_bytes = float(probe["stats"]["batch_bytes"])
        keys = tune_probe.checks(tuner, final, request, batch_bytes)
        runs: dict[tuple[int, int], list[dict[str, Any]]] = {k: [] for k in keys}
        # Repeats interleaved: a slow spell of the machine falls on every configuration.
        for _ in range(request.repeats):
            for workers, depth in keys:
                fixed = DataLoader(source, **common, num_workers=workers, prefetch=depth)
                run = tune_probe.run(fixed, request.verify_batches, request.step_ms)
                runs[(workers, depth)].append(run)
                record_measured(
                    None, fixed, kind="tune", workers=workers, depth=depth,
                    utilization=run["utilization_in_epoch"], batches=run["batches"],
                    step_ms=request.step_ms, target=request.target,
                )  # fmt: skip
        bar.update(1)
    upcoming = next_run_of(
        HistoryAs(None, "tune"), loader, target=request.target,
        memory_budget=request.memory_budget, max_workers=request.max_workers,
    )  # fmt: skip
    point, lower = tuner.forecaster.predict(keys, drivers["estimate"], drivers["cpu_count"])
    predicted = {k: (float(p), float(b)) for k, p, b in zip(keys, point, lower, strict=True)}
    rows = tune_probe.summarize_runs(runs, predicted)
    pick, meets, cheaper = tune_probe.choose(rows, request.target)
    recommendation = {
        "workers": int(pick["workers"]),
        "depth": int(pick["depth"]),
        "meets_target": meets,
        "measured_utilization": float(pick["measured_utilization"]),
        "measured_memory_bytes": float(pick["memory_bytes"]),
        "why_missed": None if meets else tune_probe.why_missed(drivers, request, last),
        "cheaper_within_noise": cheaper,
        "prediction_notes": tune_probe.prediction_notes(rows),
        "step_note": tune_probe.step_note(probe, request.step_ms),
        "decoder": decoder,
        "loader_args": _loader_args(request, decode),
        "repeats": request.repeats,
        "probe_batches": probe["batches"],
        "probe_epochs": probe["epochs"],
        "verify_batches": request.verify_batches,
        "tuner_reason": last.reason if last is not None else None,
        "next_run": None if upcoming is None else upcoming["why"],
    }
    paths = write_report(
        request.out,
        recommendation,
        pd.DataFrame(rows),
        drivers,
        step_ms=request.step_ms,
        target=request.target,
    )
    verdict = "meets" if meets else "target missed; best measured"
    click.echo(
        f"{recommendation['workers']} worker(s), depth {recommendation['depth']}: measured "
        f"{recommendation['measured_utilization']:.2f} against {request.target:.2f} ({verdict}); "
        f"decoder: {decoder}"
    )
    if not meets:
        click.echo(f"Why: {recommendation['why_missed']}")
    if recommendation["next_run"]:
        click.echo(f"Next prefetch='auto' run: {recommendation['next_run']}")
    return paths


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("data", required=False)
@click.option(
    "--step-ms",
    type=Number(float, 0, 60_000, low_open=True, unit="ms"),
    default=50.0,
    show_default=True,
    help="Your training step per batch (GPU time), in ms.",
)
@click.option(
    "--target",
    type=Number(float, 0, 1, low_open=True, high_open=True),
    default=0.9,
    show_default=True,
    help="Utilization to reach: step/(step+stall).",
)
@click.option(
    "--memory-budget",
    type=ByteSize(),
    default=None,
    help="Most memory for batches in flight or ready, e.g. 2GiB or 512MB. Default: no bound.",
)
@click.option(
    "--batch-size",
    type=Number(int, 1, 1_000_000),
    default=IMAGE_BATCH,
    show_default=True,
    help="Samples per batch (iolib bench --data uses the same default).",
)
@click.option(
    "--shuffle",
    type=click.Choice(["none", "block", "global"]),
    default="block",
    show_default=True,
    help="Sample order (block: row-group windows, the remote-friendly one).",
)
@click.option(
    "--max-workers",
    type=Number(int, 1, 256),
    default=8,
    show_default=True,
    help="The most workers the tuner may use.",
)
@click.option(
    "--column", default=None, help="Read only this Parquet column. Default: every column."
)
@click.option(
    "--no-decode", is_flag=True, help="Do not decode an image column (default: decode it)."
)
@click.option(
    "--image-size",
    type=Number(int, 1, 4096, unit="pixels"),
    default=IMAGE_SIZE,
    show_default=True,
    help="Side in pixels images are cropped and resized to when decoded.",
)
@decoder_option
@click.option(
    "--batches",
    type=Number(int, 10, 1_000_000),
    default=80,
    show_default=True,
    help="Batches the tuner measures and decides over (across epochs if need be).",
)
@click.option(
    "--verify-batches",
    type=Number(int, 5, 1_000_000),
    default=40,
    show_default=True,
    help="Batches per verification run (across epochs if need be).",
)
@click.option(
    "--repeats",
    type=Number(int, 1, 100),
    default=3,
    show_default=True,
    help="Runs of each configuration verified, interleaved (their spread is the noise).",
)
@storage_options_option
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="tune-report",
    show_default=True,
    help="Where report.md, report.html and plots go.",
)
def tune(**kw: Any) -> None:
    """Recommend workers and prefetch depth for DATA (a Parquet or image-folder URL) so
    the training step stays busy at --target, with the least memory; write a report."""
    if not kw["data"]:
        raise click.UsageError("Give DATA (a dataset URL).")
    from iolib.cli.bench.command import writable_directory

    require_report_extra("iolib tune")

    writable_directory(kw["out"], "--out")  # before the probe, not after its whole run
    request = TuneRequest(
        data=kw["data"], out=kw["out"], storage_options=kw["storage_options"],
        column=kw["column"], decode=not kw["no_decode"], image_size=kw["image_size"],
        batch_size=kw["batch_size"], shuffle=kw["shuffle"], max_workers=kw["max_workers"],
        target=kw["target"], memory_budget=kw["memory_budget"], batches=kw["batches"],
        verify_batches=kw["verify_batches"], step_ms=kw["step_ms"], repeats=kw["repeats"],
        decoder=kw["decoder"],
    )  # fmt: skip
    paths = _recommend(request)
    click.echo(f"Report: {paths['markdown']} (and {paths['html'].name}, plots beside it)")
    return None
