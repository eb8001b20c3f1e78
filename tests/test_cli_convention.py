"""One CLI convention: every command takes storage options the same two ways, every
option says what it does, and `bench --data` reads any folder `convert` wrote."""

from __future__ import annotations

import io
import json
from pathlib import Path

import click
import numpy as np
import pytest
from PIL import Image

from iolib.cli import _COMMANDS, cli
from tests.conftest import run_cli as run


def _commands() -> list[click.Command]:
    ctx = click.Context(cli)
    return [cli.get_command(ctx, name) for name in sorted(_COMMANDS)]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: c.name)
def test_every_option_has_help_and_storage_options_both_ways(command: click.Command) -> None:
    options = [p for p in command.params if isinstance(p, click.Option)]
    flags = {flag for p in options for flag in p.opts}
    assert {"-o", "--storage-option", "--storage-options"} <= flags, command.name
    missing = [p.opts[0] for p in options if not p.hidden and not (p.help or "").strip()]
    assert not missing, f"iolib {command.name}: options without help: {missing}"
    help_text = command.get_help(click.Context(command, info_name=command.name))
    assert "--storage-options" not in help_text, "one documented form: -o KEY=VALUE"


def _mixed_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for c, sizes in enumerate([[(40, 30), (64, 64)], [(30, 50), (45, 45), (90, 20)]]):
        (root / f"c{c}").mkdir(parents=True)
        for i, (w, h) in enumerate(sizes * 20):
            buffer = io.BytesIO()
            fmt = "PNG" if i == 1 else "JPEG"
            Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buffer, fmt)
            (root / f"c{c}" / f"{i:03d}.{fmt.lower()}").write_bytes(buffer.getvalue())
    return root


def test_bench_reads_a_converted_folder_of_mixed_sizes(tmp_path: Path, capsys) -> None:
    folder = _mixed_folder(tmp_path / "images")
    code, _, err = run(capsys, "convert", str(folder), str(tmp_path / "shards"),
                       "--rows-per-group", "16")  # fmt: skip
    assert code == 0, err
    code, out, err = run(
        capsys, "bench", "--data", str(tmp_path / "shards"), "-w", "images", "-p", "local",
        "--image-size", "32", "--workers", "1", "--depth", "2", "--batch-size", "8",
        "--batches", "3", "--repeats", "1", "--no-progress", "--step-ms", "1",
    )  # fmt: skip
    assert code == 0, err
    assert "iolib" in out and "torch" in out


def test_both_storage_option_forms_reach_the_command(tmp_path: Path, capsys, monkeypatch) -> None:
    import iolib.cli.inspect_data

    seen = []
    monkeypatch.setattr(iolib.cli.inspect_data, "image_summary", lambda url, options: seen.append(
        options) or {})  # fmt: skip
    monkeypatch.setattr(iolib.cli.inspect_data, "format_text", lambda summary: "")
    as_json = json.dumps({"anon": True, "endpoint_url": "http://h:9"})
    forms = (["-o", "anon=true", "-o", "endpoint_url=http://h:9"], ["--storage-options", as_json])
    for form in forms:
        code, _, err = run(capsys, "inspect", str(tmp_path), "--format", "images", *form)
        assert code == 0, err
    assert seen == [{"anon": True, "endpoint_url": "http://h:9"}] * 2
    code, _, err = run(capsys, "inspect", str(tmp_path), "--storage-options", "[1]")
    assert code == 2 and "JSON object" in err, err
