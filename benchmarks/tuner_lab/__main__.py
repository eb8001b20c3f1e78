"""The lab's commands: score the cross-workload model, or retrain it.

    python -m benchmarks.tuner_lab evaluate [OBSERVATIONS...]
    python -m benchmarks.tuner_lab retrain OBSERVATIONS... [--model-out PATH.npz]

Run from a source checkout installed with `pip install -e '.[lab]'` (scikit-learn).
OBSERVATIONS are files written by `iolib bench --out DIR` (DIR/observations.parquet);
without any, `evaluate` scores the real sweeps in benchmarks/tuner_lab/data/. The
runtime (`prefetch="auto"`) never loads this model: it plans with the queueing prior.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

DEFAULT_OBSERVATIONS = Path(__file__).parent / "data"


def _observation_files(paths: tuple[str, ...]) -> list[Path]:
    found = [Path(p) for p in paths] or sorted(DEFAULT_OBSERVATIONS.glob("sweep*/*.parquet"))
    missing = [str(p) for p in found if not p.exists()]
    if missing or not found:
        raise click.UsageError(
            f"Observation file(s) {missing or 'none'} not found. Pass files written by "
            "`iolib bench --out DIR` (DIR/observations.parquet)."
        )
    return found


def _model_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a model path the writer would refuse, before any training."""
    if value is not None and Path(value).suffix != ".npz":
        raise click.BadParameter(
            f"a model file must end in .npz (arrays only: loading never runs a pickle). "
            f"Found: {Path(value).name!r}. Rename it, e.g. {Path(value).stem}.npz.",
            ctx=ctx,
            param=param,
        )
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """The tuner's lab: the cross-workload model's training and evaluation."""


@main.command()
@click.argument("observations", nargs=-1)
def evaluate(observations: tuple[str, ...]) -> None:
    """Score the model on workloads it never saw (grouped cross-validation)."""
    from benchmarks.tuner_lab.model import read_observations
    from benchmarks.tuner_lab.training import evaluate as score

    try:
        result = score(read_observations(_observation_files(observations)))
    except ValueError as exc:  # predictors' schema and version errors
        raise click.ClickException(str(exc)) from exc
    click.echo("Grouped cross-validation (each score on workload/storage groups never seen):")
    click.echo(result.summary.to_string(float_format=lambda x: f"{x:.3f}"))


@main.command()
@click.argument("observations", nargs=-1, required=True)
@click.option(
    "--model-out",
    type=click.Path(dir_okay=False),
    default=None,
    callback=_model_path,
    help="Where to write the model (.npz); default: the user data directory.",
)
def retrain(observations: tuple[str, ...], model_out: str | None) -> None:
    """Train the model from observation files."""
    from benchmarks.tuner_lab.model import MODEL_ENV, user_model_path
    from benchmarks.tuner_lab.training import train_default

    paths = _observation_files(observations)
    out = Path(model_out) if model_out else user_model_path()
    try:
        model = train_default(paths, out=out)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Trained on {len(paths)} file(s); wrote {out} (the lab reads ${MODEL_ENV}).")
    click.echo(json.dumps(getattr(model, "metrics", {}), indent=2, default=str))


if __name__ == "__main__":
    sys.exit(main())
