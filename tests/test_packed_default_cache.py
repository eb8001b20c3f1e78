"""`PackedTokens`' default cache: the least that runs (sized from the token index), not
1 GiB (a row group's segment serves every epoch: more holds nothing more); the batches
are those of any other cache."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from iolib import DataLoader
from iolib.text import PackedTokens


def _corpus(path, docs: int = 600, group: int = 60) -> str:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 400, docs)
    rows = [rng.integers(1, 30_000, n).astype(np.int32) for n in lengths]
    table = pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))})
    path.mkdir()
    pq.write_table(table, path / "part-0.parquet", row_group_size=group)
    return str(path)


def _epochs(source: PackedTokens, epochs: int = 2) -> tuple[list[torch.Tensor], dict]:
    loader = DataLoader(source, batch_size=4, shuffle=True, seed=3, num_workers=0)
    batches = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches += [b["input_ids"].clone() for b in loader]
    return batches, loader.stats()


def test_the_default_cache_is_what_the_order_needs_and_batches_are_unchanged(tmp_path):
    url = _corpus(tmp_path / "c")
    default = PackedTokens(url, column="tokens", seq_len=64, eos_id=0)
    wide = PackedTokens(url, column="tokens", seq_len=64, eos_id=0, cache_bytes=1 << 30)
    got, stats = _epochs(default)
    want, wide_stats = _epochs(wide)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    sizes = default.group_bytes
    need = int(sizes.sum()) + 3 * int(sizes.max())  # the corpus fits the window: whole + 3
    assert default.cache_bytes == need == stats["cache_budget_bytes"]
    assert stats["cache_held_bytes"] <= need
    # One segment a row group, whichever epoch it serves: a wider cache holds no more,
    # and two epochs read each row group once, with either cache.
    assert wide_stats["cache_held_bytes"] == int(sizes.sum())
    assert stats["row_group_reads"] == wide_stats["row_group_reads"] == sizes.size


def test_a_given_cache_is_kept(tmp_path):
    url = _corpus(tmp_path / "c")
    given = PackedTokens(url, column="tokens", seq_len=64, eos_id=0, cache_bytes=64 << 20)
    len(given)
    assert given.cache_bytes == 64 << 20


def test_a_default_cache_too_small_is_refused_saying_none_was_given():
    from iolib.errors import ConfigError
    from iolib.text.packed_checks import check_budget

    sizes = np.full(4, 1 << 29)  # four 512 MiB row groups: 2 GiB held together
    with pytest.raises(ConfigError, match=r"`cache_bytes` \(not given; its default is at most"):
        check_budget(sizes, "tokens", 1 << 29, 1 << 30, "corpus", given=False)
    with pytest.raises(ConfigError, match=r"`cache_bytes`=1073741824 holds"):
        check_budget(sizes, "tokens", 1 << 29, 1 << 30, "corpus")
