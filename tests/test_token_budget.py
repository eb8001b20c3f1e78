"""TokenBudgetBatches: every row once per epoch, no batch over its token budget, the same
batch count every epoch and on every rank, deterministic and resumable."""

from __future__ import annotations

import numpy as np
import pytest

from iolib import DataLoader
from iolib.errors import DataError
from iolib.testing import (
    assert_checkpoint_roundtrip,
    assert_same_batches_across_workers,
    epoch_batches,
)
from iolib.text import TokenBudgetBatches
from iolib.text.budget import budget_cuts
from tests.token_data import doc_lengths, write_documents

LENGTHS = doc_lengths(90, low=1, high=60)
BUDGET = 200


@pytest.fixture
def rows(tmp_path) -> str:
    return write_documents(tmp_path / "r", LENGTHS, row_group_size=16)


def _loader(url: str, **kw) -> DataLoader:
    source = TokenBudgetBatches(url, column="tokens", max_tokens=BUDGET)
    return DataLoader(source, batch_size=1, seed=kw.pop("seed", 3), **kw)


def test_every_row_once_and_no_batch_over_budget(rows) -> None:
    loader = _loader(rows, shuffle=True)
    firsts = []
    for epoch in (0, 1):
        batches = epoch_batches(loader, epoch)
        assert len(batches) == len(loader)  # the same count every epoch
        ids = np.concatenate([b["id"] for b in batches])
        assert sorted(ids.tolist()) == list(range(len(LENGTHS)))
        for b in batches:
            assert b["tokens_lengths"].tolist() == LENGTHS[b["id"]].tolist()
            assert b["tokens_lengths"].sum() <= BUDGET
        firsts.append([b["id"].tolist() for b in batches])
    assert firsts[0] != firsts[1]
    # Length-sorted buckets: padding stays small against random batches of the same rows.
    padded = sum(b["tokens"].size for b in batches)
    assert padded < 1.5 * LENGTHS.sum()


def test_deterministic_resumable_and_equal_across_ranks(rows) -> None:
    def make(**kw):
        return _loader(rows, shuffle=True, **kw)

    assert_same_batches_across_workers(make, ({"num_workers": 0}, {"num_workers": 2}), (0, 1))
    assert_checkpoint_roundtrip(make, stop_after=[2], epoch=1, num_workers=2)
    whole = [b["id"].tolist() for b in epoch_batches(make(), 1)]
    for size in (2, 3):
        ranks = [epoch_batches(make(rank=r, world_size=size), 1) for r in range(size)]
        assert len({len(r) for r in ranks}) == 1
        merged = [b["id"].tolist() for step in zip(*ranks, strict=True) for b in step]
        assert merged[: len(whole)] == whole  # the tail step is padded with repeats


def test_cuts_split_at_token_quantiles() -> None:
    assert budget_cuts(np.array([4, 4, 4, 4]), 2).tolist() == [0, 2, 4]
    cuts = budget_cuts(np.array([50, 1, 1, 1]), 3)  # a long row: no batch left empty
    assert cuts.tolist() == [0, 1, 2, 4] and (np.diff(cuts) > 0).all()


def test_a_row_over_budget_is_an_error_naming_its_file(tmp_path) -> None:
    url = write_documents(tmp_path / "r", np.array([3, 300, 4]), shards=1)
    with pytest.raises(DataError, match=r"part-0\.parquet.*300 tokens.*max_tokens=200"):
        len(TokenBudgetBatches(url, column="tokens", max_tokens=BUDGET))
