"""Small helpers shared by every `iolib` command: one way to pass storage options, one
way to read numbers (finite, in range, checked before any work)."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable
from typing import Any

import click

STORAGE_OPTIONS_HELP = (
    "An fsspec storage option for the data's URL, repeatable: -o key=... -o secret=... "
    "-o endpoint_url=http://host:9000. Values are read as JSON where they parse "
    "(anon=true gives True), else kept as text. Default: none (the backend's own "
    "credentials lookup)."
)


CREDENTIALS_FIX = (
    " Fix: pass credentials with -o key=... -o secret=... (and -o endpoint_url=... for an "
    "S3-compatible store), or configure the backend's own lookup (~/.aws, AWS_* "
    "environment variables)."
)


def credentials_fix(exc: BaseException) -> str:
    """The "Fix:" sentence for a missing-credentials error a command met unwrapped (the
    Python API's retry layer adds its own), else ""."""
    from iolib.storage.retries import CREDENTIAL_ERRORS

    seen: BaseException | None = exc
    for _ in range(8):  # the exception and its causes
        if seen is None:
            return ""
        if type(seen).__name__ in CREDENTIAL_ERRORS:
            if "Fix:" in str(exc):
                return ""
            return ("" if str(exc).rstrip().endswith(".") else ".") + CREDENTIALS_FIX
        seen = seen.__cause__ or seen.__context__
    return ""


def as_given(path: str, given: str) -> str:
    """A local `path` shown as the user gave its root: relative to the working directory
    where `given` was relative ('shards/part-00000.parquet', not '/home/.../shards/...');
    URLs and absolute input unchanged."""
    import os

    if "://" in given or "://" in path or os.path.isabs(given) or not os.path.isabs(path):
        return path
    return os.path.relpath(path)


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


# -- numbers ---------------------------------------------------------------------------------
# Every numeric option of every command goes through `Number` or `NumberList`: NaN,
# infinity and values outside the option's range are refused while the command line is
# parsed, before any data is made or read (tests/test_cli_numbers.py checks every option).


class Number(click.ParamType):
    """A finite int or float in [low, high] (`low_open`, `high_open`: that end excluded).

    Example: ``type=Number(float, 0, 60_000, unit="ms")`` refuses ``nan``, ``inf``,
    ``-1`` and ``1e12`` with the option's name, the rule and the value found.
    """

    def __init__(
        self,
        kind: type = float,
        low: float | None = None,
        high: float | None = None,
        *,
        low_open: bool = False,
        high_open: bool = False,
        unit: str = "",
    ) -> None:
        self.kind, self.low, self.high, self.unit = kind, low, high, unit
        self.low_open, self.high_open = low_open, high_open
        self.name = "integer" if kind is int else "number"

    def rule(self) -> str:
        """The accepted range in words, e.g. 'a number > 0 and <= 60000 (ms)'."""
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self._show(self.low)}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self._show(self.high)}")
        unit = f" ({self.unit})" if self.unit else ""
        kind = "an integer" if self.kind is int else "a finite number"
        return f"{kind} {' and '.join(parts)}{unit}".rstrip()

    def _show(self, bound: float) -> str:
        return str(int(bound)) if self.kind is int else f"{bound:g}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, bool):
            self.fail(f"{value!r} is not {self.rule()}.", param, ctx)
        try:
            number = self.kind(value) if self.kind is float else _integer(value)
        except (TypeError, ValueError, OverflowError):
            self.fail(f"{value!r} is not {self.rule()}.", param, ctx)
        if self.kind is float and not math.isfinite(number):
            self.fail(f"{value!r} is not {self.rule()}.", param, ctx)
        below = self.low is not None and (
            number <= self.low if self.low_open else number < self.low
        )
        above = self.high is not None and (
            number >= self.high if self.high_open else number > self.high
        )
        if below or above:
            self.fail(f"must be {self.rule()}. Found: {value!r}.", param, ctx)
        return number

    def __repr__(self) -> str:
        return f"Number({self.rule()})"


def _integer(value: Any) -> int:
    """An int from an int or its decimal text ('8', ' 8 '); '8.5', '1e3' and 'nan' are not."""
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if not text.lstrip("+-").isdigit():
        raise ValueError(text)
    return int(text)


class NumberList(click.ParamType):
    """A comma-separated list of `Number`s (a grid of values to compare: ``1,2,4``)."""

    def __init__(self, item: Number) -> None:
        self.item = item
        self.name = f"{item.name}[,{item.name}]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        if not items:
            self.fail("give at least one value, e.g. 1,2,4.", param, ctx)
        out = []
        for item in items:
            try:
                out.append(self.item.convert(item, param, ctx))
            except click.BadParameter as exc:
                self.fail(f"{exc.message} (in the comma-separated list {value!r})", param, ctx)
        return tuple(out)


class ByteSize(click.ParamType):
    """A size in bytes: '2GiB', '512MB', '1.5 GB' or a plain positive number of bytes."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from iolib.base.resources import parse_bytes

        text = str(value).strip()
        try:
            number = float(re.sub(r"[a-zA-Z\s]+$", "", text))
            size = parse_bytes(text) if math.isfinite(number) else None
        except (ValueError, OverflowError):
            size = None
        if not size:
            self.fail(
                f"must be a positive size like 2GiB, 512MB or 1.5GB. Found: {value!r}.", param, ctx
            )
        return size


# One image decode for `iolib bench --data` and `iolib tune`: the decoder a user's
# loader runs (ImagePipeline, train crops), at the same size and batch by default, so
# the two commands measure the same work.
IMAGE_SIZE = 224
IMAGE_BATCH = 64
DECODERS = ("auto", "dali", "pil")


def decoder_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--decoder auto|dali|pil`` (ImagePipeline's backend; auto: DALI where it
    imports, else Pillow)."""
    return click.option(
        "--decoder",
        type=click.Choice(DECODERS),
        default="auto",
        show_default=True,
        help="Image decoder (ImagePipeline's backend); auto: DALI where installed, else Pillow.",
    )(func)


def image_pipeline(size: int, decoder: str) -> Any:
    """The image decode both commands measure."""
    from iolib.decode.images import ImagePipeline

    return ImagePipeline(size=size, train=True, backend=decoder)


def require_report_extra(command: str) -> None:
    """Refuse up front, with the fix, when the `report` extra (pandas, matplotlib) that
    `command`'s tables and plots need is not installed (the loader needs neither)."""
    import importlib.util

    from iolib.errors import ConfigError

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except ImportError:  # a broken install is as good as none
            return True

    missing = [m for m in ("pandas", "matplotlib") if absent(m)]
    if missing:
        raise ConfigError(
            f"`{command}` writes tables and plots with {' and '.join(missing)}, which "
            "are not installed. Fix: pip install 'iolib[report]'."
        )
