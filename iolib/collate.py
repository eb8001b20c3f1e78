"""Turning what a source read into a batch.

Columnar sources (Parquet, image folders) are collated column by column straight from
Arrow: a fixed-size list of int32 becomes one [batch, length] tensor with one copy and
no Python per sample. Row sources go through torch's ``default_collate`` (or the
user's ``collate_fn``), as in torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import default_collate


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _column_to_value(column: pa.ChunkedArray) -> Any:
    """Numbers and fixed-size lists of numbers become tensors that share the column's
    memory (DLPack, no copy): the tables sources return are fresh copies made by `take`,
    owned by this batch alone. Anything else becomes a Python list."""
    kind = column.type
    if column.null_count == 0 and len(column) > 0:
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if _numeric(kind):
            return torch.from_dlpack(array)
        if pa.types.is_boolean(kind):
            return torch.from_numpy(array.to_numpy(zero_copy_only=False))
        if pa.types.is_fixed_size_list(kind) and _numeric(kind.value_type):
            return torch.from_dlpack(array.flatten()).view(len(array), kind.list_size)
    return column.to_pylist()  # binary -> bytes, string -> str, nested -> lists


def collate_table(table: pa.Table) -> dict[str, Any]:
    """A dict of column name -> tensor (numbers, fixed-size lists) or list (anything else)."""
    return {name: _column_to_value(table.column(name)) for name in table.column_names}


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as dicts, for per-sample transforms and user collate functions."""
    return table.to_pylist()


def collate_rows(rows: list[Any], collate_fn: Any = None, *, arrow_rows: bool = False) -> Any:
    """Rows into a batch with the user's collate_fn, else torch's default_collate (as torch
    does: dict subclasses keep their type, ragged tensors raise). Rows made from Arrow
    tables (`arrow_rows`) may hold values torch cannot stack (bytes, strings, nulls): those
    columns stay lists."""
    if collate_fn is not None:
        return collate_fn(rows)
    if arrow_rows and rows and isinstance(rows[0], dict):
        return {key: _collate_column([row[key] for row in rows]) for key in rows[0]}
    return default_collate(rows)


def _collate_column(values: list[Any]) -> Any:
    if values and isinstance(values[0], (bytes, bytearray, str, type(None))):
        return values
    try:
        return default_collate(values)
    except (TypeError, RuntimeError):
        return values


def batch_nbytes(batch: Any) -> int:
    """Bytes a batch holds (tensors, bytes, arrays; containers walked), for memory accounting."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, (bytes, bytearray, memoryview)):
        return len(batch)
    if isinstance(batch, np.ndarray):
        return batch.nbytes
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        if batch and isinstance(batch[0], (str, int, float)):
            return 8 * len(batch)
        return sum(batch_nbytes(v) for v in batch)
    return 0
