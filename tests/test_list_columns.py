"""Variable-length numeric list columns (token ids) become tensors: padded with a mask and
lengths, jagged, or values + offsets; bad lists fail naming the file and row group."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from iolib import DataLoader
from iolib.collate import ListFormat, collate_table
from iolib.errors import ConfigError, DataError
from iolib.loader.testing import assert_checkpoint_roundtrip, assert_same_batches_across_workers
from iolib.sources import ParquetSource
from tests.token_data import doc_lengths, document, write_documents

LENGTHS = doc_lengths(60)


def _rows(batch_ids: torch.Tensor) -> list[np.ndarray]:
    return [document(int(d), int(LENGTHS[d])) for d in batch_ids]


@pytest.mark.parametrize("multiple", [1, 8])
def test_padded_batches_hold_each_row_then_pad_with_mask_and_lengths(tmp_path, multiple) -> None:
    url = write_documents(tmp_path / "d", LENGTHS)
    source = ParquetSource(url, lists=ListFormat(pad_id=-7, pad_to_multiple=multiple))
    for batch in DataLoader(source, batch_size=8, shuffle=True, seed=3):
        tokens, mask, lengths = batch["tokens"], batch["tokens_mask"], batch["tokens_lengths"]
        rows = _rows(batch["id"])
        assert tokens.dtype == torch.int32 and mask.dtype == torch.bool
        assert tokens.shape[1] % multiple == 0
        assert tokens.shape[1] < max(len(r) for r in rows) + multiple
        assert lengths.tolist() == [len(r) for r in rows]
        for row, want, m in zip(tokens.numpy(), rows, mask.numpy(), strict=True):
            assert row[: len(want)].tolist() == want.tolist()
            assert (row[len(want) :] == -7).all()
            assert m.sum() == len(want) and m[: len(want)].all()


def test_equal_lengths_stack_and_keys_stay_the_same(tmp_path) -> None:
    url = write_documents(tmp_path / "d", np.full(20, 5))
    batch = next(iter(DataLoader(ParquetSource(url), batch_size=4)))
    assert batch["tokens"].shape == (4, 5) and bool(batch["tokens_mask"].all())
    assert set(batch) == {"id", "tokens", "tokens_mask", "tokens_lengths"}


def test_jagged_and_offsets_layouts_hold_the_rows_unpadded(tmp_path) -> None:
    url = write_documents(tmp_path / "d", LENGTHS)
    jagged = ParquetSource(url, lists=ListFormat(layout="jagged"))
    flat = ParquetSource(url, lists=ListFormat(layout="offsets"))
    for a, b in zip(DataLoader(jagged, batch_size=8), DataLoader(flat, batch_size=8), strict=True):
        rows = _rows(a["id"])
        assert a["tokens"].is_nested and a["tokens"].layout == torch.jagged
        assert [t.tolist() for t in a["tokens"].unbind()] == [r.tolist() for r in rows]
        offsets = b["tokens_offsets"].tolist()
        assert offsets[0] == 0 and b["tokens"].numel() == offsets[-1] == sum(map(len, rows))
        for k, row in enumerate(rows):
            assert b["tokens"][offsets[k] : offsets[k + 1]].tolist() == row.tolist()


def test_null_rows_are_empty_and_null_items_fail_naming_file_and_row_group(tmp_path) -> None:
    url = write_documents(tmp_path / "n", LENGTHS[:20], nulls=(3,))
    batch = next(iter(DataLoader(ParquetSource(url), batch_size=20)))
    assert batch["tokens_lengths"][3] == 0 and not batch["tokens_mask"][3].any()
    bad = write_documents(tmp_path / "b", LENGTHS[:20], null_items=True)
    with pytest.raises(DataError, match=r"part-1\.parquet.*row group 0.*'tokens'.*null items"):
        list(DataLoader(ParquetSource(bad), batch_size=20))


def test_lists_of_strings_stay_python_lists() -> None:
    table = pa.table({"words": pa.array([["a"], ["b", "c"]])})
    assert collate_table(table)["words"] == [["a"], ["b", "c"]]


@pytest.mark.parametrize(
    "bad",
    [{"layout": "ragged"}, {"pad_to_multiple": 0}, {"pad_id": "x"}, {"pad_to_multiple": True}],
)
def test_list_format_rejects_bad_options(bad) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        ListFormat(**bad)


def test_padded_batches_are_deterministic_and_resumable(tmp_path) -> None:
    url = write_documents(tmp_path / "d", LENGTHS, row_group_size=8)

    def make(**kw):
        return DataLoader(ParquetSource(url), batch_size=7, shuffle="block", seed=5, **kw)

    settings = ({"num_workers": 0}, {"num_workers": 2, "prefetch": 3})
    assert_same_batches_across_workers(make, settings, epochs=(0, 1))
    assert_checkpoint_roundtrip(make, stop_after=[1, 4], num_workers=2)


@pytest.mark.parametrize("nulls", [(), (7,)])
def test_in_memory_list_store_reads_what_arrow_reads(tmp_path, nulls) -> None:
    url = write_documents(tmp_path / "d", LENGTHS, nulls=nulls, row_group_size=8)
    held = ParquetSource(url)
    held.fit_cache(1)  # tiny: the whole dataset is kept, lists as flat items + offsets
    arrow = ParquetSource(url, cache_bytes=2**26)
    rng = np.random.default_rng(0)
    for size in (1, 9, 60):
        indices = rng.permutation(60)[:size]
        assert held.read(indices).equals(arrow.read(indices))


def test_stages_get_a_list_column_with_its_mask_and_lengths(tmp_path) -> None:
    url = write_documents(tmp_path / "d", LENGTHS)
    loader = DataLoader(ParquetSource(url), batch_size=8, shuffle=True, seed=1)
    first = next(iter(loader.for_stage(0, 2, microbatches=2, inputs=["tokens"])))
    whole = next(iter(loader))
    assert [sorted(m) for m in first] == [["tokens", "tokens_lengths", "tokens_mask"]] * 2
    for key in ("tokens", "tokens_mask", "tokens_lengths"):
        assert torch.equal(torch.cat([m[key] for m in first]), whole[key])


_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16()]
_TYPES += [pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64()]


def _fits(pad: float, kind: pa.DataType) -> bool:
    """Whether `pad` is a value of `kind` (what the check must accept, and only that)."""
    dtype = np.dtype(kind.to_pandas_dtype())
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return float(pad).is_integer() and info.min <= pad <= info.max
    return abs(pad) <= float(np.finfo(dtype).max)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(_TYPES),
    pad=st.one_of(
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0.5, -1, 255, 256, 2**31, 2**63, -(2**63) - 1, 65504.0, 70000.0]),
    ),
)
def test_a_pad_id_either_pads_exactly_or_is_refused_naming_the_column(kind, pad) -> None:
    """No pad changes on its way into the tensor: NaN, 0.5 in an int column, values out of
    the column's range are refused (naming the column and its range), never cast."""
    if isinstance(pad, float) and not np.isfinite(pad):
        with pytest.raises(ConfigError, match=r"`pad_id` must be a finite number"):
            ListFormat(pad_id=pad)
        return
    fmt = ListFormat(pad_id=pad)
    table = fmt.tag(pa.table({"ids": pa.array([[1], [1, 2, 3]], pa.list_(kind))}))
    if not _fits(pad, kind):
        with pytest.raises(ConfigError, match=rf"list column 'ids' of {kind}.*Found: "):
            collate_table(table)
        return
    padded = collate_table(table)["ids"].numpy()
    assert padded[0, 1:].tolist() == np.full(2, pad, dtype=padded.dtype).tolist()
    if padded.dtype.kind in "iu":
        assert padded[0, 1] == pad  # exactly the id asked for


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pad_id_the_column_cannot_hold_fails_before_any_batch(tmp_path, workers) -> None:
    url = write_documents(tmp_path / "d", LENGTHS[:20])
    for pad in (0.5, 2**40, -(2**31) - 1):
        loader = DataLoader(ParquetSource(url, lists=ListFormat(pad_id=pad)), batch_size=4,
                            num_workers=workers)  # fmt: skip
        with pytest.raises(ConfigError, match=r"'tokens' of int32: it must be an integer in"):
            next(iter(loader))


@pytest.mark.parametrize(
    "bad",
    [{"mask": "no"}, {"mask": 1}, {"pad_id": None}, {"pad_id": True}, {"pad_id": [0]}],
)
def test_list_format_refuses_mask_and_pad_id_of_the_wrong_kind(bad) -> None:
    with pytest.raises(ConfigError, match=rf"`{next(iter(bad))}` must be"):
        ListFormat(**bad)


def test_a_numpy_pad_id_is_taken_as_its_number(tmp_path) -> None:
    fmt = ListFormat(pad_id=np.int64(7))
    assert fmt.pad_id == 7 and type(fmt.pad_id) is int  # travels in the schema as JSON
    table = fmt.tag(pa.table({"ids": pa.array([[1], [1, 2]], pa.list_(pa.int32()))}))
    assert ListFormat.of(table) == fmt


@pytest.mark.parametrize("suffix", ["mask", "lengths", "offsets"])
@pytest.mark.parametrize("layout", ["padded", "jagged", "offsets"])
@pytest.mark.parametrize("first", [True, False])
def test_a_user_column_named_like_a_list_key_is_refused_with_its_name(
    tmp_path, suffix, layout, first
) -> None:
    """`tokens_mask` beside `tokens` would replace (or be replaced by) the computed key,
    whichever column comes first: refused, naming the column to rename."""
    tokens = pa.array([[1, 2], [3]], pa.list_(pa.int32()))
    user = pa.array([9, 9], pa.int64())
    columns = {"tokens": tokens, f"tokens_{suffix}": user}
    if not first:
        columns = dict(reversed(columns.items()))
    pq.write_table(pa.table(columns), tmp_path / "c.parquet")
    source = ParquetSource(str(tmp_path / "c.parquet"), lists=ListFormat(layout=layout))
    with pytest.raises(DataError, match=rf"Rename 'tokens_{suffix}'"):
        next(iter(DataLoader(source, batch_size=2)))
    # Leaving the column out reads the list as before.
    kept = ParquetSource(str(tmp_path / "c.parquet"), ["tokens"], lists=ListFormat(layout=layout))
    assert next(iter(DataLoader(kept, batch_size=2)))["tokens_lengths"].tolist() == [2, 1]


def test_a_pad_id_the_column_cannot_hold_is_refused_before_any_batch(tmp_path) -> None:
    """At the first look at the files (len()), not in a worker's first batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iolib.collate import ListFormat
    from iolib.errors import ConfigError
    from iolib.sources import ParquetSource

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"ids": pa.array([[1, 2], [3]], pa.list_(pa.int16()))}), path)
    source = ParquetSource(str(path), lists=ListFormat(pad_id=2**20))
    with pytest.raises(ConfigError, match="ids"):
        len(source)
