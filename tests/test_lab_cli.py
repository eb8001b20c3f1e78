"""The lab's commands (`python -m benchmarks.tuner_lab`), apart from `iolib tune`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.tuner_lab.__main__ import main

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parent.parent
OBSERVATIONS = ROOT / "benchmarks/tuner_lab/data/sweep/observations.parquet"


def test_retrain_refuses_a_model_name_before_training(tmp_path) -> None:
    """A .joblib model path is refused while parsing: no training, no file written."""
    out = tmp_path / "m.joblib"
    result = CliRunner().invoke(main, ["retrain", str(OBSERVATIONS), "--model-out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--model-out'" in result.output and "m.npz" in result.output
    assert not list(tmp_path.iterdir())


def test_the_lab_runs_as_a_module_and_iolib_tune_no_longer_trains() -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "benchmarks.tuner_lab", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=240,
    ).stdout
    assert "evaluate" in help_text and "retrain" in help_text
    from iolib.cli import cli as iolib_cli

    result = CliRunner().invoke(iolib_cli, ["tune", "--retrain", str(OBSERVATIONS)])
    assert result.exit_code == 2 and "No such option" in result.output
