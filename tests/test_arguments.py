"""Arguments refused at construction with a ConfigError naming the argument, not at the
first batch with a bare TypeError (or accepted silently and run)."""

from __future__ import annotations

import numpy as np
import pytest

from iolib import DataLoader
from iolib.errors import ConfigError
from iolib.plan.permute import feistel, round_keys
from iolib.sources import ParquetSource
from iolib.text import PackedTokens, TokenBudgetBatches
from tests.token_data import doc_lengths, write_documents


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> str:
    return write_documents(tmp_path_factory.mktemp("args"), doc_lengths(40), shards=1)


# Every source that takes `cache_bytes` reads it alike (checked_cache_bytes).
WITH_CACHE = {
    "ParquetSource": lambda url, **kw: ParquetSource(url, **kw),
    "PackedTokens": lambda url, **kw: PackedTokens(url, column="tokens", seq_len=8, eos_id=0,
                                                   **kw),
    "TokenBudgetBatches": lambda url, **kw: TokenBudgetBatches(url, column="tokens",
                                                               max_tokens=64, **kw),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(WITH_CACHE))
@pytest.mark.parametrize("value", [-1, 0, 1.5, True, 10**30, "x", "-1GB", [1]], ids=repr)
def test_a_bad_cache_bytes_is_refused_when_built(docs, kind, value) -> None:
    with pytest.raises(ConfigError, match="`cache_bytes`"):
        WITH_CACHE[kind](docs, cache_bytes=value)


@pytest.mark.parametrize("kind", list(WITH_CACHE))
@pytest.mark.parametrize(("value", "expected"), [("1GB", 10**9), ("64MiB", 2**26), (4096, 4096)])
def test_a_size_is_read_as_cache_bytes(docs, kind, value, expected) -> None:
    assert WITH_CACHE[kind](docs, cache_bytes=value).cache_bytes == expected


def test_parquet_source_runs_an_epoch_under_a_size_as_cache_bytes(docs) -> None:
    source = ParquetSource(docs, cache_bytes="64MiB")
    assert sum(len(b["id"]) for b in DataLoader(source, batch_size=8)) == 40


@pytest.mark.parametrize("value", [2**63, "x", None, 1.7, True], ids=repr)
def test_packed_tokens_refuses_a_bad_ignore_index_when_built(docs, value) -> None:
    with pytest.raises(ConfigError, match="`ignore_index`"):
        PackedTokens(docs, column="tokens", seq_len=8, eos_id=0, ignore_index=value)


@pytest.mark.parametrize("value", [-1, 1.5, True, "0"], ids=repr)
def test_token_sources_refuse_a_bad_seed_when_built(docs, value) -> None:
    with pytest.raises(ConfigError, match="`seed` must be an integer >= 0"):
        PackedTokens(docs, column="tokens", seq_len=8, eos_id=0, seed=value)
    with pytest.raises(ConfigError, match="`seed` must be an integer >= 0"):
        TokenBudgetBatches(docs, column="tokens", max_tokens=64, seed=value)


def test_packed_tokens_accepts_the_ignore_indexes_in_use(docs) -> None:
    for value in (-100, -1, 0, np.int64(-100), -(2**63)):
        PackedTokens(docs, column="tokens", seq_len=8, eos_id=0, ignore_index=value)


def test_feistel_refuses_a_negative_domain() -> None:
    with pytest.raises(ValueError, match="n must be >= 0"):
        feistel(np.zeros(0, np.int64), -1, round_keys(0))
    assert feistel(np.zeros(0, np.int64), 0, round_keys(0)).size == 0
