"""What `prefetch="auto"` ships: the runtime package plans without the lab or scikit-learn."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_tuner_plans_without_scikit_learn_or_the_lab() -> None:
    code = (
        "import sys\n"
        "from predictors.tuner import LearnedTuner\n"
        "from predictors.model import load_default\n"
        "from predictors.report import write_report\n"
        "tuner = LearnedTuner(None, target_utilization=0.9, memory_budget_bytes=2**30)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'benchmarks'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_predictors_never_imports_the_lab() -> None:
    found = []
    for path in sorted((ROOT / "predictors").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "benchmarks"]
    assert not found
