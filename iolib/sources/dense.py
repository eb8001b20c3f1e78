"""A whole dataset's fixed-width columns as contiguous arrays, for one-copy batch gathers.

When a dataset fits in memory and every column read is fixed-width (numbers, or
fixed-size lists of numbers, without nulls), a batch is one `np.take` per column from
one array: a single copy with the GIL released. Gathering from Arrow row groups instead
takes per row group and then reorders (two copies plus Arrow's per-call overhead):
measured 0.2 against 0.8 ms for a batch of 256 rows of 2,048 int32 on one core.

Variable-length lists of numbers (token ids) are held the same way: all items in one
array, each row group at a slot sized from its footer (so row groups can fill in any
order), each row's start and length; a batch is one vectorised gather of its rows'
ranges (0.1 ms for 256 rows of ~128 int32, against ~1.5 ms for Arrow's take per row
group, concatenation and reordering under a global shuffle).

Row groups are copied in as they are first read, so the first epoch reads storage as
before; the arrays are allocated at once but take memory page by page as they fill.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def dense_shape(kind: pa.DataType) -> tuple[np.dtype, tuple[int, ...]] | None:
    """The numpy dtype and per-row shape that hold values of `kind`, or None when the
    type is not fixed-width numeric (strings, binary, variable lists, booleans...)."""
    shape: list[int] = []
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        return None
    return np.dtype(kind.to_pandas_dtype()), tuple(shape)


def list_item_type(kind: pa.DataType) -> pa.DataType | None:
    """The item type of a variable-length list of numbers, else None."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = kind.value_type
        if pa.types.is_integer(item) or pa.types.is_floating(item):
            return item
    return None


class _Lists:
    """One list column: items of every row group at their slots, rows' starts and lengths."""

    def __init__(self, kind: pa.DataType, total: int, capacities: np.ndarray) -> None:
        self.kind = kind
        self.slots = np.concatenate([[0], np.cumsum(capacities)]).astype(np.int64)
        self.items = np.empty(int(self.slots[-1]), np.dtype(kind.value_type.to_pandas_dtype()))
        self.starts = np.zeros(total, dtype=np.int64)
        self.lengths = np.zeros(total, dtype=np.int64)

    def prepare(self, column: pa.ChunkedArray, group: int) -> tuple | None:
        """What `put` copies in, or None where the rows cannot be held (nulls, overflow)."""
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        values = array.flatten()
        if array.null_count or values.null_count:
            return None
        if len(values) > self.slots[group + 1] - self.slots[group]:
            return None  # more items than the footer counted: not expected, stay correct
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False).astype(np.int64)
        return values.to_numpy(zero_copy_only=False), lengths

    def put(self, group: int, start: int, prepared: tuple) -> None:
        values, lengths = prepared
        slot = int(self.slots[group])
        self.items[slot : slot + values.size] = values
        stop = start + lengths.size
        self.starts[start:stop] = slot + np.cumsum(lengths) - lengths
        self.lengths[start:stop] = lengths

    def take(self, indices: np.ndarray) -> pa.Array:
        lengths = self.lengths[indices]
        large = pa.types.is_large_list(self.kind)
        offsets = np.zeros(indices.size + 1, dtype=np.int64 if large else np.int32)
        np.cumsum(lengths, out=offsets[1:])
        # Row r's items are items[starts[r] : starts[r] + lengths[r]]: one index for all.
        index = np.arange(int(offsets[-1]), dtype=np.int64)
        index += np.repeat(self.starts[indices] - offsets[:-1], lengths)
        values = pa.array(np.take(self.items, index), type=self.kind.value_type)
        build = pa.LargeListArray if large else pa.ListArray
        return build.from_arrays(pa.array(offsets), values, type=self.kind)


def _values(column: pa.ChunkedArray, rows: int, shape: tuple[int, ...]) -> np.ndarray | None:
    """A column's values as a [rows, *shape] array (zero-copy where Arrow allows), or
    None if any value or list item is null."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    for _ in shape:
        if array.null_count:
            return None
        array = array.flatten()  # honours slicing offsets
    if array.null_count:
        return None
    return array.to_numpy(zero_copy_only=False).reshape((rows, *shape))


def _to_arrow(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    """Rows of `values` as an Arrow array of `kind`, sharing their memory."""
    if not pa.types.is_fixed_size_list(kind):
        return pa.array(values.reshape(-1), type=kind)
    inner = _to_arrow(values.reshape(-1, *values.shape[2:]), kind.value_type)
    return pa.FixedSizeListArray.from_arrays(inner, type=kind)


class DenseColumns:
    """The columns of `schema` for `total` rows, filled one row group at a time."""

    def __init__(
        self,
        schema: pa.Schema,
        starts: np.ndarray,
        capacities: dict[str, np.ndarray] | None = None,
    ) -> None:
        """capacities: items each row group holds, per list column (from the footers)."""
        self.schema = schema
        self.starts = starts
        total = int(starts[-1])
        self.arrays: dict[str, np.ndarray] = {}
        self.lists: dict[str, _Lists] = {}
        for field in schema:
            if list_item_type(field.type) is not None:
                self.lists[field.name] = _Lists(field.type, total, capacities[field.name])
                continue
            dtype, shape = dense_shape(field.type)  # type: ignore[misc]
            self.arrays[field.name] = np.empty((total, *shape), dtype=dtype)
        self.filled = np.zeros(len(starts) - 1, dtype=bool)
        self.complete = False  # every row group filled: reads skip the bookkeeping
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """A forked worker's copy: a parent thread may have held the lock at the fork."""
        self._lock = threading.Lock()

    @staticmethod
    def supports(schema: pa.Schema) -> bool:
        return len(schema) > 0 and all(
            dense_shape(f.type) is not None or list_item_type(f.type) is not None for f in schema
        )

    def missing(self, groups: np.ndarray) -> list[int]:
        """Row groups among `groups` not copied in yet."""
        return [int(g) for g in np.unique(groups) if not self.filled[g]]

    def fill(self, group: int, table: pa.Table) -> bool:
        """Copy row group `group` in. False (nothing kept) if it holds a null, which these
        arrays cannot represent: the caller then goes back to reading Arrow tables."""
        start, stop = int(self.starts[group]), int(self.starts[group + 1])
        parts, lists = {}, {}
        for name, held in self.lists.items():
            lists[name] = held.prepare(table.column(name), group)
            if lists[name] is None:
                return False
        for field in self.schema:
            if field.name in self.lists:
                continue
            values = _values(
                table.column(field.name), stop - start, self.arrays[field.name].shape[1:]
            )
            if values is None:
                return False
            parts[field.name] = values
        with self._lock:
            if not self.filled[group]:
                for name, values in parts.items():
                    self.arrays[name][start:stop] = values
                for name, prepared in lists.items():
                    self.lists[name].put(group, start, prepared)
                self.filled[group] = True
                self.complete = bool(self.filled.all())
        return True

    def take(self, indices: np.ndarray) -> pa.Table:
        """Rows at `indices` (all in filled row groups), in that order: one copy."""
        columns = [
            self.lists[f.name].take(indices)
            if f.name in self.lists
            else _to_arrow(np.take(self.arrays[f.name], indices, axis=0), f.type)
            for f in self.schema
        ]
        return pa.Table.from_arrays(columns, schema=self.schema)
