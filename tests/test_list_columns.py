"""Variable-length numeric list columns (token ids) become tensors: padded with a mask and
lengths, jagged, or values + offsets; bad lists fail naming the file and row group."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from iolib import DataLoader
from iolib.collate import ListFormat, collate_table
from iolib.errors import ConfigError, DataError
from iolib.sources import ParquetSource
from iolib.testing import assert_checkpoint_roundtrip, assert_same_batches_across_workers
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
