"""CLI numbers: one validation layer for every numeric option of every command (finite, in
range, refused while the command line is parsed, before any work), and every wait of a
benchmark bounded by its own --max-seconds."""

from __future__ import annotations

import math

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolib.cli import _COMMANDS, cli
from iolib.cli.bench.loop import measure
from iolib.cli.common import ByteSize, Number, NumberList
from iolib.storage import open_filesystem
from tests.conftest import run_cli as run

# Positional arguments that let a command's options be parsed (never read: parsing fails
# first, which is the point).
_ARGS = {"convert": ["src", "dst"], "tune": ["data"], "inspect": ["x"], "bench": []}


def _commands() -> list[click.Command]:
    ctx = click.Context(cli)
    return [cli.get_command(ctx, name) for name in sorted(_COMMANDS)]


def _numeric_options() -> list[tuple[str, click.Option]]:
    return [
        (command.name, p)
        for command in _commands()
        for p in command.params
        if isinstance(p, click.Option) and isinstance(p.type, (Number, NumberList, ByteSize))
    ]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: c.name)
def test_every_numeric_option_goes_through_the_one_number_type(command) -> None:
    """No option reads a number with click's INT/FLOAT/IntRange/FloatRange (which accept nan,
    inf, or any size): each uses Number, NumberList or ByteSize."""
    loose = (click.types.IntParamType, click.types.FloatParamType)
    for param in command.params:
        assert not isinstance(param.type, loose), f"iolib {command.name} {param.opts[0]}"
        default = param.default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            assert isinstance(param.type, (Number, NumberList)), f"{param.opts[0]} is numeric"


def _accepts(number: Number, value: float) -> bool:
    """What the option's rule says about `value` (written apart from the type's code): an
    integer option takes integers written as such ('8', not '8.0' or '1e3')."""
    if number.kind is int and not isinstance(value, int):
        return False
    if not isinstance(value, int) and not math.isfinite(value):
        return False
    low_ok = number.low is None or (value > number.low if number.low_open else value >= number.low)
    high_ok = number.high is None or (
        value < number.high if number.high_open else value <= number.high
    )
    return low_ok and high_ok


_NUMBERS = [(name, p) for name, p in _numeric_options() if not isinstance(p.type, ByteSize)]


@pytest.mark.parametrize("name, option", _NUMBERS, ids=lambda x: getattr(x, "name", x))
@settings(max_examples=60, deadline=None)
@given(
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-(10**20), 10**20),
        st.sampled_from([0, 1, -1, 0.5, 1e12, 1e400, 2**63, 256, 257, 60_000, 60_001]),
    )
)
def test_each_numeric_option_takes_exactly_its_finite_range(name, option, value) -> None:
    """Any number, as typed on a command line: accepted (as the same value) exactly when
    finite and in the option's range, else a usage error naming the option, before any
    work (the command body never runs: its positional arguments do not exist)."""
    number = option.type.item if isinstance(option.type, NumberList) else option.type
    text = repr(value) if isinstance(value, float) else str(value)
    ctx = click.Context(click.Command(name))
    if _accepts(number, value):
        assert option.type.convert(text, option, ctx) in (value, (value,))
        return
    with pytest.raises(click.BadParameter):
        option.type.convert(text, option, ctx)


@pytest.mark.parametrize(
    "args, option",
    [
        (["bench", "--step-ms", "inf"], "--step-ms"),
        (["bench", "--step-ms", "40,nan"], "--step-ms"),
        (["bench", "--latency-ms", "1e12", "--max-seconds", "5"], "--latency-ms"),
        (["bench", "--max-seconds", "nan"], "--max-seconds"),
        (["bench", "--sweep", "--sweep-minutes", "nan"], "--sweep-minutes"),
        (["bench", "--jitter", "nan"], "--jitter"),
        (["bench", "--cache", "on", "--cache-max-gb", "nan"], "--cache-max-gb"),
        (["bench", "--workers", "100000"], "--workers"),
        (["bench", "--seed", "-1"], "--seed"),
        (["tune", "data", "--memory-budget", "1..5GB"], "--memory-budget"),
        (["tune", "data", "--memory-budget", "nanGB"], "--memory-budget"),
        (["tune", "data", "--target", "nan"], "--target"),
        (["tune", "data", "--step-ms", "inf"], "--step-ms"),
        (["convert", "src", "dst", "--rows-per-group", "1.5"], "--rows-per-group"),
    ],
)
def test_bad_numbers_are_one_line_usage_errors(capsys, args, option) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: Invalid value for '{option}'")
    assert "Traceback" not in err


def test_memory_budget_reaches_tune_as_bytes() -> None:
    assert ByteSize().convert("1.5GB", None, None) == 1_500_000_000
    assert ByteSize().convert("2GiB", None, None) == 2 * 2**30


def test_a_stuck_request_is_left_behind_at_max_seconds(tmp_path) -> None:
    """A loader waiting on storage that answers after 5 s: measure() returns once no batch
    came for max_seconds (0.5 s), marked timed out, instead of waiting it out. (5 s, not
    more: the request left behind still sleeps that long in this process.)"""
    (tmp_path / "blob").write_bytes(b"x" * 4096)
    fs, path = open_filesystem(
        f"throttled::file://{tmp_path}/blob", {"throttled": {"latency_ms": 5_000}}
    )

    def batches():
        yield {"x": fs.cat_file(path)}  # one real throttled request: 5 s to first byte

    m = measure(batches, batch_size=1, step_ms=0, batches=5, max_seconds=0.5)
    assert m.timed_out and not m.interrupted and m.stalls == []


def test_a_slow_storage_probe_stops_the_run_naming_the_limit(tmp_path, capsys) -> None:
    code, _, err = run(
        capsys, "bench", "--profile", "custom", "--latency-ms", "1500", "--max-seconds", "0.5",
        "--workload", "tokens", "--samples", "64", "--seq-len", "8", "--repeats", "1",
        "--no-progress", "--data-dir", str(tmp_path),
    )  # fmt: skip
    assert code == 2
    assert "Probing the custom storage" in err and "--max-seconds 0.5" in err
