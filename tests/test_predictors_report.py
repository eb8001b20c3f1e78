"""The tuning report renders from plain numbers (SYNTHETIC values)."""

from __future__ import annotations

import pandas as pd

from predictors.report import write_report


def test_report_files_and_contents(tmp_path):
    candidates = pd.DataFrame(
        {
            "workers": [1, 2, 4],
            "depth": [2, 4, 8],
            "predicted_utilization": [0.5, 0.8, 0.95],
            "measured_utilization": [0.45, 0.82, 0.93],
            "predicted_memory_bytes": [2e6, 4e6, 8e6],
        }
    )
    rec = {
        "workers": 4,
        "depth": 8,
        "reason": "least memory predicted to reach 0.95",
        "feasible": False,
        "bottleneck": "storage",
        "predicted_utilization": 0.95,
        "measured_utilization": 0.93,
        "predicted_throughput_sps": 1000.0,
        "measured_throughput_sps": 980.0,
        "predicted_memory_bytes": 8e6,
        "measured_memory_bytes": 7e6,
    }
    imp = pd.Series({"log_load_ratio": 0.4, "log_depth": 0.1})
    paths = write_report(tmp_path, rec, candidates, imp, step_ms=50, target=0.9)
    md = paths["markdown"].read_text()
    assert "num_workers=4, prefetch=8" in md
    assert "out of reach" in md and "storage" in md
    assert "0.93" in md and "log_load_ratio" in md
    assert paths["candidates"].read_bytes()[:4] == b"\x89PNG"
    assert paths["importances"].exists() and "<h1>" in paths["html"].read_text()
