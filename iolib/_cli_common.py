"""Small helpers shared by every `iolib` command: one way to pass storage options."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click

STORAGE_OPTIONS_HELP = (
    "An fsspec storage option for the data's URL, repeatable: -o key=... -o secret=... "
    "-o endpoint_url=http://host:9000. Values are read as JSON where they parse "
    "(anon=true gives True), else kept as text. Default: none (the backend's own "
    "credentials lookup)."
)


def parse_storage_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("anon=true", "endpoint_url=http://...")`` -> fsspec storage options.

    Values are read as JSON where they parse (``true``, ``3``, ``{"a": 1}``), else kept as
    strings, so ``anon=true`` gives ``True`` and ``key=abc`` gives ``"abc"``.
    """
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"expected KEY=VALUE (e.g. anon=true). Found: {pair!r}.",
                param_hint="'--storage-option'",
            )
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def parse_storage_options_json(text: str | None) -> dict[str, Any]:
    """``--storage-options '{"anon": true}'`` -> a dict (the older, JSON form)."""
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not JSON ({exc.msg}); e.g. '{{\"anon\": true}}', or use -o anon=true.",
            param_hint="--storage-options",
        ) from None
    if not isinstance(options, dict):
        raise click.BadParameter(
            f"give a JSON object, e.g. '{{\"anon\": true}}'. Found: {text!r}.",
            param_hint="--storage-options",
        )
    return options


def storage_options_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``-o/--storage-option KEY=VALUE`` (repeatable, the documented form) and
    ``--storage-options JSON`` (hidden; kept so older scripts run) to a command, and
    hand the command one merged dict as ``storage_options`` (``-o`` wins on a clash).

    Every command takes both, so one habit works everywhere.
    """

    @functools.wraps(func)
    def wrapper(
        *args: Any,
        storage_option_pairs: tuple[str, ...] = (),
        storage_options_json: str | None = None,
        **kw: Any,
    ) -> Any:
        options = parse_storage_options_json(storage_options_json)
        options.update(parse_storage_options(storage_option_pairs))
        return func(*args, storage_options=options, **kw)

    wrapper = click.option(
        "--storage-options",
        "storage_options_json",
        default=None,
        hidden=True,
        metavar="JSON",
        help="The same options as one JSON object (older form of -o).",
    )(wrapper)
    return click.option(
        "--storage-option",
        "-o",
        "storage_option_pairs",
        multiple=True,
        metavar="KEY=VALUE",
        help=STORAGE_OPTIONS_HELP,
    )(wrapper)


# The decorator under its earlier name (convert and inspect used it).
STORAGE_OPTION = storage_options_option
