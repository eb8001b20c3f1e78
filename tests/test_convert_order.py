"""`iolib convert` writes a shuffled order by default, so that shuffle="block" batches mix
classes as a full shuffle's do; a block shuffle over label-sorted shards says so."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from iolib import DataLoader
from iolib.sources import ParquetSource
from tests.conftest import run_cli as run

CLASSES, PER_CLASS, BATCH = 30, 40, 64


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("classes") / "src"
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buffer, format="JPEG")
    for c in range(CLASSES):
        (root / f"c{c:02d}").mkdir(parents=True)
        for i in range(PER_CLASS):
            (root / f"c{c:02d}" / f"{i:03d}.jpg").write_bytes(buffer.getvalue())
    return root


def _median_classes(shards: Path, shuffle: bool | str) -> float:
    source = ParquetSource(str(shards), columns=["label"])
    loader = DataLoader(source, batch_size=BATCH, shuffle=shuffle, seed=0, drop_last=True)
    counts = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        counts += [len(set(batch["label"].tolist())) for batch in loader]
    return float(np.median(counts))


@pytest.mark.parametrize("groups", [[], ["--rows-per-group", "32"]], ids=["256", "32"])
def test_default_convert_mixes_classes_in_block_shuffled_batches(
    folder: Path, tmp_path: Path, capsys, caplog, groups: list[str]
) -> None:
    """With 256-row groups the whole set fits one shuffle window; with 32-row groups a
    window of 8 holds 256 rows, about 7 classes if they were written sorted."""
    assert run(capsys, "convert", str(folder), str(tmp_path / "default"), *groups)[0] == 0
    args = ["convert", str(folder), str(tmp_path / "sorted"), "--sorted", *groups]
    assert run(capsys, *args)[0] == 0
    with caplog.at_level(logging.WARNING, logger="iolib"):
        block = _median_classes(tmp_path / "default", "block")
    assert not [r for r in caplog.records if "labels run sorted" in r.getMessage()]
    uniform = _median_classes(tmp_path / "sorted", True)
    assert block >= 0.9 * uniform, (block, uniform)


def test_block_shuffle_over_sorted_shards_says_so_once(folder: Path, tmp_path: Path, capsys,
                                                       caplog) -> None:  # fmt: skip
    args = ["convert", str(folder), str(tmp_path / "sorted"), "--sorted", "--rows-per-group", "32"]
    assert run(capsys, *args)[0] == 0
    with caplog.at_level(logging.WARNING, logger="iolib"):
        sorted_block = _median_classes(tmp_path / "sorted", "block")
    said = [r.getMessage() for r in caplog.records if "labels run sorted" in r.getMessage()]
    assert len(said) == 1 and "--sorted" in said[0] and "shuffle=True" in said[0], said
    assert sorted_block < 0.75 * _median_classes(tmp_path / "sorted", True)


def test_sorted_labels_told_by_statistics_without_converts_metadata(tmp_path: Path) -> None:
    """Shards another tool wrote, sorted by label: told from the row groups' statistics."""
    import pyarrow as pa

    labels = np.repeat(np.arange(10), 50)
    pq.write_table(pa.table({"label": labels}), tmp_path / "sorted.parquet", row_group_size=40)
    mixed = np.random.default_rng(0).permutation(labels)
    pq.write_table(pa.table({"label": mixed}), tmp_path / "mixed.parquet", row_group_size=40)
    from iolib.sources.layout import sorted_labels

    assert "statistics" in sorted_labels(ParquetSource(str(tmp_path / "sorted.parquet")).files)
    assert sorted_labels(ParquetSource(str(tmp_path / "mixed.parquet")).files) is None


def test_convert_records_its_order_in_the_shards(folder: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = run(capsys, "convert", str(folder), str(tmp_path / "a"), "--shuffle-seed", "3")
    assert code == 0 and "shuffled with seed 3" in out
    meta = pq.read_metadata(tmp_path / "a" / "part-00000.parquet").metadata
    assert json.loads(meta[b"iolib.convert.order"]) == {"order": "shuffled", "seed": 3}
    labels = pq.read_table(tmp_path / "a", columns=["label"]).column("label").to_numpy()
    assert sorted(labels.tolist()) == sorted(np.repeat(np.arange(CLASSES), PER_CLASS).tolist())
    assert (np.diff(labels) < 0).any()  # not sorted
