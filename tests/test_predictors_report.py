"""The tuning report renders from plain numbers (SYNTHETIC values); its HTML parses."""

from __future__ import annotations

from html.parser import HTMLParser

import pandas as pd

from predictors.report import write_report


class _Structure(HTMLParser):
    """Counts tables, their rows, and headings; keeps the text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables, self.rows, self.headings, self.open, self.text = 0, [], [], [], []

    VOID = frozenset({"meta", "img", "br", "hr", "link"})

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.open.append(tag)
        if tag == "table":
            self.tables += 1
            self.rows.append(0)
        elif tag == "tr":
            self.rows[-1] += 1

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (self.open, tag)  # well nested
        self.open.pop()

    def handle_data(self, data):
        if self.open and self.open[-1] in ("h1", "h2", "h3"):
            self.headings.append(data)
        self.text.append(data)


MEASURED = pd.DataFrame(
    {
        "workers": [1, 2, 4, 4],
        "depth": [2, 4, 4, 8],
        "predicted_utilization": [0.5, 0.8, 0.95, float("nan")],
        "measured_utilization": [0.45, 0.82, 0.93, 0.97],
        "memory_bytes": [2e6, 4e6, 4e6, 8e6],
        "samples_per_s": [100.0, 200.0, 400.0, 420.0],
    }
)
DRIVERS = {
    "service_ms": 40.0,
    "read_ms": 39.0,
    "decode_ms": 1.0,
    "transform_ms": 0.0,
    "step_ms": 10.0,
    "cpu_ms": 0.5,
    "cpu_count": 2,
    "cpu_bound": 32.0,
    "workers_needed": 4,
    "grid": pd.DataFrame(
        {"workers": [1, 1, 2], "depth": [1, 2, 2], "utilization": [0.25, 0.25, 0.5]}
    ),
}


def _recommendation(**over):
    base = {
        "workers": 4,
        "depth": 4,
        "meets_target": True,
        "measured_utilization": 0.93,
        "measured_memory_bytes": 4e6,
        "why_missed": None,
        "probe_batches": 80,
        "probe_epochs": 3,
        "verify_batches": 40,
    }
    return {**base, **over}


def test_the_html_parses_with_one_table_per_table_and_no_nan(tmp_path):
    paths = write_report(tmp_path, _recommendation(), MEASURED, DRIVERS, step_ms=10, target=0.9)
    md, page = paths["markdown"].read_text(), paths["html"].read_text()
    parsed = _Structure()
    parsed.feed(page)
    parsed.close()
    assert parsed.tables == 2  # the runs measured, the predicted grid
    assert parsed.rows == [1 + 3, 1 + 2]  # headers + rows; the row with a nan is left out
    assert parsed.headings[0] == "Data-loading tuning report"
    assert "What drives the result for this dataset" in parsed.headings
    assert "nan" not in md.lower() and "nan" not in page.lower()
    assert "num_workers=4,\n    prefetch=4," in md and "0.93 (recommended)" in md
    assert "80 batches over 3 epoch(s)" in md
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"


def test_a_missed_target_is_said_plainly_with_the_reason(tmp_path):
    rec = _recommendation(
        meets_target=False, measured_utilization=0.82, why_missed="storage: 9 workers needed"
    )
    paths = write_report(tmp_path, rec, MEASURED, DRIVERS, step_ms=10, target=0.95)
    md = paths["markdown"].read_text()
    assert "Target missed: 0.95 was not met" in md and "configuration recommended" in md
    assert "storage: 9 workers needed" in md


def test_the_report_says_what_the_prior_predicted_and_what_the_model_changed(tmp_path):
    """The tuner's decisions: the last one in words, and each one's prior prediction,
    model change and sd in a table (a decision without them shows '-', never nan)."""
    decisions = [
        {
            "batch": 5,
            "workers": 2,
            "depth": 4,
            "predicted": {
                "prior_utilization": 0.88,
                "model_change": 0.031,
                "model_sd": 0.02,
                "lower_bound": 0.9,
            },
        },
        {"batch": 40, "workers": 4, "depth": 4, "predicted": {}},
    ]
    rec = _recommendation(
        tuner_reason="measured: least memory ...; prior 0.88, model +0.031 (sd 0.020)",
        tuner_model="online: a Gaussian process on this run's measured errors of the prior",
        decisions=decisions,
    )
    paths = write_report(tmp_path, rec, MEASURED, DRIVERS, step_ms=10, target=0.9)
    md, page = paths["markdown"].read_text(), paths["html"].read_text()
    parsed = _Structure()
    parsed.feed(page)
    assert "What the tuner decided during the probe" in parsed.headings
    assert parsed.tables == 3 and parsed.rows[-1] == 1 + 2
    assert "| 5 | 2 / 4 | 0.88 | +0.031 | 0.020 | 0.90 |" in md
    assert "| 40 | 4 / 4 | - | - | - | - |" in md
    assert "prior 0.88, model +0.031 (sd 0.020)" in md and "Model: online" in md
    assert "nan" not in md.lower()
    plain = write_report(
        tmp_path / "plain", _recommendation(), MEASURED, DRIVERS, step_ms=10, target=0.9
    )
    assert "What the tuner decided" not in plain["markdown"].read_text()
