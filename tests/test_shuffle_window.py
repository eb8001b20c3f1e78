"""The shuffle window is its own argument (issue 42): `shuffle_window` sets the order of
`PackedTokens`, `TokenBudgetBatches` and `ParquetSource`, and `cache_bytes` bounds memory
only. Batches are the same, bit for bit, at any `cache_bytes` that runs, a checkpoint
resumes under another one, and a cache too small for the window is refused up front,
naming both sizes."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.errors import ConfigError, StateError
from iolib.loader.testing import assert_batches_equal, epoch_batches, to_numpy_tree
from iolib.sources import ParquetSource
from iolib.text import PackedTokens, TokenBudgetBatches
from tests.token_data import doc_lengths, write_documents

SEQ = 16


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("window")
    docs = write_documents(root / "docs", doc_lengths(400, seed=3, high=60), shards=3,
                           row_group_size=16)  # fmt: skip
    wide = write_documents(root / "wide", doc_lengths(400, seed=2, high=60), shards=2,
                           row_group_size=10)  # fmt: skip
    rows = root / "rows"
    rows.mkdir()
    table = pa.table({"id": np.arange(4000), "x": np.random.default_rng(0).random(4000)})
    pq.write_table(table, rows / "a.parquet", row_group_size=100)
    return {"docs": docs, "wide": wide, "rows": str(rows)}


def packed(data: dict[str, str], cache: int | None) -> DataLoader:
    # ~10 KB windows of a ~64 KB corpus: chunks of about three of its 25 row groups.
    source = PackedTokens(data["docs"], column="tokens", seq_len=SEQ, eos_id=0,
                          document_ids=True, shuffle_window=10_000, cache_bytes=cache)  # fmt: skip
    return DataLoader(source, batch_size=4, shuffle=True, seed=11)


def budget(data: dict[str, str], cache: int | None) -> DataLoader:
    source = TokenBudgetBatches(data["wide"], column="tokens", max_tokens=200,
                                shuffle_window="8KiB", cache_bytes=cache)  # fmt: skip
    return DataLoader(source, batch_size=1, shuffle=True, seed=3)


def parquet(data: dict[str, str], cache: int | None) -> DataLoader:
    source = ParquetSource(data["rows"], shuffle_window=4 * 1700, cache_bytes=cache)
    return DataLoader(source, batch_size=50, shuffle=True, seed=1)


MAKERS: dict[str, tuple[Callable[..., DataLoader], tuple[int | None, ...]]] = {
    # Three caches that run: the smallest that holds two windows, a larger one, and one
    # that holds everything (None: the default, or the loader's sizing for Parquet).
    "packed": (packed, (20_000, 35_000, None)),
    "budget": (budget, (24_000, 60_000, None)),
    "parquet": (parquet, (8 * 1700, 20 * 1700, None)),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_same_batches_at_any_cache_bytes_and_a_resume_across_them(data, name) -> None:
    make, caches = MAKERS[name]
    first = make(data, caches[0])
    reference = {e: epoch_batches(first, e) for e in (0, 1)}
    for cache in caches[1:]:
        for epoch in (0, 1):
            assert_batches_equal(reference[epoch], epoch_batches(make(data, cache), epoch), name)
    # A checkpoint taken under one cache resumes under each other one.
    for saved, restored in [(caches[0], caches[2]), (caches[2], caches[1])]:
        stopped = make(data, saved)
        stopped.set_epoch(1)
        it = iter(stopped)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(stopped.state_dict()))
        resumed = make(data, restored)
        resumed.load_state_dict(state)
        rest = [to_numpy_tree(b) for b in resumed]
        assert_batches_equal(reference[1][3:], rest, f"{name} resumed {saved} -> {restored}")


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_window_not_the_cache_moves_the_order(data, name) -> None:
    """A cache that holds everything does not widen the shuffle: the window does (so the
    windowed batches above are not a full shuffle that happens to match)."""
    make, caches = MAKERS[name]
    windowed = epoch_batches(make(data, caches[0]), 0)
    loader = make(data, None)
    source = loader.dataset
    wide = {"packed": {"shuffle_window": 10**9}, "budget": {"shuffle_window": 10**9},
            "parquet": {"shuffle_window": None}}[name]  # fmt: skip
    if name == "parquet":
        other = ParquetSource(data["rows"], **wide)
    elif name == "packed":
        other = PackedTokens(data["docs"], column="tokens", seq_len=SEQ, eos_id=0,
                             document_ids=True, **wide)  # fmt: skip
    else:
        other = TokenBudgetBatches(data["wide"], column="tokens", max_tokens=200, **wide)
    assert type(other) is type(source)
    full = epoch_batches(
        DataLoader(other, batch_size=loader.batch_size, shuffle=True, seed=loader.seed), 0
    )
    flat = [np.concatenate([np.asarray(v).reshape(-1) for v in b.values()]) for b in windowed]
    other_flat = [np.concatenate([np.asarray(v).reshape(-1) for v in b.values()]) for b in full]
    assert len(flat) == len(other_flat)
    assert any(not np.array_equal(a, b) for a, b in zip(flat, other_flat, strict=True))


@pytest.mark.parametrize(
    ("name", "cache"), [("packed", 12_000), ("budget", 15_000), ("parquet", 5 * 1700)]
)
def test_a_cache_too_small_for_the_window_is_refused_naming_both_sizes(data, name, cache):
    make, _ = MAKERS[name]
    with pytest.raises(ConfigError) as raised:
        epoch_batches(make(data, cache), 0)  # refused before any batch
    message = str(raised.value)
    assert f"cache_bytes`={cache}" in message or f"cache_bytes={cache}" in message
    assert "shuffle_window" in message and "Raise `cache_bytes` to at least" in (
        message.replace("Raise cache_bytes", "Raise `cache_bytes`")
    )


def test_a_too_small_cache_suggests_a_window_that_runs(data) -> None:
    """The window the refusal suggests runs with that cache."""
    with pytest.raises(ConfigError) as raised:
        epoch_batches(packed(data, 16_000), 0)
    suggested = int(str(raised.value).split("lower shuffle_window to ")[1].split()[0])
    source = PackedTokens(data["docs"], column="tokens", seq_len=SEQ, eos_id=0,
                          shuffle_window=suggested, cache_bytes=16_000)  # fmt: skip
    assert epoch_batches(DataLoader(source, batch_size=4, shuffle=True, seed=11), 0)


@pytest.mark.parametrize("value", [0, -1, True, "lots", 1.5e-3])
def test_a_bad_window_is_refused_when_built(data, value) -> None:
    with pytest.raises(ConfigError, match="shuffle_window"):
        PackedTokens(data["docs"], column="tokens", seq_len=SEQ, eos_id=0, shuffle_window=value)
    with pytest.raises(ConfigError, match="shuffle_window"):
        ParquetSource(data["rows"], shuffle_window=value)


def test_a_checkpoint_under_another_window_is_refused_naming_it(data) -> None:
    stopped = packed(data, None)
    it = iter(stopped)
    next(it)
    state = stopped.state_dict()
    source = PackedTokens(data["docs"], column="tokens", seq_len=SEQ, eos_id=0,
                          document_ids=True, shuffle_window=20_000)  # fmt: skip
    other = DataLoader(source, batch_size=4, shuffle=True, seed=11)
    with pytest.raises(StateError, match=r"shuffle_window \(state has 10000, loader has 20000\)"):
        other.load_state_dict(state)
