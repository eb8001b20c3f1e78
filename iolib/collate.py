"""Turning what a source read into a batch.

Columnar sources (Parquet, image folders) are collated column by column straight from
Arrow: a fixed-size list of int32 becomes one [batch, length] tensor with one copy and
no Python per sample; a variable-length list of numbers becomes a padded tensor (or a
jagged one) as its `ListFormat` says (docs/tokens.md). Row sources go through torch's
``default_collate`` (or the user's ``collate_fn``), as in torch.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import default_collate

from iolib.errors import ConfigError, DataError

LIST_LAYOUTS = ("padded", "jagged", "offsets")
# Schema metadata key under which a source tells collate how to batch its list columns:
# the table carries its own format, so workers need no other channel.
LIST_FORMAT_KEY = b"iolib.list_format"


@dataclass(frozen=True)
class ListFormat:
    """How a variable-length list column of numbers (token ids) becomes tensors.

    For a column ``x``, every layout gives ``x_lengths`` (int64 [B]: items per row) and:

    - ``"padded"`` (default): ``x`` [B, L] of the column's dtype, rows right-padded with
      `pad_id` to the batch's longest row, L rounded up to `pad_to_multiple` (tensor
      cores like multiples of 8; a fixed L keeps compiled kernels from re-tracing);
      with `mask`, ``x_mask`` bool [B, L], True on real items. Costs B*L, not the sum
      of lengths: pick it for short, similar rows.
    - ``"jagged"``: ``x`` a ``torch.nested`` tensor with ``layout=torch.jagged`` ([B, j]),
      no padding; for models that take nested tensors (SDPA, nn.Linear do).
    - ``"offsets"``: ``x`` the values, 1-D [sum of lengths], and ``x_offsets`` int64 [B+1]
      (row b is ``x[offsets[b]:offsets[b+1]]``): what variable-length attention
      kernels (``cu_seqlens``) and embedding bags take.

    A null row counts as an empty one (length 0). A null item inside a row is an error.
    `pad_id` must be finite and fit the column's type (an integer in range for integer
    columns): a pad that would change on the way in (0.5 -> 0, NaN -> -2**31) is refused.
    A column named like a key a list column adds (``x_mask`` beside ``x``) is refused.

    Example::

        ParquetSource("s3://bucket/sft/*.parquet", columns=["input_ids"],
                      lists=ListFormat(pad_id=tokenizer.pad_token_id, pad_to_multiple=64))
    """

    layout: Literal["padded", "jagged", "offsets"] = "padded"
    pad_id: int | float = 0
    pad_to_multiple: int = 1
    mask: bool = True

    def __post_init__(self) -> None:
        if self.layout not in LIST_LAYOUTS:
            raise ConfigError(f"`layout` must be one of {LIST_LAYOUTS}. Found: {self.layout!r}.")
        multiple = self.pad_to_multiple
        if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
            raise ConfigError(f"`pad_to_multiple` must be an integer >= 1. Found: {multiple!r}.")
        pad = self.pad_id
        if isinstance(pad, bool) or not isinstance(pad, numbers.Real):
            raise ConfigError(
                f"`pad_id` must be a number (a token id, e.g. tokenizer.pad_token_id). "
                f"Found: {pad!r}."
            )
        if not isinstance(pad, numbers.Integral) and not math.isfinite(pad):
            raise ConfigError(
                f"`pad_id` must be a finite number: NaN or infinity cannot pad an integer "
                f"column, and the mask already marks padding. Found: {pad!r}."
            )
        # numpy scalars (a tokenizer's id) become Python numbers: the format travels as JSON.
        object.__setattr__(
            self, "pad_id", int(pad) if isinstance(pad, numbers.Integral) else float(pad)
        )
        if not isinstance(self.mask, bool):
            raise ConfigError(f"`mask` must be True or False. Found: {self.mask!r}.")

    def check_column(self, name: str, kind: pa.DataType) -> None:
        """Refuse a `pad_id` that list column `name` of type `kind` cannot hold (0.5 or
        2**40 in an int32 column, -1 in a uint16 one), naming the column and its range."""
        if self.layout != "padded" or not is_numeric_list(kind):
            return
        dtype = np.dtype(kind.value_type.to_pandas_dtype())
        pad = self.pad_id
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            if (isinstance(pad, int) or pad.is_integer()) and info.min <= pad <= info.max:
                return
            rule = f"an integer in {info.min}..{info.max}"
        else:
            if abs(pad) <= float(np.finfo(dtype).max):
                return
            rule = f"a number within +-{float(np.finfo(dtype).max):g}"
        raise ConfigError(
            f"`pad_id` cannot pad list column {name!r} of {kind.value_type}: it must be "
            f"{rule}. Found: {pad!r}. Pick a token id the model ignores (e.g. "
            "tokenizer.pad_token_id) in ListFormat(pad_id=...)."
        )

    def tag(self, table: pa.Table) -> pa.Table:
        """`table` carrying this format in its schema metadata (no copy of the data)."""
        metadata = dict(table.schema.metadata or {})
        metadata[LIST_FORMAT_KEY] = json.dumps(asdict(self)).encode()
        return table.replace_schema_metadata(metadata)

    @classmethod
    def of(cls, table: pa.Table) -> ListFormat:
        """The format `table` carries, else the default."""
        raw = (table.schema.metadata or {}).get(LIST_FORMAT_KEY)
        return cls(**json.loads(raw)) if raw else cls()


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def is_numeric_list(kind: pa.DataType) -> bool:
    """A variable-length list of numbers (list or large_list): what ListFormat batches."""
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and _numeric(kind.value_type)


def list_companions(name: str) -> tuple[str, ...]:
    """The keys that come with list column `name` in a batch (whichever the layout makes)."""
    return (f"{name}_mask", f"{name}_lengths", f"{name}_offsets")


def check_companions(schema: pa.Schema) -> None:
    """Refuse a column named like a key a list column brings (``x_mask``, ``x_lengths``,
    ``x_offsets`` for list column ``x``): one would silently replace the other."""
    names = set(schema.names)
    for field in schema:
        if not is_numeric_list(field.type):
            continue
        taken = [key for key in list_companions(field.name) if key in names]
        if taken:
            raise DataError(
                f"Column {taken[0]!r} has the name of a key iolib adds for list column "
                f"{field.name!r} ({', '.join(list_companions(field.name))}), and one would "
                f"replace the other in the batch. Rename {taken[0]!r} when writing the data, "
                "or leave it out of the source's `columns`."
            )


def _list_values(name: str, column: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """(values, lengths) of a list column: null rows are empty; no Python per item."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    values = array.flatten()  # honours slicing and skips what null rows hide
    if values.null_count:
        raise DataError(
            f"Column {name!r} holds null items inside its lists: a tensor cannot hold them. "
            "Drop or fill them when writing the data (null rows are read as empty lists)."
        )
    if array.null_count == 0:  # lengths from the offsets: no kernel call
        offsets = array.offsets.to_numpy()
        return values, np.diff(offsets).astype(np.int64, copy=False)
    lengths = pc.list_value_length(array).fill_null(0).to_numpy(zero_copy_only=False)
    return values, lengths.astype(np.int64, copy=False)


def _collate_list(name: str, column: pa.ChunkedArray, fmt: ListFormat) -> dict[str, Any]:
    """The tensors of one variable-length numeric list column (see ListFormat)."""
    fmt.check_column(name, column.type)
    values, lengths = _list_values(name, column)
    out: dict[str, Any] = {}
    if fmt.layout != "padded":
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # The values share the batch table's memory (a fresh copy owned by this batch).
        flat = torch.from_dlpack(values) if len(values) else torch.from_numpy(values.to_numpy())
        if fmt.layout == "offsets":
            out[name], out[f"{name}_offsets"] = flat, torch.from_numpy(offsets)
        else:
            out[name] = torch.nested.nested_tensor_from_jagged(
                flat, offsets=torch.from_numpy(offsets)
            )
    else:
        longest = int(lengths.max(initial=0))
        width = -(-longest // fmt.pad_to_multiple) * fmt.pad_to_multiple
        mask = np.arange(width) < lengths[:, None]
        items = values.to_numpy(zero_copy_only=False)
        padded = np.full((len(lengths), width), fmt.pad_id, dtype=items.dtype)
        padded[mask] = items  # the mask's row-major order is the order of the values
        out[name] = torch.from_numpy(padded)
        if fmt.mask:
            out[f"{name}_mask"] = torch.from_numpy(mask)
    out[f"{name}_lengths"] = torch.from_numpy(lengths)
    return out


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
            # The child's rows under this slice, not flatten() (~50 us a column).
            size = kind.list_size
            values = array.values.slice(array.offset * size, len(array) * size)
            return torch.from_dlpack(values).view(len(array), size)
    return column.to_pylist()  # binary -> bytes, string -> str, nested -> lists


def collate_table(table: pa.Table) -> dict[str, Any]:
    """A dict of column name -> tensor (numbers, fixed-size lists), tensors of a
    variable-length numeric list (as the table's `ListFormat` says, with their
    ``_lengths``/``_mask``/``_offsets`` keys), or list (anything else)."""
    batch: dict[str, Any] = {}
    fmt: ListFormat | None = None
    for name in table.column_names:
        column = table.column(name)
        if is_numeric_list(column.type):
            if fmt is None:  # only a list column brings companion keys
                check_companions(table.schema)
                fmt = ListFormat.of(table)
            batch.update(_collate_list(name, column, fmt))
        else:
            batch[name] = _column_to_value(column)
    return batch


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
        if batch.is_nested:  # a jagged tensor: its values and offsets
            return batch_nbytes(batch.values()) + batch_nbytes(batch.offsets())
        return batch.nbytes  # element_size() * nelement(), in one call
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
