"""`iolib tune` on a small real dataset: it probes for the batches asked (across epochs),
recommends only what it measured, and writes a report whose HTML parses."""

from __future__ import annotations

from html.parser import HTMLParser

from click.testing import CliRunner

from iolib.cli.tune import tune


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables = 0

    def handle_starttag(self, tag, attrs):
        self.tables += tag == "table"


def test_tune_probes_across_epochs_and_recommends_what_it_measured(token_dir, tmp_path):
    out = tmp_path / "report"
    args = [str(token_dir), "--step-ms", "2", "--batch-size", "10", "--batches", "30"]
    args += ["--verify-batches", "12", "--max-workers", "2", "--out", str(out)]
    result = CliRunner().invoke(tune, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    # 100 rows at batch 10: 10 batches an epoch, so 30 batches take 3 epochs.
    assert "30 batches over 3 epoch(s)" in md
    assert "(recommended)" in md and "nan" not in md.lower()
    assert ("was not met" in md) != ("the least memory of the configurations measured" in md)
    parsed = _Tables()
    parsed.feed((out / "report.html").read_text())
    assert parsed.tables == 2
