"""What a Parquet footer says about a row group's size, in Parquet's bytes and in Arrow's.

Why Arrow's: the row-group cache holds decoded tables, and Parquet's encoded sizes of
token lists are about half their Arrow size (dictionary and bit-packed encodings): a
cache sized from them held 87 of the 116 MiB a global shuffle needed, and thrashed.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq


def column_sizes(group: pq.RowGroupMetaData, compressed: bool) -> dict[str, int]:
    """Bytes per top-level column of one row group (a nested column sums its leaves)."""
    sizes: dict[str, int] = {}
    for j in range(group.num_columns):
        chunk = group.column(j)
        name = chunk.path_in_schema.split(".")[0]
        size = chunk.total_compressed_size if compressed else chunk.total_uncompressed_size
        sizes[name] = sizes.get(name, 0) + size
    return sizes


def _fixed_width(kind: pa.DataType) -> int | None:
    """Bytes per value of a fixed-width type (numbers, fixed-size lists of them), else None."""
    width = 1
    while pa.types.is_fixed_size_list(kind):
        width, kind = width * kind.list_size, kind.value_type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_temporal(kind):
        return width * kind.bit_width // 8
    return None


def arrow_bytes(field: pa.Field, rows: int, parquet_bytes: int, leaf_values: int) -> int:
    """Bytes a row group's column takes in Arrow, from the footer alone: exact for
    fixed-width types and lists of them (offsets plus values: Parquet's encoded size of
    token ids is often half of it, which made the cache too small and thrash), Parquet's
    uncompressed size plus offsets otherwise (strings: near exact without a dictionary,
    else corrected by a measured read)."""
    kind = field.type
    width = _fixed_width(kind)
    if width is not None:
        return rows * width
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = _fixed_width(kind.value_type)
        if item is not None:
            offset = 8 if pa.types.is_large_list(kind) else 4
            return offset * (rows + 1) + leaf_values * item
    return parquet_bytes + 8 * rows


def exact_size(kind: pa.DataType) -> bool:
    """Whether `arrow_bytes` is exact for `kind` (no measured correction needed)."""
    if _fixed_width(kind) is not None:
        return True
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and (
        _fixed_width(kind.value_type) is not None
    )


def plain_bytes_exact(kind: pa.DataType) -> bool:
    """Whether `arrow_bytes` is exact for a chunk of `kind` written without a dictionary:
    flat strings and binary, which Parquet then stores back to back as Arrow does (the
    estimate is over by their length prefixes). With a dictionary, a repeated value is
    stored once and decoded many times: only a read tells."""
    return (
        pa.types.is_string(kind) or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    )  # fmt: skip


def dictionary_columns(group: pq.RowGroupMetaData) -> frozenset[str]:
    """Top-level columns of one row group with a dictionary page in any of their chunks."""
    return frozenset(
        group.column(j).path_in_schema.split(".")[0]
        for j in range(group.num_columns)
        if group.column(j).has_dictionary_page
    )


def leaf_values(group: pq.RowGroupMetaData) -> dict[str, int]:
    """Values per top-level column of one row group (a list column: its items)."""
    counts: dict[str, int] = {}
    for j in range(group.num_columns):
        chunk = group.column(j)
        name = chunk.path_in_schema.split(".")[0]
        counts[name] = max(counts.get(name, 0), chunk.num_values)
    return counts


def leaf_range(group: pq.RowGroupMetaData, column: str) -> tuple[int, int] | None:
    """The least and greatest integer of a top-level column's values in one row group
    (a list column: its items), from the chunk's statistics; None where they were not
    written or are not integers."""
    for j in range(group.num_columns):
        chunk = group.column(j)
        if chunk.path_in_schema.split(".")[0] != column:
            continue
        stats = chunk.statistics
        if stats is None or not stats.has_min_max:
            return None
        low, high = stats.min, stats.max
        if isinstance(low, bool) or not isinstance(low, int) or not isinstance(high, int):
            return None
        return low, high
    return None
