"""Files of one dataset whose schemas drifted, and nulls where a tensor needs numbers.

Before: with columns=None batches changed keys from one file to the next, under shuffle
a bare "ArrowInvalid: Schema at index 2 was different" named no file (even under skip),
and a null label came back as a Python list [1, None, 0, 1].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.errors import ConfigError, DataError
from iolib.sources import ParquetSource
from tests.failures import raises_failure


def _write(root: Path, name: str, table: pa.Table) -> None:
    root.mkdir(exist_ok=True)
    pq.write_table(table, root / name, row_group_size=10)


def _ids(batches) -> list[int]:
    return sorted(int(i) for b in batches for i in b["id"])


def test_a_column_added_later_is_filled_and_keys_never_change(tmp_path: Path) -> None:
    ids = np.arange(40)
    _write(tmp_path / "d", "a.parquet", pa.table({"id": ids[:20], "label": ids[:20] % 3}))
    later = {"id": ids[20:], "label": ids[20:] % 3, "note": [f"n{i}" for i in ids[20:]]}
    _write(tmp_path / "d", "b.parquet", pa.table(later))
    loader = DataLoader(ParquetSource(str(tmp_path / "d")), batch_size=8, shuffle=True)
    batches = list(loader)
    assert {tuple(sorted(b)) for b in batches} == {("id", "label", "note")}
    notes = {int(i): n for b in batches for i, n in zip(b["id"], b["note"], strict=True)}
    assert notes[3] is None and notes[25] == "n25"


@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_a_file_whose_types_drifted_is_refused_by_name_or_skipped(tmp_path, shuffle) -> None:
    _write(tmp_path / "d", "a.parquet", pa.table({"id": np.arange(20), "label": np.arange(20)}))
    _write(tmp_path / "d", "b.parquet", pa.table({"id": np.arange(20, 30), "label": ["x"] * 10}))
    _write(tmp_path / "d", "c.parquet", pa.table({"id": np.arange(30, 40)}))  # lacks a number
    source = ParquetSource(str(tmp_path / "d"))
    assert set(source.drifted_files) == {
        str(tmp_path / "d" / n) for n in ("b.parquet", "c.parquet")
    }
    with raises_failure(DataError, match=r"(b|c)\.parquet.*schema differs"):
        list(DataLoader(source, batch_size=8, shuffle=shuffle))
    loader = DataLoader(ParquetSource(str(tmp_path / "d")), batch_size=8, shuffle=shuffle,
                        on_error="skip")  # fmt: skip
    got = _ids(loader)  # batches that lost every row are refilled (the skip policy)
    assert set(got) == set(range(20))
    assert loader.stats()["skipped"] >= 20  # each counted; a refill may draw some again


def test_a_null_number_names_its_sample_or_skips_only_that_row(tmp_path: Path) -> None:
    labels = pa.array([1, None, 0, 1] * 5, pa.int64())
    _write(tmp_path / "d", "a.parquet", pa.table({"id": np.arange(20), "label": labels}))
    with raises_failure(DataError, match=r"'label' \(int64\) is null.*sample 1\b"):
        list(DataLoader(ParquetSource(str(tmp_path / "d")), batch_size=4))
    loader = DataLoader(ParquetSource(str(tmp_path / "d")), batch_size=4, on_error="skip")
    batches = list(loader)
    assert _ids(batches) == [i for i in range(20) if i % 4 != 1], "only the null rows go"
    assert all(b["label"].dtype.is_floating_point is False for b in batches)
    assert loader.stats()["skipped"] == 5


def test_a_directory_reads_its_own_files_and_recursion_is_a_glob(tmp_path: Path) -> None:
    _write(tmp_path / "data", "top.parquet", pa.table({"id": np.arange(5)}))
    for split, ids in (("train", np.arange(10, 20)), ("val", np.arange(20, 25))):
        _write(tmp_path / "data" / split, "part.parquet", pa.table({"id": ids}))
    assert len(ParquetSource(str(tmp_path / "data"))) == 5  # train/ and val/ not mixed in
    assert len(ParquetSource(str(tmp_path / "data" / "**" / "*.parquet"))) == 20  # all of it
    (tmp_path / "data" / "top.parquet").unlink()
    with pytest.raises(DataError, match=r"holds no \*\.parquet files.*'train', 'val'.*\*\*"):
        len(ParquetSource(str(tmp_path / "data")))


@pytest.mark.parametrize("urls", ["", "  ", [""], []])
def test_an_empty_path_is_refused_rather_than_reading_the_working_directory(urls) -> None:
    with pytest.raises(ConfigError, match=r"empty path|urls"):
        ParquetSource(urls)
