"""What `PackedTokens` refuses up front, each with a message that names the fix: its
arguments, its token column, and a cache too small for the order it reads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from iolib.errors import ConfigError, DataError
from iolib.plan import window_groups
from iolib.sources import leaf_range

MIN_GROUPS_HELD = 4  # two chunks of two row groups: this one, and the next read ahead


def check_arguments(seq_len: Any, eos_id: Any, ignore_index: Any, seed: Any) -> None:
    """`seq_len` and `eos_id` are integers (seq_len >= 1), and `check_ignore_index_and_seed`."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ConfigError(f"`seq_len` must be an integer >= 1. Found: {seq_len!r}.")
    if isinstance(eos_id, bool) or not isinstance(eos_id, (int, np.integer)):
        raise ConfigError(f"`eos_id` must be an integer token id. Found: {eos_id!r}.")
    check_ignore_index_and_seed(ignore_index, seed)


def segment_bytes(index: Any, kind: pa.DataType, narrow: np.ndarray | None = None) -> np.ndarray:
    """Memory of each row group's segment (a `TokenIndex`'s counts, the column's list
    type): its tokens as held, 24 bytes a document (`Segment`). Tokens are held as the
    column's type, or as uint16 in the row groups `narrow` marks (`narrow_groups`)."""
    itemsize = np.full(index.tokens.size, _itemsize(kind), dtype=np.int64)
    if narrow is not None:
        itemsize[narrow] = 2
    return index.tokens * itemsize + 24 * index.documents + 8


def _itemsize(kind: pa.DataType) -> int:
    return np.dtype(kind.value_type.to_pandas_dtype()).itemsize


def narrow_type(kind: pa.DataType) -> pa.DataType | None:
    """The type a token column of `kind` is decoded as where every id fits uint16 (a
    vocabulary under 65,536, GPT-2's among them): half an int32 column's memory, a
    quarter of an int64's, for a cast as each record batch is decoded. The batches
    are the same (the cut writes int64). None: ids of 2 bytes or fewer already."""
    if _itemsize(kind) <= 2:
        return None
    if pa.types.is_large_list(kind):
        return pa.large_list(pa.uint16())
    return pa.list_(pa.uint16())


def narrow_groups(source: Any, column: str, kind: pa.DataType) -> np.ndarray:
    """Row groups of a `ParquetSource` read as `narrow_type`: those whose footer
    statistics bound every id of `column` within uint16 (none where they were not
    written: a read decides nothing later, so the plan's sizes are the sizes held)."""
    fits = []
    for f in source.files:
        for local in range(len(f.row_groups)):
            bounds = leaf_range(f.group_meta(local), column)
            fits.append(bounds is not None and bounds[0] >= 0 and bounds[1] <= 0xFFFF)
    return np.array(fits, dtype=bool) & (narrow_type(kind) is not None)


def check_ignore_index_and_seed(ignore_index: Any, seed: Any) -> None:
    """Refuse at construction what would fail, or wrap, at the first batch: labels are
    int64, and seeds feed NumPy's SeedSequence (non-negative)."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise ConfigError(
            f"`ignore_index` must be an integer label (torch's default is -100). "
            f"Found: {ignore_index!r}."
        )
    if not -(2**63) <= int(ignore_index) < 2**63:
        raise ConfigError(f"`ignore_index` must fit int64 labels. Found: {ignore_index!r}.")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) < 0:
        raise ConfigError(f"`seed` must be an integer >= 0. Found: {seed!r}.")


def check_column(kind: pa.DataType, column: str, eos_id: int, where: str) -> None:
    """The token column must hold lists of integer ids that int64 holds, and eos_id must
    fit them (`where`: the data, for the message)."""
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if not (is_list and pa.types.is_integer(kind.value_type)):
        raise DataError(
            f"Column {column!r} of {where} is {kind}: "
            "PackedTokens needs a list of integer token ids (list<int32>, list<int64>...)."
        )
    if pa.types.is_uint64(kind.value_type):
        raise DataError(
            f"Column {column!r} of {where} holds uint64 token "
            "ids, which int64 tensors cannot hold above 2^63 - 1. Write the ids as int64 "
            "or int32 (every tokenizer's vocabulary fits)."
        )
    info = np.iinfo(np.dtype(kind.value_type.to_pandas_dtype()))
    if not info.min <= eos_id <= info.max:
        raise ConfigError(
            f"`eos_id` {eos_id} does not fit the column's {kind.value_type} "
            f"({info.min}..{info.max}). Use the tokenizer's end-of-document id."
        )


def cache_need(sizes: np.ndarray, column: str, shuffle_window: int) -> tuple[int, str]:
    """(bytes, why): what the order reads together, the least cache that runs: four of
    the largest row groups (decoded `sizes`), and two chunks of the shuffle window (or
    the whole corpus and three row groups, where it fits the window)."""
    largest = int(sizes.max(initial=0))
    need, why = (
        MIN_GROUPS_HELD * largest,
        (
            f"fewer than {MIN_GROUPS_HELD} of the largest row groups of {column!r} "
            f"({largest:,} bytes decoded): a chunk of two and the next one, read while this "
            "one is cut"
        ),
    )
    groups = window_groups(sizes, shuffle_window)
    chunks = 2 * (groups or 0) * largest
    whole = int(sizes.sum()) + (MIN_GROUPS_HELD - 1) * largest
    if groups is not None and chunks > need:
        need, why = (
            chunks,
            (
                f"less than two chunks of shuffle_window={shuffle_window} ({groups} row "
                f"groups each, {chunks:,} bytes decoded: this one and the next, read ahead)"
            ),
        )
    elif groups is None and whole > need:
        need, why = (
            whole,
            (
                f"less than the corpus, which fits shuffle_window={shuffle_window} and "
                f"is shuffled whole ({whole:,} bytes decoded with three row groups in flight)"
            ),
        )
    return need, why


def check_budget(
    sizes: np.ndarray,
    column: str,
    shuffle_window: int,
    cache_bytes: int,
    where: str,
    *,
    given: bool = True,
) -> None:
    """Refuse a cache smaller than `cache_need`; the message names both sizes, and says
    so where the user passed none (`given=False`: the default's ceiling ran short)."""
    need, why = cache_need(sizes, column, shuffle_window)
    if need <= cache_bytes:
        return
    largest = int(sizes.max(initial=0))
    smaller = min(cache_bytes // 2, int(sizes.sum()) - 1)
    lower = (
        f", or lower shuffle_window to {smaller} or less (the order follows "
        "shuffle_window, never cache_bytes)"
        if MIN_GROUPS_HELD * largest <= cache_bytes and smaller > 0
        else " or write the data with smaller row groups"
    )
    held = (
        f"`cache_bytes`={cache_bytes}"
        if given
        else (f"`cache_bytes` (not given; its default is at most {cache_bytes})")
    )
    raise ConfigError(
        f"{where}: {held} holds {why}. Raise `cache_bytes` to at least {need}{lower}."
    )


@contextlib.contextmanager
def named_column() -> Iterator[None]:
    """A missing column is PackedTokens' `column` argument, not ParquetSource's `columns`."""
    try:
        yield
    except DataError as exc:
        if "Fix `columns`." not in str(exc):
            raise
        raise DataError(str(exc).replace("Fix `columns`.", "Fix `column`.")) from None
