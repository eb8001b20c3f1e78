"""IOLIB_REQUIRE turns the skip of a missing optional dependency into a failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import pytest

def test_probe():
    pytest.importorskip("iolib_no_such_module.dali")
"""


def _run(tmp_path: Path, required: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\nfrom tests.conftest import *  # noqa\n"
    )
    env = {"IOLIB_REQUIRE": required, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip


def test_a_required_dependency_that_does_not_import_fails(tmp_path) -> None:
    result = _run(tmp_path, "moto,dali")
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout and "is required here" in result.stdout


def test_an_unlisted_dependency_still_skips(tmp_path) -> None:
    result = _run(tmp_path, "moto")
    assert result.returncode == 0 and "1 skipped" in result.stdout, result.stdout
