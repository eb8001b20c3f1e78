"""Parquet column types through collate, checked by outcome: each key's type, dtype and
values, the same under thread workers and with a small cache (another read path)."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from iolib import DataLoader
from iolib.errors import DataError
from iolib.sources import ParquetSource

N = 12


def _table() -> pa.Table:
    return pa.table(
        {
            "id": np.arange(N),
            "flag": pa.array([i % 3 == 0 for i in range(N)]),
            "half": pa.array(np.arange(N, dtype=np.float16) / 4),
            "day": pa.array([datetime.date(2024, 1, 1 + i) for i in range(N)]),
            "price": pa.array([decimal.Decimal(f"{i}.25") for i in range(N)], pa.decimal128(9, 2)),
            "bits": pa.array([[i % 2 == 0] * (1 + i % 2) for i in range(N)], pa.list_(pa.bool_())),
        }
    )


@pytest.fixture(scope="module")
def typed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("typed")
    pq.write_table(_table(), root / "a.parquet", row_group_size=4)
    return root


@pytest.mark.parametrize(
    "options", [{}, {"num_workers": 2}, {"cache_bytes": 2000}], ids=["inline", "workers", "small"]
)
def test_bool_float16_date_and_decimal_columns_keep_their_type(typed, options) -> None:
    cache = {"cache_bytes": options.pop("cache_bytes")} if "cache_bytes" in options else {}
    loader = DataLoader(ParquetSource(str(typed), **cache), batch_size=5, shuffle=True,
                        seed=2, **options)  # fmt: skip
    batches = list(loader)
    ids = torch.cat([b["id"] for b in batches]).tolist()
    assert sorted(ids) == list(range(N))
    for b in batches:
        rows = b["id"].tolist()
        assert b["flag"].dtype == torch.bool  # not uint8: masks and where() need bool
        assert b["flag"].tolist() == [i % 3 == 0 for i in rows]
        assert b["half"].dtype == torch.float16
        assert b["half"].tolist() == [i / 4 for i in rows]
        # No tensor holds dates or decimals: the exact values, as Python objects.
        assert b["day"] == [datetime.date(2024, 1, 1 + i) for i in rows]
        assert b["price"] == [decimal.Decimal(f"{i}.25") for i in rows]
        assert b["bits"] == [[i % 2 == 0] * (1 + i % 2) for i in rows]


def test_a_null_boolean_is_refused_naming_the_column_and_row(tmp_path) -> None:
    table = pa.table({"id": np.arange(4), "flag": pa.array([True, None, False, True])})
    pq.write_table(table, tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"Column 'flag' \(bool\) is null .*sample 1"):
        next(iter(DataLoader(ParquetSource(str(tmp_path)), batch_size=4)))


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8, np.float32, np.float64])
@pytest.mark.parametrize("chunks", [1, 2])
def test_a_sliced_fixed_size_list_column_collates_to_its_own_rows(dtype, chunks) -> None:
    """A fixed-size list column that is a slice of a larger array (a table's rows taken
    from the middle), of any numeric type, in one chunk or several, gives a [rows, size]
    tensor of those rows, not the array's first."""
    from iolib.collate import collate_table

    values = pa.array(np.arange(40).astype(dtype))
    whole = pa.FixedSizeListArray.from_arrays(values, 4)  # rows [0..3], [4..7], ...
    parts = [whole.slice(3, 4)] if chunks == 1 else [whole.slice(3, 2), whole.slice(5, 2)]
    batch = collate_table(pa.table({"x": pa.chunked_array(parts)}))
    assert batch["x"].dtype == torch.from_numpy(np.zeros(1, dtype=dtype)).dtype
    assert batch["x"].tolist() == [[12 + 4 * r + c for c in range(4)] for r in range(4)]
