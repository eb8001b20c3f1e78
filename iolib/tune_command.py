"""`iolib tune`: recommend workers and prefetch depth for a dataset and a step time.

It runs the learned tuner on the real data for `--batches` batches, across epochs
(the probe: the tuner measures storage, decode, CPU and step times through telemetry),
then runs the probe's configuration and a few others on their own for
`--verify-batches` each, and recommends only what it measured: the least memory that
met the target, else the best measured, said to miss it and why. The report
(predictors.report) shows every run's own measurement and what drives the result.

    iolib tune s3://bucket/train/ --step-ms 50 --target 0.9 --out tune-report
    iolib tune --evaluate predictors/data/sweep/observations.parquet
    iolib tune --retrain my-observations.parquet
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from iolib._cli_common import ByteSize, Number, storage_options_option
from iolib.errors import ConfigError
from iolib.tune_probe import TuneRequest

DEFAULT_OBSERVATIONS = Path(__file__).parent.parent / "predictors" / "data" / "sweep"
CHECKOUT = Path(__file__).resolve().parent.parent  # a source checkout holds benchmarks/ here


def lab_training() -> ModuleType:
    """The model training (`benchmarks.tuner_lab.training`): research that the package
    does not ship, found in the source checkout iolib runs from, with scikit-learn."""
    fix = (
        "Fix: run it from a source checkout of iolib (it holds benchmarks/tuner_lab/) "
        "installed with `pip install -e '.[lab]'`."
    )
    if importlib.util.find_spec("sklearn") is None:
        raise ConfigError(f"--evaluate and --retrain need scikit-learn. {fix}")
    if (CHECKOUT / "benchmarks" / "tuner_lab").is_dir() and str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
    try:
        return importlib.import_module("benchmarks.tuner_lab.training")
    except ImportError as exc:
        raise ConfigError(
            f"--evaluate and --retrain need the tuner's lab, which the installed "
            f"package does not include ({exc}). {fix}"
        ) from exc


def _observation_files(paths: tuple[str, ...]) -> list[Path]:
    found = [Path(p) for p in paths] or sorted(DEFAULT_OBSERVATIONS.glob("*.parquet"))
    missing = [str(p) for p in found if not p.exists()]
    if missing or not found:
        raise ConfigError(
            f"Observation file(s) {missing or 'none'} not found. Pass files written by "
            "`iolib bench --out DIR` (DIR/observations.parquet)."
        )
    return found


def _source(data: str, storage_options: dict[str, Any], column: str | None) -> Any:
    from iolib.sources import ImageFolderSource, ParquetSource
    from iolib.storage import open_filesystem

    fs, path = open_filesystem(data, storage_options)
    is_dir = fs.isdir(path)
    if is_dir and not any(p.endswith((".parquet", ".pq")) for p in fs.find(path)):
        return ImageFolderSource(data, storage_options)
    return ParquetSource(data, [column] if column else None, storage_options)


def _decoder(source: Any, size: int) -> Any:
    names = getattr(source, "schema", None)
    names = names.names if names is not None else ["image"]
    if "image" not in names:
        return None
    from iolib.images import ImagePipeline

    return ImagePipeline(size=size, train=True)


def _recommend(request: TuneRequest) -> dict[str, Path]:
    import pandas as pd

    from iolib import tune_probe
    from iolib.loader import DataLoader
    from iolib.run_history import HistoryAs, record_measured
    from predictors.report import write_report

    source = _source(request.data, request.storage_options, request.column)
    decode = _decoder(source, request.image_size) if request.decode else None
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
        runs = {}
        batch_bytes = float(probe["stats"]["batch_bytes"])
        for workers, depth in tune_probe.checks(tuner, final, request, batch_bytes):
            fixed = DataLoader(source, **common, num_workers=workers, prefetch=depth)
            runs[(workers, depth)] = tune_probe.run(fixed, request.verify_batches, request.step_ms)
            record_measured(
                None, fixed, kind="tune", workers=workers, depth=depth,
                utilization=runs[(workers, depth)]["utilization_in_epoch"],
                batches=runs[(workers, depth)]["batches"], step_ms=request.step_ms,
                target=request.target,
            )  # fmt: skip
        bar.update(1)
    keys = list(runs)
    predicted, lower = tuner.forecaster.predict(keys, drivers["estimate"], drivers["cpu_count"])
    measured = pd.DataFrame(
        {
            "workers": [w for w, _ in keys],
            "depth": [d for _, d in keys],
            "predicted_utilization": predicted,
            "lower_bound": lower,
            "measured_utilization": [runs[k]["utilization"] for k in keys],
            "memory_bytes": [runs[k]["memory_bytes"] for k in keys],
            "samples_per_s": [runs[k]["samples_per_s"] for k in keys],
        }
    )
    ok = measured[measured["measured_utilization"] >= request.target]
    if len(ok):
        pick = ok.sort_values(["memory_bytes", "workers"]).iloc[0]
    else:
        pick = measured.sort_values(
            ["measured_utilization", "memory_bytes"], ascending=[False, True]
        ).iloc[0]
    recommendation = {
        "workers": int(pick["workers"]),
        "depth": int(pick["depth"]),
        "meets_target": bool(len(ok)),
        "measured_utilization": float(pick["measured_utilization"]),
        "measured_memory_bytes": float(pick["memory_bytes"]),
        "why_missed": None if len(ok) else tune_probe.why_missed(drivers, request, last),
        "probe_batches": probe["batches"],
        "probe_epochs": probe["epochs"],
        "verify_batches": request.verify_batches,
        "tuner_reason": last.reason if last is not None else None,
    }
    paths = write_report(
        request.out,
        recommendation,
        measured,
        drivers,
        step_ms=request.step_ms,
        target=request.target,
    )
    verdict = "meets" if recommendation["meets_target"] else "MISSED; best measured"
    click.echo(
        f"{recommendation['workers']} worker(s), depth {recommendation['depth']}: measured "
        f"{recommendation['measured_utilization']:.2f} against {request.target:.2f} ({verdict})"
    )
    return paths


def _model_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a model path the writer would refuse, before any training."""
    if value is not None and Path(value).suffix != ".npz":
        raise click.BadParameter(
            f"a model file must end in .npz (arrays only: the tuner never loads a pickle). "
            f"Found: {Path(value).name!r}. Rename it, e.g. {Path(value).stem}.npz.",
            ctx=ctx,
            param=param,
        )
    return value


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
    default=64,
    show_default=True,
    help="Samples per batch.",
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
    default=224,
    show_default=True,
    help="Side in pixels images are cropped and resized to when decoded.",
)
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
@storage_options_option
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="tune-report",
    show_default=True,
    help="Where report.md, report.html and plots go.",
)
@click.option(
    "--evaluate",
    "evaluate",
    is_flag=True,
    help="Score the model on workloads it never saw (grouped cross-validation).",
)
@click.option(
    "--retrain",
    "retrain",
    is_flag=True,
    help="Train the default model from observation files (DATA and more).",
)
@click.option(
    "--model-out",
    type=click.Path(dir_okay=False),
    default=None,
    callback=_model_path,
    help="With --retrain: where to write the model (.npz); default: the user data directory.",
)
@click.argument("more", nargs=-1)
def tune(**kw: Any) -> None:
    """Recommend workers and prefetch depth for DATA (a Parquet or image-folder URL) so
    the training step stays busy at --target, with the least memory; write a report."""
    files = tuple(p for p in (kw["data"], *kw["more"]) if p)
    if kw["evaluate"] or kw["retrain"]:
        return _model_command(kw["retrain"], kw["model_out"], files)
    if not kw["data"]:
        raise click.UsageError("Give DATA (a dataset URL), or --evaluate / --retrain.")
    from iolib.bench.command import writable_directory

    writable_directory(kw["out"], "--out")  # before the probe, not after its whole run
    request = TuneRequest(
        data=kw["data"], out=kw["out"], storage_options=kw["storage_options"],
        column=kw["column"], decode=not kw["no_decode"], image_size=kw["image_size"],
        batch_size=kw["batch_size"], shuffle=kw["shuffle"], max_workers=kw["max_workers"],
        target=kw["target"], memory_budget=kw["memory_budget"], batches=kw["batches"],
        verify_batches=kw["verify_batches"], step_ms=kw["step_ms"],
    )  # fmt: skip
    paths = _recommend(request)
    click.echo(f"Report: {paths['markdown']} (and {paths['html'].name}, plots beside it)")
    return None


def _model_command(retrain: bool, model_out: str | None, files: tuple[str, ...]) -> None:
    from predictors.model import read_observations

    training = lab_training()
    paths = _observation_files(files)
    try:
        if retrain:
            from predictors.model import MODEL_ENV, user_model_path

            out = Path(model_out) if model_out else user_model_path()
            model = training.train_default(paths, out=out)
            click.echo(
                f"Trained on {len(paths)} file(s); wrote {out}. Use it: export {MODEL_ENV}={out}"
            )
            click.echo(json.dumps(getattr(model, "metrics", {}), indent=2, default=str))
            return
        result = training.evaluate(read_observations(paths))
    except ValueError as exc:  # predictors' schema and version errors
        raise ConfigError(str(exc)) from exc
    click.echo("Grouped cross-validation (each score on workload/storage groups never seen):")
    click.echo(result.summary.to_string(float_format=lambda x: f"{x:.3f}"))
