"""`iolib bench | tune | convert | inspect | index | history`.

Each subcommand lives in its own module and is imported only when it runs, so
`iolib --help` is instant and a broken optional dependency affects one command only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from typing import Any

import click

from iolib.base.redact import Redactor, is_sensitive
from iolib.cli.common import credentials_fix
from iolib.errors import IolibError

# name -> "module:attribute" of a click.Command; loaded on first use.
_COMMANDS = {
    "bench": ("iolib.cli.bench.command:bench", "Measure a loading configuration, side by side."),
    "tune": ("iolib.cli.tune:tune", "Recommend workers and prefetch depth; write a report."),
    "convert": ("iolib.cli.convert:convert", "Convert an image folder to Parquet shards."),
    "inspect": ("iolib.cli.inspect_data:inspect", "Show files, rows, row groups, schema, bytes."),
    "index": ("iolib.cli.index:index", "Write _metadata and token indexes beside the data."),
    "history": ("iolib.cli.history:history", "List, show or clear the tuner's run history."),
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


class RedactingStream:
    """A text stream that masks the command line's credentials in everything written to
    it: errors quoted by s3fs or botocore, tracebacks, progress bars, reports."""

    def __init__(self, stream: Any, redactor: Redactor) -> None:
        self._stream, self._redact = stream, redactor

    def write(self, text: str | bytes) -> int:
        # click writes bytes to a stream it does not recognise as text.
        shown = text.decode(errors="replace") if isinstance(text, bytes) else text
        # Known secrets only: masking every "key=..." would garble help texts.
        self._stream.write(self._redact(shown, assignments=False))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def argv_redactor(args: list[str]) -> Redactor:
    """The secrets a command line holds: URLs' user info, sensitive `-o KEY=VALUE`
    pairs and values under sensitive names in `--storage-options` JSON."""
    urls = [arg for arg in args if "://" in arg]
    options: list[Any] = []
    for arg in args:
        with contextlib.suppress(ValueError):
            options.append(json.loads(arg))
        key, sep, value = arg.partition("=")
        if sep and is_sensitive(key.lstrip("-")):
            options.append({key: value})
        elif sep:  # -o headers={"Authorization": "Bearer ..."}: sensitive names inside
            with contextlib.suppress(ValueError):
                options.append({key: json.loads(value)})
    return Redactor(urls, options)


def _one_line_text(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _one_line(exc: BaseException) -> str:
    text = _one_line_text(str(exc))
    if isinstance(exc, IolibError):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def main(argv: list[str] | None = None) -> None:
    """Console entry point: every error becomes one line and exit code 2 (the traceback
    with IOLIB_DEBUG=1); nothing printed carries the command line's credentials."""
    args = list(sys.argv[1:] if argv is None else argv)
    redactor = argv_redactor(args)
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (
        RedactingStream(saved[0], redactor),
        RedactingStream(saved[1], redactor),
    )
    try:
        cli.main(args=args, prog_name="iolib", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "iolib"
        click.echo(
            f"Error: {_one_line_text(exc.format_message())} (see '{where} --help')", err=True
        )
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"Error: {_one_line_text(exc.format_message())}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:
        if os.environ.get("IOLIB_DEBUG"):
            traceback.print_exc()
        hint = "" if isinstance(exc, IolibError) else " (IOLIB_DEBUG=1 shows the traceback)"
        click.echo(f"Error: {_one_line(exc)}{credentials_fix(exc)}{hint}", err=True)
        sys.exit(2)
    finally:
        sys.stdout, sys.stderr = saved
