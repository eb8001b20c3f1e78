"""`iolib bench > log 2>&1`: the progress bar stays off when stderr is not a terminal,
so no carriage return puts it on the table's line in the log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_logged_with_stderr_has_no_progress_bar_on_the_table(tmp_path: Path) -> None:
    args = ["--repeats", "1", "--step-ms", "0", "--samples", "64", "--rows-per-group", "16",
            "--batch-size", "8", "--batches", "3", "--workers", "1", "--depth", "2",
            "--profile", "memory", "--workload", "tokens", "--seq-len", "64"]  # fmt: skip
    log = tmp_path / "bench.log"
    with log.open("wb") as handle:
        done = subprocess.run([sys.executable, "-m", "iolib.cli", "bench", *args], cwd=tmp_path,
                              stdout=handle, stderr=subprocess.STDOUT, timeout=300)  # fmt: skip
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text and "iolib bench:" not in text, text
    assert any(line.startswith("workload") or "iolib" in line for line in text.splitlines())
