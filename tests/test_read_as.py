"""`ParquetSource.fetch_row_group(read_as=...)`: columns decoded as a narrower integer
type, the same values; a value the type cannot hold is a DataError naming the row
group and the range found, never a wrapped value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib.errors import DataError
from iolib.sources import ParquetSource


def _source(tmp_path, ids: list[list[int | None] | None], labels: list[int]) -> ParquetSource:
    table = pa.table(
        {"ids": pa.array(ids, pa.list_(pa.int64())), "label": pa.array(labels, pa.int32())}
    )
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=2)
    return ParquetSource(str(tmp_path / "part-0.parquet"))


def test_columns_are_read_as_the_narrower_type_with_the_same_values(tmp_path) -> None:
    ids = [[1, 2, 65_535], None, [], [7] * 5000]
    source = _source(tmp_path, ids, [3, 4, 5, 6])
    read_as = {"ids": pa.list_(pa.uint16()), "label": pa.int8()}
    for group in (0, 1):
        plain = source.fetch_row_group(group)
        narrow = source.fetch_row_group(group, read_as=read_as)
        assert narrow.schema.field("ids").type == pa.list_(pa.uint16())
        assert narrow.schema.field("label").type == pa.int8()
        assert narrow.column("ids").to_pylist() == plain.column("ids").to_pylist()
        assert narrow.column("label").to_pylist() == plain.column("label").to_pylist()


@pytest.mark.parametrize(
    ("ids", "labels", "found"),
    [
        ([[1, 65_536], [2]], [0, 0], "from 1 to 65536"),
        ([[-1, 2], [2]], [0, 0], "from -1 to 2"),
        ([[1], [2]], [0, 300], "from 0 to 300"),
    ],
)
def test_a_value_the_type_cannot_hold_is_a_data_error(tmp_path, ids, labels, found) -> None:
    source = _source(tmp_path, ids, labels)
    read_as = {"ids": pa.list_(pa.uint16()), "label": pa.int8()}
    with pytest.raises(DataError, match=rf"part-0\.parquet.*row group 0.*{found}"):
        source.fetch_row_group(0, read_as=read_as)
    assert np.array_equal(source.fetch_row_group(0).column("label").to_numpy(), labels)
