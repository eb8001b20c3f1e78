"""TokenBudgetBatches: every row once per epoch, no batch over its token budget, the same
batch count every epoch and on every rank, deterministic and resumable."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, SequentialSampler

from iolib import DataLoader
from iolib.errors import ConfigError, DataError
from iolib.loader.testing import (
    assert_checkpoint_roundtrip,
    assert_same_batches_across_workers,
    epoch_batches,
)
from iolib.text import TokenBudgetBatches
from iolib.text.budget import batch_count, budget_cuts
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
    # A row longer than a quantile step once left two cuts equal (an empty batch).
    lengths = np.array([1, 3, 1, 1])
    assert budget_cuts(lengths, batch_count(lengths, 5)).tolist() == [0, 2, 3, 4]


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 4096).flatmap(
        lambda budget: st.tuples(
            st.just(budget),
            # Zeros (empty and null rows) and rows truncated to the budget, as real data.
            st.lists(
                st.one_of(st.integers(0, budget), st.just(0), st.just(budget)),
                min_size=1,
                max_size=300,
            ),
        )
    )
)
def test_cuts_strictly_increase_and_keep_every_batch_within_budget(case) -> None:
    """Any lengths in any order, any budget: every batch holds >= 1 token and <=
    max_tokens, and every row lies in exactly one batch."""
    budget, lengths = case
    lengths = np.array(lengths, dtype=np.int64)
    batches = batch_count(lengths, budget)
    assert batches <= np.count_nonzero(lengths)
    if batches == 0:
        assert not lengths.any()
        return
    cuts = budget_cuts(lengths, batches)
    assert cuts[0] == 0 and cuts[-1] == lengths.size and cuts.size == batches + 1
    assert (np.diff(cuts) >= 1).all(), cuts
    sums = np.add.reduceat(lengths, cuts[:-1])
    assert (sums >= 1).all(), (sums, lengths.tolist())
    assert (sums <= budget).all(), (sums, budget)


def test_a_row_without_tokens_never_makes_a_batch_of_its_own() -> None:
    """Rows truncated to max_tokens next to empty rows once gave batches of (1, 0)."""
    lengths = np.array([5, 5, 0])
    assert batch_count(lengths, 3 + 2) == 2
    assert budget_cuts(lengths, 2).tolist() == [0, 1, 3]  # the empty row rides with a 5
    assert budget_cuts(np.array([0, 0, 5, 0, 5, 0]), 2).tolist() == [0, 4, 6]
    with pytest.raises(ValueError, match="3 budget batches of 2 rows holding tokens"):
        budget_cuts(lengths, 3)
    assert batch_count(np.zeros(4, np.int64), 8) == 0


@pytest.mark.parametrize("shuffle", [False, True])
def test_truncated_rows_and_empty_rows_give_no_batch_without_a_token(tmp_path, shuffle) -> None:
    """Rows truncated to max_tokens with ~5% empty and null rows (the case that gave
    input_ids (1, 0) and a NaN loss): every batch holds a token, every row once, the
    empty rows counted."""
    rng = np.random.default_rng(7)
    lengths = np.minimum(rng.integers(1, 90, 400), 48)
    lengths[rng.random(lengths.size) < 0.05] = 0
    nulls = tuple(int(d) for d in rng.choice(np.flatnonzero(lengths), 4, replace=False))
    lengths[list(nulls)] = 0
    url = write_documents(tmp_path / "r", lengths, row_group_size=32, nulls=nulls)
    source = TokenBudgetBatches(url, column="tokens", max_tokens=48)
    assert source.empty_rows == int((lengths == 0).sum()) > 4
    loader = DataLoader(source, batch_size=1, shuffle=shuffle, seed=2)
    for epoch in (0, 1):
        batches = epoch_batches(loader, epoch)
        assert len(batches) == np.count_nonzero(lengths)  # one long row a batch
        for b in batches:
            tokens = int(b["tokens_lengths"].sum())
            assert tokens >= 1 and tokens <= 48, b["id"]
            assert b["tokens"].shape[1] >= 1
        ids = np.concatenate([b["id"] for b in batches])
        assert sorted(ids.tolist()) == list(range(lengths.size))


def test_data_without_any_token_makes_no_batch(tmp_path) -> None:
    url = write_documents(tmp_path / "r", np.zeros(6, np.int64), shards=1)
    source = TokenBudgetBatches(url, column="tokens", max_tokens=8)
    assert len(source) == 0 and source.empty_rows == 6


def test_no_epoch_yields_an_empty_batch_on_log_normal_rows(tmp_path) -> None:
    """Log-normal lengths (as real fine-tuning data): every batch of every epoch has rows."""
    lengths = np.clip(np.random.default_rng(5).lognormal(4, 1.2, 600).astype(int), 1, 900)
    url = write_documents(tmp_path / "r", lengths, row_group_size=64)
    source = TokenBudgetBatches(url, column="tokens", max_tokens=1024)
    loader = DataLoader(source, batch_size=1, shuffle=True, seed=1)
    for epoch in range(4):
        batches = epoch_batches(loader, epoch)
        sizes = [len(b["id"]) for b in batches]
        assert min(sizes) >= 1, f"epoch {epoch}: an empty batch"
        assert sum(sizes) == lengths.size
        assert all(int(b["tokens_lengths"].sum()) <= 1024 for b in batches)


@pytest.mark.parametrize(
    ("options", "found"),
    [
        ({"batch_size": 2}, "batch_size=2"),
        ({"batch_size": 8, "drop_last": True}, "batch_size=8"),
        ({"batch_size": None}, "batch_size=None"),
        ({"batch_sampler": BatchSampler(SequentialSampler(range(4)), 2, False)}, "batch_sampler"),
    ],
)
def test_the_loader_refuses_to_group_budget_batches(rows, options, found) -> None:
    """Grouping budget batches breaks the budget: refused when the loader is built."""
    source = TokenBudgetBatches(rows, column="tokens", max_tokens=BUDGET)
    with pytest.raises(ConfigError, match=rf"`batch_size` must be 1.*Found: .*{found}"):
        DataLoader(source, **options)
    assert len(DataLoader(source, batch_size=1)) == len(source)  # the documented use stays


def test_a_row_over_budget_is_an_error_naming_its_file(tmp_path) -> None:
    url = write_documents(tmp_path / "r", np.array([3, 300, 4]), shards=1)
    with pytest.raises(DataError, match=r"part-0\.parquet.*300 tokens.*max_tokens=200"):
        len(TokenBudgetBatches(url, column="tokens", max_tokens=BUDGET))


WIDE = doc_lengths(400, seed=2, low=1, high=60)
WINDOW = 8_710  # what a 40,000-byte cache gave before the window was its own argument


@pytest.fixture
def wide(tmp_path) -> str:
    return write_documents(tmp_path / "w", WIDE, shards=2, row_group_size=10)


def _groups_per_stretch(url: str, window: int, stretch: int = 8) -> list[int]:
    """Row groups read by each run of `stretch` consecutive batches of one epoch."""
    source = TokenBudgetBatches(url, column="tokens", max_tokens=BUDGET, shuffle_window=window)
    starts = source.rows.row_starts()
    batches = epoch_batches(DataLoader(source, batch_size=1, shuffle=True, seed=4), 1)
    groups = [set(np.searchsorted(starts, b["id"], side="right").tolist()) for b in batches]
    return [len(set().union(*groups[k : k + stretch])) for k in range(len(groups) - stretch)]


def test_data_larger_than_the_cache_reads_a_few_row_groups_at_a_time(wide, caplog) -> None:
    caplog.set_level("INFO", logger="iolib")
    windowed = _groups_per_stretch(wide, WINDOW)
    assert "larger than shuffle_window" in caplog.text
    whole = _groups_per_stretch(wide, 1 << 30)
    # Windowed, a stretch reads one chunk's row groups, at a block's edge up to four.
    assert np.median(windowed) < 0.6 * np.median(whole), (windowed, whole)
    assert max(windowed) < max(whole)


def test_windowed_budget_batches_keep_every_guarantee(wide) -> None:
    def make(**kw):
        source = TokenBudgetBatches(
            wide, column="tokens", max_tokens=BUDGET, cache_bytes=40_000, shuffle_window=WINDOW
        )
        return DataLoader(source, batch_size=1, shuffle=True, seed=kw.pop("seed", 3), **kw)

    for epoch in (0, 1):
        batches = epoch_batches(make(), epoch)
        ids = np.concatenate([b["id"] for b in batches])
        assert sorted(ids.tolist()) == list(range(len(WIDE)))  # every row once
        assert all(int(b["tokens_lengths"].sum()) <= BUDGET for b in batches)
    workers = ({"num_workers": 0}, {"num_workers": 2}, {"num_workers": 2, "worker_mode": "process"})
    assert_same_batches_across_workers(make, workers, (0, 1))
    assert_checkpoint_roundtrip(make, stop_after=[3, 20], epoch=1, num_workers=2)
    counts = {len(epoch_batches(make(rank=r, world_size=3), 0)) for r in range(3)}
    assert len(counts) == 1


def test_a_cache_below_four_row_groups_is_refused(wide) -> None:
    source = TokenBudgetBatches(
        wide, column="tokens", max_tokens=BUDGET, cache_bytes=2_000, shuffle_window=1
    )
    with pytest.raises(ConfigError, match=r"`cache_bytes`=2000 holds fewer than 4"):
        len(DataLoader(source, batch_size=1, shuffle=True, seed=0))  # before any batch


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_reads_its_share_when_the_data_is_larger_than_the_cache(wide, world_size):
    """lanes="auto": rank r's batches come from a contiguous share of the epoch's chunks,
    so each rank reads about 1/world of the row groups; together every row once."""

    def make(rank: int) -> DataLoader:
        source = TokenBudgetBatches(
            wide, column="tokens", max_tokens=BUDGET, cache_bytes=40_000, shuffle_window=WINDOW
        )
        return DataLoader(source, batch_size=1, shuffle=True, seed=5, rank=rank,
                          world_size=world_size, drop_last=True)  # fmt: skip

    starts = make(0).dataset.rows.row_starts()
    groups, ids = [], []
    for rank in range(world_size):
        batches = epoch_batches(make(rank), 1)
        mine = np.concatenate([b["id"] for b in batches])
        ids += mine.tolist()
        groups.append(set(np.searchsorted(starts, mine, side="right").tolist()))
    assert len(ids) == len(set(ids))  # no row twice across ranks
    total = starts.size - 1
    assert len(ids) >= 0.95 * len(WIDE)  # drop_last leaves out a few batches only
    for mine in groups:
        assert len(mine) <= total / world_size + total / 4, (len(mine), total)
