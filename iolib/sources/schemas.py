"""One schema for a dataset of many Parquet files, and what a column may hold.

Why at planning time: with `columns=None`, files whose schemas drifted (a column added
later, a type changed) made batches change keys from one file to the next, or failed
under shuffle with a bare "Schema at index 2 was different" naming no file. The
footers are read before the first batch anyway, so the dataset's schema is settled
there: the union of the files' columns, each with the type of the first file that has
it. A file that lacks a column others have is filled with nulls where the column can
hold them (strings, bytes, lists: None, or an empty list); numbers and booleans cannot
(a tensor has no null), nor can a column of another type: such a file *drifted* and
its row groups are refused, naming it (skipped and counted under on_error="skip").

>>> a = pa.schema([("id", pa.int64()), ("text", pa.string())])
>>> b = pa.schema([("id", pa.int64())])
>>> unified_schema([a, b], None).names, drifted([a, b], unified_schema([a, b], None))
(['id', 'text'], {})
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def unified_schema(schemas: list[pa.Schema], columns: list[str] | None) -> pa.Schema:
    """The dataset's schema: the projected `columns` (typed as the first file that has
    each), else every file's columns in order of first appearance."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema:
            fields.setdefault(field.name, field)
    names = columns if columns is not None else list(fields)
    return pa.schema([fields[name] for name in names if name in fields])


def fillable(kind: pa.DataType) -> bool:
    """Can a file that lacks this column get nulls in it (no tensor needs it whole)?"""
    return not (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    )


def drifted(schemas: list[pa.Schema], unified: pa.Schema) -> dict[int, str]:
    """File position -> what differs, for files that cannot join the dataset's schema."""
    out: dict[int, str] = {}
    for position, schema in enumerate(schemas):
        problems = []
        for field in unified:
            if field.name not in schema.names:
                if not fillable(field.type):
                    problems.append(f"lacks {field.name!r} ({field.type}, which cannot be null)")
            elif not schema.field(field.name).type.equals(field.type):
                found = schema.field(field.name).type
                problems.append(f"{field.name!r} is {found}, expected {field.type}")
        if problems:
            out[position] = "; ".join(problems)
    return out


def conform(table: pa.Table, unified: pa.Schema) -> pa.Table:
    """`table` with the dataset's columns in the dataset's order; a column the file lacks
    (a fillable one: see `drifted`) as nulls."""
    if table.schema.names == unified.names:
        return table
    columns = [
        table.column(f.name) if f.name in table.schema.names else pa.nulls(table.num_rows, f.type)
        for f in unified
    ]
    return pa.Table.from_arrays(columns, names=unified.names)


def null_numbers(table: pa.Table) -> dict[str, np.ndarray]:
    """Row positions of nulls in number and boolean columns, by column: values that no
    tensor can hold (a null label is not a 0)."""
    out: dict[str, np.ndarray] = {}
    for name in table.column_names:
        column = table.column(name)
        if column.null_count and not fillable(column.type):
            mask = column.is_null().to_numpy(zero_copy_only=False)
            out[name] = np.flatnonzero(mask)
    return out
