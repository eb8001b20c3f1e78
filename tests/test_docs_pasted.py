"""The first examples of the README and the guides run as a user pastes them: in a fresh
process, in an empty directory, with no AWS credentials in the environment and nothing
from the doc tests' workspace. Only what the rendered page shows runs (blocks hidden in
HTML comments do not), in order; a `bash` block's `iolib ...` lines run the CLI."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.markdown_docs import commands

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)

# (guide, the heading the example follows, how many code blocks it takes)
FIRST_EXAMPLES = [
    ("README.md", "## Use it", 3),
    ("docs/images.md", "# Images", 2),
    ("docs/tokens.md", "## Padded (and jagged) rows", 1),
    ("docs/quickstart.md", "## Make a small dataset", None),  # the whole walk-through
]


def rendered_blocks(text: str, heading: str, count: int | None) -> list[tuple[str, str]]:
    """(language, code) of the first `count` code blocks after `heading`, as rendered."""
    text = "\n" + re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    start = text.index(f"\n{heading}") + 1
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(text, start)]
    return blocks if count is None else blocks[:count]


def as_script(blocks: list[tuple[str, str]]) -> str:
    """One Python script: Python blocks as they are, each iolib command as a CLI call."""
    parts = ["from iolib.cli import main as _iolib\n"]
    for language, code in blocks:
        if language == "python":
            parts.append(code)
        elif language == "bash":
            for argv in commands(code):
                assert argv[0] == "iolib", f"not an iolib command: {shlex.join(argv)}"
                parts.append(
                    f"try:\n    _iolib({argv[1:]!r})\nexcept SystemExit as e:\n"
                    f"    assert e.code in (0, None), {shlex.join(argv)!r}\n"
                )
    return "\n".join(parts)


@pytest.mark.parametrize(("guide", "heading", "count"), FIRST_EXAMPLES,
                         ids=[g for g, _, _ in FIRST_EXAMPLES])  # fmt: skip
def test_first_example_runs_as_pasted(tmp_path: Path, guide: str, heading: str, count) -> None:
    blocks = rendered_blocks((ROOT / guide).read_text(), heading, count)
    assert blocks, f"{guide}: no code block after {heading!r}"
    script = tmp_path / "pasted.py"
    script.write_text(as_script(blocks))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
    env["PYTHONPATH"] = str(ROOT)
    work = tmp_path / "empty"
    work.mkdir()
    done = subprocess.run([sys.executable, str(script)], cwd=work, env=env, timeout=600,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, f"{guide}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
