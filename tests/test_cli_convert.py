"""`iolib convert` and `iolib inspect`: layout, byte-exact round trip, path safety, reports,
and bad input (exit code 2, one line)."""

from __future__ import annotations

import io
import itertools
import json
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from iolib import DataLoader
from iolib.cli.convert import relative_path, shard_plan
from iolib.sources import ParquetSource
from iolib.sources.files import SCHEMA
from tests.conftest import run_cli as run

COUNTS = {"cat": 5, "dog": 7, "eel": 3}  # 15 images, unequal classes


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    seed = 0
    for name, count in COUNTS.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            (root / name / f"img_{i:02d}.jpg").write_bytes(_jpeg(seed))
            seed += 1
    return root


def test_convert_layout(image_folder: Path, tmp_path: Path, capsys) -> None:
    dst = tmp_path / "out"
    code, out, _ = run(
        capsys, "convert", str(image_folder), str(dst), "--rows-per-group", "4",
        "--rows-per-shard", "8",
    )  # fmt: skip
    assert code == 0
    assert "15 images of 3 classes to 2 shard(s)" in out
    assert sorted(p.name for p in dst.iterdir()) == [
        "_classes.json",
        "part-00000.parquet",
        "part-00001.parquet",
    ]  # fmt: skip  (no temporary files left)
    assert json.loads((dst / "_classes.json").read_text()) == list(COUNTS)
    groups = [
        [pq.ParquetFile(f).metadata.row_group(i).num_rows for i in range(2)]
        for f in sorted(dst.glob("*.parquet"))
    ]
    assert groups == [[4, 4], [4, 3]]
    assert pq.read_schema(dst / "part-00000.parquet").remove_metadata().equals(SCHEMA)


def _read_all(dst: Path) -> dict[str, list]:
    loader = DataLoader(ParquetSource(str(dst)), batch_size=4)
    rows: dict[str, list] = {"image": [], "label": [], "path": []}
    for batch in loader:
        rows["image"] += batch["image"]
        rows["label"] += batch["label"].tolist()
        rows["path"] += batch["path"]
    return rows


def test_round_trip_bytes_identical(image_folder: Path, tmp_path: Path, capsys) -> None:
    dst = tmp_path / "out"
    args = ["convert", str(image_folder), str(dst), "--rows-per-group", "4", "--sorted"]
    assert run(capsys, *args)[0] == 0
    rows = _read_all(dst)
    assert len(rows["path"]) == sum(COUNTS.values())
    assert rows["path"] == sorted(rows["path"])  # --sorted: class, then file name
    for image, label, path in zip(rows["image"], rows["label"], rows["path"], strict=True):
        assert not path.startswith("/") and ".." not in path.split("/")
        assert image == (image_folder / path).read_bytes()
        assert label == list(COUNTS).index(path.split("/")[0])


def test_shuffle_seed_is_a_seeded_permutation(image_folder: Path, tmp_path: Path, capsys) -> None:
    orders = []
    for name in ("a", "b"):
        args = ["convert", str(image_folder), str(tmp_path / name), "--shuffle-seed", "7"]
        assert run(capsys, *args)[0] == 0
        orders.append(_read_all(tmp_path / name)["path"])
    assert orders[0] == orders[1]  # same seed, same order
    assert orders[0] != sorted(orders[0]) and sorted(orders[0]) == _read_all_sorted(image_folder)


def _read_all_sorted(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.jpg"))


def test_names_cannot_escape_dst(capsys) -> None:
    """A class directory named '..' and file names holding '../' (possible on object stores,
    here the memory filesystem) change neither where files are written nor make `path`
    escape SRC."""
    fs = fsspec.filesystem("memory")
    base = f"/t{uuid.uuid4().hex}"
    names = ["cat/a.jpg", "../evil.jpg", "../../etc/e.jpg", "dog/../../z.jpg", "dog/..\\w.jpg"]
    for i, name in enumerate(names):
        fs.pipe(f"{base}/src/{name}", _jpeg(i))
    before = set(fs.find("/"))
    try:
        code, _, err = run(capsys, "convert", f"memory://{base}/src", f"memory://{base}/out")
        assert code == 0, err
        written = set(fs.find("/")) - before
        assert written and all(p.startswith(f"{base}/out/") for p in written)
        paths = pq.read_table(fs.open(f"{base}/out/part-00000.parquet")).column("path")
        for path in paths.to_pylist():
            assert not path.startswith("/")
            assert not {"..", "."} & set(path.split("/")) and "\\" not in path
        # A class folder named '..' is not a class: ImageFolderSource leaves it out.
        assert {p.split("/")[0] for p in paths.to_pylist()} == {"cat", "dog"}
    finally:
        fs.rm(base, recursive=True)


def test_relative_path_and_shard_plan() -> None:
    assert relative_path("/r/src/a/./b//c.jpg", "/r/src/") == "a/b/c.jpg"
    assert relative_path("/r/src/../x.jpg", "/r/src") == "%2E%2E/x.jpg"
    assert list(shard_plan(10, 3, 5)) == [[3, 2], [3, 2]]
    assert list(shard_plan(8, 4, 8)) == [[4, 4]]
    assert list(shard_plan(5, 256, 2)) == [[2], [2], [1]]  # groups shrink to fit a shard


def test_inspect_parquet_text_and_json(image_folder: Path, tmp_path: Path, capsys) -> None:
    dst = tmp_path / "out"
    args = [
        "convert",
        str(image_folder),
        str(dst),
        "--rows-per-group",
        "4",
        "--rows-per-shard",
        "8",
    ]
    assert run(capsys, *args)[0] == 0
    code, out, _ = run(capsys, "inspect", str(dst))
    assert code == 0
    assert "files       2" in out and "rows        15" in out
    assert "row groups  4 (rows per group: min 3, median 4, max 4)" in out
    assert "classes     3" in out and "binary" in out
    code, out, _ = run(capsys, "inspect", str(dst / "*.parquet"), "--json")
    report = json.loads(out)
    assert (report["files"], report["rows"], report["row_groups"]["count"]) == (2, 15, 4)
    assert report["schema"] == {"image": "binary", "label": "int64", "path": "string"}
    sizes = sum((dst / n).stat().st_size for n in ("part-00000.parquet", "part-00001.parquet"))
    assert report["bytes"]["total"] == sizes
    assert set(report["bytes"]["columns"]) == {"image", "label", "path"}


def test_inspect_image_folder(image_folder: Path, capsys) -> None:
    code, out, _ = run(capsys, "inspect", str(image_folder))
    assert code == 0 and "classes  3" in out and "images   15" in out
    report = json.loads(run(capsys, "inspect", str(image_folder), "--json")[1])
    assert {e["class"]: e["images"] for e in report["per_class"]} == COUNTS
    total = sum(p.stat().st_size for p in image_folder.rglob("*.jpg"))
    assert report["bytes"]["total"] == total


@pytest.mark.parametrize(
    ("setup", "args", "expected"),
    [
        ("none", ["convert", "{tmp}/missing", "{tmp}/out"], "does not exist"),
        ("empty", ["convert", "{tmp}/empty", "{tmp}/out"], "holds no images"),
        ("full_dst", ["convert", "{src}", "{tmp}/out"], "--overwrite"),
        ("none", ["convert", "{src}", "{src}/parquet"], "inside SRC"),
        ("none", ["inspect", "{tmp}/missing"], "does not exist"),
        ("corrupt", ["inspect", "{tmp}/bad.parquet"], "truncated, corrupt or not Parquet"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    image_folder: Path, tmp_path: Path, capsys, setup: str, args: list[str], expected: str
) -> None:
    if setup == "empty":
        (tmp_path / "empty").mkdir()
    elif setup == "full_dst":
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "notes.txt").write_text("keep me")
    elif setup == "corrupt":
        (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    argv = [a.format(tmp=tmp_path, src=image_folder) for a in args]
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert expected in err and len(err.strip().splitlines()) == 1, err
    if setup == "full_dst":
        assert (tmp_path / "out" / "notes.txt").read_text() == "keep me"


def test_overwrite_replaces_an_earlier_conversion(image_folder: Path, tmp_path: Path, capsys):
    dst = tmp_path / "out"
    assert run(capsys, "convert", str(image_folder), str(dst), "--rows-per-shard", "4")[0] == 0
    assert len(list(dst.glob("*.parquet"))) == 4
    (dst / "README.txt").write_text("mine")
    args = ["convert", str(image_folder), str(dst), "--overwrite"]
    assert run(capsys, *args)[0] == 0
    assert [p.name for p in sorted(dst.glob("*.parquet"))] == ["part-00000.parquet"]  # no stale
    assert (dst / "README.txt").read_text() == "mine"
    assert len(ParquetSource(str(dst))) == 15


def test_convert_does_not_follow_links_out_of_src(image_folder: Path, tmp_path: Path, capsys):
    secret = tmp_path / "outside" / "passwd.jpg"
    secret.parent.mkdir()
    secret.write_bytes(b"root:x:0:0:not an image, and not SRC's")
    (image_folder / "cat" / "link.jpg").symlink_to(secret)
    (image_folder / "dog" / "elsewhere").symlink_to(secret.parent, target_is_directory=True)
    (image_folder / "eel" / "inside.jpg").symlink_to(image_folder / "cat" / "img_00.jpg")
    code, _, err = run(capsys, "convert", str(image_folder), str(tmp_path / "out"))
    assert code == 0, err
    assert "Left out 1 file(s) reached through symbolic links" in err  # a linked folder
    # is not descended into at all
    table = pq.read_table(tmp_path / "out")
    assert b"root:x" not in b"".join(table.column("image").to_pylist())
    assert table.num_rows == sum(COUNTS.values()) + 1  # the link that stays inside counts


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "--out", "{ro}/runs"],
        ["bench", "--storage-options", "notjson", "--data", "{tmp}/x"],
        ["convert", "{src}", "{ro}/shards"],
        ["tune", "{src}", "--step-ms", "5", "--out", "{ro}/report"],
    ],
    ids=["bench-out", "bench-options", "convert-dst", "tune-out"],
)
def test_outputs_and_options_are_checked_before_any_work(image_folder, tmp_path, capsys, args):
    unwritable = tmp_path / "a-file"  # nothing can be created under a file (even as root)
    unwritable.write_text("")
    argv = [a.format(tmp=tmp_path, src=image_folder, ro=unwritable) for a in args]
    code, _, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().split("\n")) == 1, err
    assert "Traceback" not in err, err
    assert "iolib bench:" not in err and "tuning" not in err, "no work before the check"


@pytest.mark.parametrize(
    "bad, why",
    [
        (b"just some text, named like a JPEG\n", "not a recognized image format"),
        (b"", "empty"),
        ("truncated", "truncated"),
    ],
)
def test_convert_refuses_a_file_that_is_not_an_image_naming_it(
    image_folder: Path, tmp_path: Path, capsys, bad, why
) -> None:
    """A text file named a.jpg (or an empty or cut-off JPEG) stops convert with its path,
    and no shard of the run is left in DST."""
    data = _jpeg(99)[: len(_jpeg(99)) // 2] if bad == "truncated" else bad
    (image_folder / "dog" / "a.jpg").write_bytes(data)
    dst = tmp_path / "out"
    code, _, err = run(capsys, "convert", str(image_folder), str(dst), "--rows-per-shard", "4")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{image_folder}/dog/a.jpg is not an image" in err and why in err.lower()
    assert not dst.exists() or not [p for p in dst.iterdir() if p.suffix == ".parquet"]
    (image_folder / "dog" / "a.jpg").unlink()  # the fix the message names works
    code, _, err = run(capsys, "convert", str(image_folder), str(dst))
    assert code == 0, err


def test_convert_names_every_bad_file_in_one_pass(image_folder: Path, tmp_path: Path, capsys):
    """Three undecodable files: one run names all three (not one per run), keeps no shard;
    --skip-bad leaves them out and lists them in DST/_skipped.txt."""
    bad = ["cat/x.jpg", "dog/y.jpg", "eel/z.jpg"]
    for name in bad:
        (image_folder / name).write_bytes(b"not an image")
    dst = tmp_path / "out"
    code, _, err = run(capsys, "convert", str(image_folder), str(dst), "--rows-per-group", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "3 files are not images" in err and "--skip-bad" in err
    assert all(f"{image_folder}/{name}" in err for name in bad), err
    assert not list(dst.glob("*.parquet"))
    code, _, err = run(capsys, "convert", str(image_folder), str(dst), "--skip-bad")
    assert code == 0, err
    assert "Left out 3 file(s) that do not decode" in err and "_skipped.txt" in err
    listed = [line.split("\t")[0] for line in (dst / "_skipped.txt").read_text().splitlines()]
    assert sorted(listed) == bad
    assert len(ParquetSource(str(dst))) == sum(COUNTS.values())
    code, _, err = run(capsys, "convert", str(image_folder), str(dst), "--skip-bad", "--overwrite")
    assert code == 0, err  # _skipped.txt is convert's own: --overwrite replaces it


def test_inspect_and_index_print_paths_as_given(image_folder, tmp_path, capsys, monkeypatch):
    """Relative input, relative output (not the absolute path, not a mix of both)."""
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "convert", "src", "shards")[0] == 0
    code, out, _ = run(capsys, "inspect", "shards")
    assert code == 0 and "  shards/part-00000.parquet " in out and str(tmp_path) not in out
    report = json.loads(run(capsys, "inspect", "shards", "--json")[1])
    assert report["per_file"][0]["url"] == "shards/part-00000.parquet"
    code, out, _ = run(capsys, "index", "shards")
    assert code == 0 and out.startswith("wrote shards/_metadata:") and str(tmp_path) not in out
    code, out, _ = run(capsys, "inspect", str(tmp_path / "shards"))  # absolute stays absolute
    assert f"{tmp_path}/shards/part-00000.parquet" in out


def test_row_groups_by_bytes(tmp_path: Path, capsys) -> None:
    """The default sizes row groups by bytes: each closes at the first image that brings
    it to --row-group-mb, so images of different weights make groups of different rows
    but like bytes; --rows-per-group still fixes the count."""
    root = tmp_path / "src"
    rng = np.random.default_rng(0)
    for c, side in (("small", 16), ("large", 64)):  # about 0.8 and 3.5 KB a JPEG
        (root / c).mkdir(parents=True)
        for i in range(12):
            out = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (side, side, 3), np.uint8)).save(out, "JPEG")
            (root / c / f"{i:02d}.jpg").write_bytes(out.getvalue())
    target = 10_000
    code, out, err = run(capsys, "convert", str(root), str(tmp_path / "out"),
                         "--row-group-mb", str(target / 1e6))  # fmt: skip
    assert code == 0, err
    biggest = max(p.stat().st_size for p in root.rglob("*.jpg"))
    table = pq.read_table(tmp_path / "out")
    meta = pq.ParquetFile(tmp_path / "out" / "part-00000.parquet").metadata
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    sizes = [len(v) for v in table.column("image").to_pylist()]
    starts = np.cumsum([0, *rows])
    held = [sum(sizes[a:b]) for a, b in itertools.pairwise(starts)]
    assert all(target <= h < target + biggest for h in held[:-1]), held
    assert len(set(rows)) > 1  # rows differ with the images' weights
    assert run(capsys, "convert", str(root), str(tmp_path / "fixed"), "--rows-per-group",
               "5")[0] == 0  # fmt: skip
    meta = pq.ParquetFile(tmp_path / "fixed" / "part-00000.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [5, 5, 5, 5, 4]
