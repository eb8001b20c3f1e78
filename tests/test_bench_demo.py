"""What `iolib bench` with no profile or step (`make demo`) shows a user: a case where both
loaders keep up (local disk, 40 ms step) and one where the loader sets the pace (the
object store, 5 ms step), each with memory, first batch and bytes read for both."""

from __future__ import annotations

from iolib.cli import main
from iolib.cli.bench.display import verdict
from iolib.cli.bench.records import read_observations

# The demo's profiles and steps, on tiny data: only sizes and counts are set.
SMALL = ["--repeats", "1", "--samples", "64", "--rows-per-group", "16", "--batch-size", "8",
         "--batches", "3", "--workers", "1", "--depth", "2", "--image-size", "32",
         "--no-progress"]  # fmt: skip


def _row(loader, util, profile, step, read_mb, sps=100.0):
    return {"workload": "images-256", "storage_profile": profile, "step_ms": step,
            "workers": 4, "batch_size": 32, "loader": loader, "throughput_sps": sps,
            "utilization": util, "depth": 8, "repeat": 0, "peak_rss_bytes": 500 * 2**20,
            "first_batch_s": 1.0, "tree_read_bytes": int(read_mb * 1e6)}  # fmt: skip


def test_the_demo_runs_a_short_step_on_the_object_store_and_says_what_it_cost(tmp_path, capsys):
    try:
        main(["bench", *SMALL, "--out", str(tmp_path)])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    assert code == 0, out.err
    df = read_observations(str(tmp_path / "observations.parquet"))
    steps = {(p, float(s)) for p, s in zip(df["storage_profile"], df["step_ms"], strict=True)}
    assert steps == {("local", 40.0), ("object-store", 5.0)}
    assert (df["tree_read_bytes"] > 0).all()  # both loaders' reads counted
    said = " ".join(out.out[out.out.index("Verdict:") :].split())
    local = said[said.index("On local disk") : said.index("On a simulated object store")]
    store = said[said.index("On a simulated object store") :]
    assert "with a 40 ms training step" in local
    assert "with a 5 ms training step" in store
    for sentence in (local, store):
        assert "Peak memory" in sentence and "MiB for torch" in sentence
        assert "first batch after" in sentence
        assert "MB read against" in sentence


def test_the_verdict_says_when_the_loader_sets_the_pace():
    rows = [_row("iolib", 0.8, "object-store", 5.0, 40) for _ in range(3)]
    rows += [_row("torch", 0.25, "object-store", 5.0, 90) for _ in range(3)]
    said = verdict(rows)
    assert "the loader, not the step, sets the pace here" in said
    assert "a batch takes 6 ms with iolib against 20 ms with torch" in said
    assert "; 40 MB read against 90 MB." in said
    kept_up = [_row(lo, 0.99, "local", 40.0, 10) for lo in ("iolib", "torch") for _ in range(3)]
    assert "both keep up" in verdict(kept_up)
