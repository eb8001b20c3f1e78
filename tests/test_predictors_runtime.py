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
        "from predictors.report import write_report\n"
        "tuner = LearnedTuner(None, target_utilization=0.9, memory_budget_bytes=2**30)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'benchmarks'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=240,
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


def test_a_tuned_loader_runs_without_pandas_or_matplotlib(tmp_path) -> None:
    """`import iolib; DataLoader(..., prefetch="auto")` over a small Parquet file, read to
    the end, with pandas and matplotlib not installed (imports of them fail, as on an
    install without the `report` extra): it runs, and no module of iolib or predictors
    tried to import them (pyarrow's own optional probe for pandas is allowed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"x": list(range(512))}), path, row_group_size=64)
    code = (
        "import sys, traceback\n"
        "tried = []\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pandas', 'matplotlib'):\n"
        "            stack = traceback.extract_stack()\n"
        "            stack = [f for f in stack if not f.filename.startswith('<')]\n"
        "            here = stack[-1]  # the Python line that imports (C code calls from one too)\n"
        "            if here.line and name.split('.')[0] in here.line:\n"
        "                tried.append((name, here.filename))\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Absent())\n"
        "import iolib\n"
        "from iolib.sources import ParquetSource\n"
        f"loader = iolib.DataLoader(ParquetSource({str(path)!r}), batch_size=16,\n"
        "                          num_workers=2, prefetch='auto', worker_mode='thread')\n"
        "rows = sum(len(batch['x']) for batch in loader)\n"
        "tuner = loader.stats()['tuner']\n"
        "loader.close()\n"
        "ours = sorted({f for _, f in tried if '/iolib/' in f or '/predictors/' in f})\n"
        "print(rows, tuner['tuner'], ours)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=240
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["512", "QueueingTuner", "[]"], out.stdout
