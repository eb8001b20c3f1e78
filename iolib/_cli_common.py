"""Small helpers shared by the `convert` and `inspect` commands."""

from __future__ import annotations

import json
from typing import Any

import click


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


STORAGE_OPTION = click.option(
    "--storage-option",
    "-o",
    "storage_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="An fsspec storage option (repeatable), e.g. -o anon=true. Values are JSON or text.",
)
