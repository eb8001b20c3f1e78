"""`iolib history`: the runs the tuner remembers, per workload (list, show, clear).

iolib history list
iolib history show 6364e7add2f9ad12
iolib history --at s3://bucket/iolib-history -o profile=ml clear
"""

from __future__ import annotations

import time
from typing import Any

import click

from iolib.cli.common import storage_options_option
from iolib.errors import ConfigError


def _open(ctx: click.Context) -> Any:
    from predictors.history import RunHistory

    at, options = ctx.obj["at"], ctx.obj["storage_options"]
    try:
        return RunHistory(at, storage_options=options)
    except Exception as exc:
        raise ConfigError(f"Cannot open the run history at {_shown(at)}: {exc}") from exc


def _shown(at: str | None) -> str:
    from iolib.tuning.run_history import where
    from predictors.history import default_location

    return where(at or default_location())


def _when(started: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(started))


def _mib(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--at",
    default=None,
    metavar="URL",
    help="The history's path or fsspec URL. Default: $IOLIB_HISTORY, else "
    "~/.cache/iolib/history (under $IOLIB_CACHE_DIR when set).",
)
@storage_options_option
@click.pass_context
def history(ctx: click.Context, at: str | None, storage_options: dict[str, Any]) -> None:
    """The runs prefetch="auto", `iolib tune` and `iolib bench` recorded, per workload
    (dataset, batch size, decode, step time and host). A run of a workload with history
    starts where earlier runs met the target with the least memory."""
    ctx.obj = {"at": at, "storage_options": storage_options}


@history.command("list")
@click.pass_context
def list_workloads(ctx: click.Context) -> None:
    """Every workload with its run count and last run."""
    store = _open(ctx)
    rows = []
    for workload in store.workloads():
        records = store.runs(workload)
        if not records:
            continue
        last = max(records, key=lambda r: r.started)
        rows.append((workload, len({r.run_id for r in records}), last))
    if not rows:
        click.echo(f"No runs recorded at {_shown(ctx.obj['at'])}.")
        return
    click.echo(f"Runs recorded at {_shown(ctx.obj['at'])}:")
    click.echo(f"{'workload':<17} {'runs':>4}  {'last run':<16}  {'settled on':<18}  what")
    for workload, runs, last in sorted(rows, key=lambda row: -row[2].started):
        settled = f"{last.workers} w, depth {last.depth}"
        click.echo(
            f"{workload:<17} {runs:>4}  {_when(last.started):<16}  {settled:<18}  {last.label}"
        )


@history.command("show")
@click.argument("workload")
@click.pass_context
def show(ctx: click.Context, workload: str) -> None:
    """One workload's runs: each configuration measured, met or not, memory held."""
    store = _open(ctx)
    try:
        records = store.runs(workload)
    except ValueError as exc:
        raise ConfigError(f"{exc}. `iolib history list` shows the workloads.") from exc
    if not records:
        raise ConfigError(
            f"No runs of workload {workload} at {_shown(ctx.obj['at'])}. "
            "`iolib history list` shows the workloads."
        )
    click.echo(f"{workload}: {records[-1].label}")
    header = (
        f"{'started':<16} {'run':<8} {'rank':>4} {'source':<6} {'workers':>7} {'depth':>5} "
        f"{'batches':>7} {'util':>5} {'±se':>5} {'target':>6} {'met':<3} {'memory':>10} "
        f"{'step ms':>7} {'storage':>7} {'decode':>7} {'cpu':>7}"
    )
    click.echo(header)
    for r in records:
        click.echo(
            f"{_when(r.started):<16} {r.run_id[-8:]:<8} {r.rank:>4} {r.source:<6} "
            f"{r.workers:>7} {r.depth:>5}{'*' if r.settled else ' '}"
            f"{r.batches:>6} {r.utilization:>5.2f} {r.utilization_se:>5.2f} {r.target:>6.2f} "
            f"{'yes' if r.met else 'no':<3} {_mib(r.memory_bytes):>10} {r.step_ms:>7.1f} "
            f"{r.storage_ms:>7.1f} {r.decode_ms:>7.1f} {r.cpu_ms:>7.1f}"
        )
    click.echo("* the configuration the run settled on; storage, decode, cpu: ms per batch.")


@history.command("clear")
@click.argument("workload", required=False)
@click.option("--yes", is_flag=True, help="Do not ask before removing.")
@click.pass_context
def clear(ctx: click.Context, workload: str | None, yes: bool) -> None:
    """Remove WORKLOAD's runs, or every workload's when none is given."""
    store = _open(ctx)
    what = f"the runs of {workload}" if workload else "every recorded run"
    if not yes:
        click.confirm(f"Remove {what} at {_shown(ctx.obj['at'])}?", abort=True)
    try:
        removed = store.clear(workload)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    click.echo(f"Removed {removed} file(s): {what}.")
