"""`iolib tune`: recommend workers and prefetch depth for a dataset and a step time.

It runs the learned tuner on the real data for a short while (that is the probe: the
tuner measures storage, decode and step times through telemetry and asks the model),
then verifies the recommendation, and a few other candidates, with short fixed runs,
and writes a report a person can read (predictors.report).

    iolib tune s3://bucket/train/ --step-ms 50 --target 0.9 --out tune-report
    iolib tune --evaluate predictors/data/sweep/observations.parquet
    iolib tune --retrain my-observations.parquet
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import click

from iolib.errors import ConfigError

DEFAULT_OBSERVATIONS = Path(__file__).parent.parent / "predictors" / "data" / "sweep"


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


def _run(loader: Any, batches: int, step_ms: float) -> dict[str, Any]:
    """Consume `batches` batches with a simulated step; return the loader's stats."""
    start = time.perf_counter()
    for k, _ in enumerate(loader):
        time.sleep(step_ms / 1e3)
        if k + 1 >= batches:
            break
    wall_s = time.perf_counter() - start
    loader.close()  # first: the tuner's last decisions land in stats()
    return {**loader.stats(), "wall_s": wall_s}


def _recommend(kw: dict[str, Any]) -> dict[str, Path]:
    from iolib.loader import DataLoader
    from predictors.report import write_report

    options = json.loads(kw["storage_options"] or "{}")
    source = _source(kw["data"], options, kw["column"])
    decode = None if kw["no_decode"] else _decoder(source, kw["image_size"])
    common = dict(batch_size=kw["batch_size"], shuffle=kw["shuffle"], decode=decode)

    def measure(batches: int, **extra: Any) -> dict[str, Any]:
        return _run(DataLoader(source, **common, **extra), batches, kw["step_ms"])

    with click.progressbar(length=4, label="tuning", file=click.get_text_stream("stderr")) as bar:
        probe = DataLoader(
            source,
            **common,
            prefetch="auto",
            num_workers=kw["max_workers"],
            target_utilization=kw["target"],
            memory_budget=kw["memory_budget"],
        )
        probe_stats = _run(probe, kw["batches"], kw["step_ms"])
        tuner = probe._autotune.tuner
        bar.update(1)
        last = probe._autotune.last
        candidates = tuner.candidate_table()
        w, d = last.workers, last.depth
        checks = {(w, d), (2, 4), (max(1, w // 2), d), (w, max(1, d // 2)), (w + 2, d)}
        measured = {}
        for workers, depth in sorted(checks):
            stats = measure(kw["verify_batches"], num_workers=workers, prefetch=depth)
            measured[(workers, depth)] = stats
        bar.update(3)
    util = {k: v["utilization"] for k, v in measured.items()}
    candidates["measured_utilization"] = [
        util.get((int(a), int(b)))
        for a, b in zip(candidates.workers, candidates.depth, strict=True)
    ]
    extra = candidates.dropna(subset=["measured_utilization"])
    mine = measured[(w, d)]
    recommendation = {
        "workers": w,
        "depth": d,
        "reason": last.reason,
        "feasible": last.feasible,
        "bottleneck": last.bottleneck,
        "predicted_utilization": last.predicted.get("utilization"),
        "predicted_throughput_sps": last.predicted.get("throughput_sps"),
        "predicted_memory_bytes": last.predicted.get("memory_bytes"),
        "measured_utilization": mine["utilization"],
        "measured_throughput_sps": mine["samples_per_s"],
        "measured_memory_bytes": mine["peak_bytes_in_flight"],
        "probe_batches": probe_stats["batches"],
        "verified_candidates": len(extra),
    }
    importances = _importances(tuner.model)
    return write_report(
        kw["out"],
        recommendation,
        candidates,
        importances,
        step_ms=kw["step_ms"],
        target=kw["target"],
    )


def _importances(model: Any) -> Any:
    """Permutation importances on the shipped observations (None for the queueing model)."""
    if not hasattr(model, "feature_importances"):
        return None
    from predictors.model import read_observations

    try:
        return model.feature_importances(read_observations(_observation_files(())))
    except (ConfigError, ValueError) as exc:
        logging.getLogger(__name__).warning("no feature importances: %s", exc)
        return None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("data", required=False)
@click.option(
    "--step-ms",
    type=click.FloatRange(0, min_open=True),
    default=50.0,
    show_default=True,
    help="Your training step per batch (GPU time), in ms.",
)
@click.option(
    "--target",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.9,
    show_default=True,
    help="Utilization to reach: step/(step+stall).",
)
@click.option("--memory-budget", default=None, help="Most memory for batches, e.g. 2GiB.")
@click.option("--batch-size", type=click.IntRange(1), default=64, show_default=True)
@click.option(
    "--shuffle", type=click.Choice(["none", "block", "global"]), default="block", show_default=True
)
@click.option("--max-workers", type=click.IntRange(1), default=8, show_default=True)
@click.option("--column", default=None, help="Read only this Parquet column.")
@click.option("--no-decode", is_flag=True, help="Do not decode an image column.")
@click.option("--image-size", type=click.IntRange(1), default=224, show_default=True)
@click.option(
    "--batches",
    type=click.IntRange(10),
    default=80,
    show_default=True,
    help="Batches the tuner measures and decides over.",
)
@click.option(
    "--verify-batches",
    type=click.IntRange(5),
    default=40,
    show_default=True,
    help="Batches per verification run.",
)
@click.option("--storage-options", default=None, help="JSON fsspec options for DATA.")
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
    help="With --retrain: where to write the model (.npz); default: the user data directory.",
)
@click.argument("more", nargs=-1)
def tune(**kw: Any) -> None:
    """Recommend workers and prefetch depth for DATA (a Parquet or image-folder URL) so
    the training step stays busy at --target, with the least memory; write a report."""
    files = tuple(p for p in (kw["data"], *kw["more"]) if p)
    if kw["evaluate"] or kw["retrain"]:
        return _model_command(kw, files)
    if not kw["data"]:
        raise click.UsageError("Give DATA (a dataset URL), or --evaluate / --retrain.")
    paths = _recommend(kw)
    click.echo(f"Report: {paths['markdown']} (and {paths['html'].name}, plots beside it)")
    return None


def _model_command(kw: dict[str, Any], files: tuple[str, ...]) -> None:
    from predictors.model import evaluate, read_observations, train_default

    paths = _observation_files(files)
    try:
        if kw["retrain"]:
            from predictors.model import MODEL_ENV, user_model_path

            out = Path(kw["model_out"]) if kw["model_out"] else user_model_path()
            model = train_default(paths, out=out)
            click.echo(
                f"Trained on {len(paths)} file(s); wrote {out}. Use it: export {MODEL_ENV}={out}"
            )
            click.echo(json.dumps(getattr(model, "metrics", {}), indent=2, default=str))
            return
        result = evaluate(read_observations(paths))
    except ValueError as exc:  # predictors' schema and version errors
        raise ConfigError(str(exc)) from exc
    click.echo("Grouped cross-validation (each score on workload/storage groups never seen):")
    click.echo(result.summary.to_string(float_format=lambda x: f"{x:.3f}"))
