"""`iolib bench | tune | convert | inspect`.

Each subcommand lives in its own module and is imported only when it runs, so
`iolib --help` is instant and a broken optional dependency affects one command only.
"""

from __future__ import annotations

import importlib
import sys

import click

from iolib.errors import IolibError

# name -> "module:attribute" of a click.Command; loaded on first use.
_COMMANDS = {
    "bench": ("iolib.bench.command:bench", "Measure a loading configuration, side by side."),
    "tune": ("iolib.tune_command:tune", "Recommend workers and prefetch depth; write a report."),
    "convert": ("iolib.convert:convert", "Convert an image folder to Parquet shards."),
    "inspect": ("iolib.inspect_data:inspect", "Show files, rows, row groups, schema, bytes."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported when invoked (click's documented pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        target, _ = _COMMANDS[cmd_name]
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="iolib")
def cli() -> None:
    """iolib: deterministic, fast data loading for PyTorch training."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: iolib's own errors become one line and exit code 2."""
    try:
        cli.main(args=argv, prog_name="iolib", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2)
    except IolibError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
