"""`iolib bench` end to end on tiny inputs: every storage profile (moto S3 included), the
torch comparison, the observation schema through Parquet, bad input, Ctrl-C."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from iolib.cli import main
from iolib.cli.bench.records import (
    CONFIG,
    FEATURES,
    OUTCOMES,
    SCHEMA,
    arrow_type,
    read_observations,
)

# --repeats 1 --step-ms 0: one flat-out run per configuration (the demo's defaults,
# 3 repeats of a 40 ms step, would triple these tests' time).
TINY = ["--repeats", "1", "--step-ms", "0", "--samples", "64", "--rows-per-group", "16",
        "--batch-size", "8", "--batches", "3", "--workers", "1", "--depth", "2",
        "--no-progress"]  # fmt: skip


def run_cli(args, capsys):
    try:
        main(["bench", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    "profile, workload",
    [("local", "images"), ("memory", "tokens"), ("nvme", "tokens"), ("nas", "images"),
     ("object-store", "tokens")],
)  # fmt: skip
def test_each_profile_end_to_end(profile, workload, tmp_path, capsys):
    out_dir = tmp_path / "out"
    args = [*TINY, "--profile", profile, "--workload", workload, "--seq-len", "64",
            "--image-size", "32", "--out", str(out_dir)]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "iolib" in out and "torch" in out and "vs torch" in out
    df = read_observations(str(out_dir / "observations.parquet"))
    assert sorted(df["loader"]) == ["iolib", "torch"]
    assert set(df["storage_profile"]) == {profile}
    assert (df["batches"] == 2).all() and (df["throughput_sps"] > 0).all()
    assert df["complete"].all()
    run = json.loads((out_dir / "run.json").read_text())
    assert "--profile" in run["command"] and run["machine"] and "torch" in run["versions"]


def test_custom_profile_and_s3(tmp_path, capsys):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    args = [*TINY, "--profile", "custom,s3", "--workload", "tokens", "--seq-len", "32",
            "--latency-ms", "5", "--bandwidth-mbps", "100", "--out", str(tmp_path)]  # fmt: skip
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    df = read_observations(str(tmp_path / "observations.parquet"))
    assert set(df["storage_profile"]) == {"custom", "s3"}
    # The throttle really delays: probes see at least the configured 5 ms.
    assert (df["storage_latency_ms"] >= 4.5).all()


def test_observations_roundtrip_with_the_documented_schema(tmp_path, capsys):
    args = [*TINY, "--profile", "local", "--workload", "tokens", "--seq-len", "16",
            "--workers", "0,1", "--repeats", "2", "--step-ms", "2", "--plot",
            "--out", str(tmp_path)]  # fmt: skip
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    table = pq.read_table(tmp_path / "observations.parquet")
    assert table.column_names == list(SCHEMA)
    for name, (typ, _) in SCHEMA.items():
        assert table.schema.field(name).type == arrow_type(typ), name
    df = table.to_pandas()
    assert len(df) == 2 * 2 * 2  # workers x loaders x repeats
    assert set(df["repeat"]) == {0, 1}
    assert df.groupby("config_id").size().eq(2).all()
    assert (df["utilization"].between(0, 1)).all() and (df["step_ms"] == 2).all()
    assert not set(FEATURES) & set(OUTCOMES) and not set(CONFIG) & set(OUTCOMES)
    rows = json.loads((tmp_path / "observations.json").read_text())["rows"]
    assert rows[0]["workload"] == "tokens-16"
    assert any(name.endswith(".png") for name in os.listdir(tmp_path))


def test_dataset_url_workload(tmp_path, capsys):
    images = tmp_path / "data"
    images.mkdir()
    pq.write_table(pa.table({"ids": [[1, 2, 3, 4]] * 64}), images / "a.parquet", row_group_size=16)
    code, out, err = run_cli(
        [*TINY, "--profile", "local", "--data", str(images), "-w", "tokens"], capsys
    )
    assert code == 0, err
    assert "tokens-data" in out, out
    code, _, err = run_cli(
        [*TINY, "--profile", "local", "--data", str(images), "-w", "images"], capsys
    )
    assert code == 2 and "has no binary (image bytes) column" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, message",
    [(["--profile", "tape"], "'tape' is not one of"),
     (["--workload", "video"], "'video' is not one of"),
     (["--workers", "two"], "not an integer"),
     (["--frobnicate"], "No such option"),
     (["--data", "/nonexistent/x.parquet"], "Cannot read dataset"),
     (["--profile", "custom"], "--latency-ms"),
     (["--data", "/x", "--profile", "memory"], "synthetic data")],
)  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code, _, err = run_cli([*TINY, *args], capsys)
    assert code == 2
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and message in errors[0]


def test_ctrl_c_keeps_what_was_measured():
    from iolib.cli.bench.loop import measure

    def batches():
        yield {"x": b"1234"}
        yield {"x": b"1234"}
        raise KeyboardInterrupt

    m = measure(batches, batch_size=1, step_ms=1, batches=10)
    assert m.interrupted and len(m.stalls) == 2
    assert m.outcomes(4.0, depth=1)["batches"] == 1


def test_ctrl_c_in_cli_writes_observations(tmp_path, capsys, monkeypatch):
    import iolib.cli.bench.harness as runner

    real = runner.run_one
    calls = []

    def interrupted(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(runner, "run_one", interrupted)
    code, _, err = run_cli([*TINY, "--profile", "local", "-w", "tokens", "--seq-len", "8",
                            "--out", str(tmp_path)], capsys)  # fmt: skip
    assert code == 130 and "Interrupted" in err
    assert len(read_observations(str(tmp_path / "observations.parquet"))) == 1


def _row(loader, sps, util, repeat=0, profile="local", rss_mib=100, first_s=1.0):
    return {"workload": "images-256", "storage_profile": profile, "step_ms": 40.0,
            "workers": 1, "batch_size": 32, "loader": loader, "throughput_sps": sps,
            "utilization": util, "depth": 4, "repeat": repeat,
            "peak_rss_bytes": rss_mib * 2**20, "first_batch_s": first_s}  # fmt: skip


def test_verdict_says_ratio_busy_share_and_when_noise_decides():
    from iolib.cli.bench.display import verdict

    clear = [_row("iolib", v, 0.99, i) for i, v in enumerate((900, 950, 1000))]
    clear += [_row("torch", v, 0.5, i) for i, v in enumerate((400, 450, 500))]
    said = verdict(clear)
    assert "iolib delivered 2.1x torch's images/s" in said and "1 worker," in said
    assert "busy 99% of the time fed by iolib vs 50% by torch" in said
    assert "unreliable" not in said and "Only" not in said
    costly = [_row("iolib", 900, 0.99, i, rss_mib=677, first_s=0.5) for i in range(3)]
    costly += [_row("torch", 900, 0.99, i, rss_mib=2643, first_s=2.25) for i in range(3)]
    said = verdict(costly)
    assert "Peak memory 677 MiB for iolib against 2,643 MiB for torch" in said
    assert "first batch after 0.50 s against 2.25 s" in said
    noisy = [_row("iolib", v, 0.9, i) for i, v in enumerate((500, 800, 1200))]
    noisy += [_row("torch", v, 0.9, i) for i, v in enumerate((600, 700, 1000))]
    assert "unreliable" in verdict(noisy)
    assert "Only 1 run(s)" in verdict([_row("iolib", 900, 1.0), _row("torch", 450, 1.0)])


def test_plot_of_one_depth_is_bars_with_linear_axes(tmp_path):
    pytest.importorskip("matplotlib")
    from iolib.cli.bench.display import plot

    rows = [_row("iolib", 900 + i, 0.99, i) for i in range(3)]
    rows += [_row("torch", 450 + i, 0.5, i) for i in range(3)]
    (path,) = plot(rows, str(tmp_path))
    assert os.path.getsize(path) > 0


@pytest.mark.parametrize("loader", ["iolib", "torch"])
def test_data_whose_binary_column_is_not_images_names_file_column_and_row(tmp_path, capsys, loader):
    """`bench --data` on a binary column of something else: one line naming the file, the
    column and the row, before any loader runs (not Pillow's message about a BytesIO)."""
    data = tmp_path / "data"
    data.mkdir()
    blobs = [f"not an image {i}".encode() for i in range(64)]
    pq.write_table(pa.table({"blob": blobs}), data / "a.parquet", row_group_size=16)
    code, _, err = run_cli(
        [*TINY, "--profile", "local", "--data", str(data), "-w", "images", "--loaders", loader],
        capsys,
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Row 0 of " in err and f"{data}/a.parquet, column 'blob', is not an image" in err
    assert "BytesIO" not in err and "Traceback" not in err
    # Reads alone (--no-decode) measure such a column as it is.
    code, _, err = run_cli(
        [*TINY, "--profile", "local", "--data", str(data), "-w", "images", "--no-decode"], capsys
    )
    assert code == 0, err


def test_a_bad_image_past_the_probe_names_the_column_and_value():
    from iolib.cli.bench.datasets import Collate
    from iolib.errors import DataError

    with pytest.raises(DataError, match=r"Value 1 of the batch in column 'image' is not an"):
        Collate("image", decode=True, size=8)([{"image": _tiny_jpeg()}, {"image": b"text"}])


def _tiny_jpeg() -> bytes:
    import io

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(out, format="JPEG")
    return out.getvalue()


@pytest.mark.parametrize("reads, rows_per_read", [("row-groups", 16), ("samples", 1)])
def test_the_torch_baseline_is_named_and_reads_what_it_says(tmp_path, capsys, reads, rows_per_read):
    """By default torch reads the same Parquet shards a row group at a time (what a user
    would otherwise run), and the verdict names that baseline before any ratio."""
    args = [*TINY, "--profile", "object-store", "--workload", "images", "--image-size", "32",
            "--out", str(tmp_path), "--torch-reads", reads]  # fmt: skip
    if reads == "row-groups":
        args = args[:-2]  # the default
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    df = read_observations(str(tmp_path / "observations.parquet"))
    assert df.set_index("loader").loc["torch", "rows_per_read"] == rows_per_read
    verdict = " ".join(out[out.index("Verdict:") :].split())
    named = {"row-groups": "reads whole Parquet row groups and keeps the last one",
             "samples": "makes one request per sample"}[reads]  # fmt: skip
    assert verdict.startswith(
        f"Verdict: Baseline: torch's DataLoader over a map-style Dataset that {named}"
    )
    assert verdict.index("Baseline") < verdict.index("iolib delivered")


def test_both_loaders_read_the_same_samples_in_order(tmp_path):
    """The row-group baseline and iolib hand over the same images and labels (no shuffle)."""
    import torch

    from iolib.cli.bench.harness import BenchSpec, Config, make_loader
    from iolib.cli.bench.profiles import prepare_storage
    from iolib.cli.bench.workloads import make_images

    wl = make_images(str(tmp_path / "d"), 48, size=16, rows_per_group=16, seed=2)
    st = prepare_storage("local", str(tmp_path / "d"), overrides={})
    spec = BenchSpec(image_size=16, seed=2)
    batches = {}
    for loader in ("iolib", "torch"):
        cfg = Config(loader, workers=0, depth=1, shuffle="none", batch_size=8, step_ms=0,
                     cache=False)  # fmt: skip
        batches[loader] = list(make_loader(cfg, wl, st, spec))
    assert len(batches["torch"]) == len(batches["iolib"]) == 6
    for a, b in zip(batches["iolib"], batches["torch"], strict=True):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])


def test_a_variable_length_token_corpus_benches_on_both_loaders(tmp_path, capsys):
    """Real token corpora are variable-length (empty and null rows included): the torch
    side pads them as iolib does instead of failing in np.stack."""
    from tests.token_data import doc_lengths, write_documents

    lengths = doc_lengths(96, low=0, high=50)
    data = write_documents(tmp_path / "corpus", lengths, shards=2, nulls=(3, 40))
    code, _, err = run_cli(
        [*TINY, "--profile", "local", "--data", data, "-w", "tokens", "--loaders", "iolib,torch",
         "--out", str(tmp_path / "out")], capsys)  # fmt: skip
    assert code == 0, err
    df = read_observations(str(tmp_path / "out" / "observations.parquet"))
    assert sorted(df["loader"]) == ["iolib", "torch"] and df["complete"].all()
    assert (df["batches"] == 2).all()  # after the first batch, as every bench row


def test_torch_side_pads_token_rows_as_iolib_does():
    from iolib.cli.bench.datasets import Collate

    rows = [{"tokens": np.array([1, 2, 3], np.int32)}, {"tokens": np.zeros(0, np.int32)},
            {"tokens": None}, {"tokens": np.array([7], np.int32)}]  # fmt: skip
    batch = Collate("tokens", decode=False)(rows)
    assert batch["tokens"].tolist() == [[1, 2, 3], [0, 0, 0], [0, 0, 0], [7, 0, 0]]
    assert batch["tokens_lengths"].tolist() == [3, 0, 0, 1]
    assert batch["tokens_mask"].sum().item() == 4 and batch["tokens"].dtype == torch.int32
    fixed = Collate("tokens", decode=False)([{"tokens": np.arange(4)}] * 2)
    assert list(fixed) == ["tokens"] and fixed["tokens"].shape == (2, 4)
