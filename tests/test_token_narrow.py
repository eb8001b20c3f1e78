"""Token ids that a row group's footer bounds within uint16 are decoded as uint16
(`packed_checks.narrow_type`): the cache holds half an int32 column's bytes and a
quarter of an int64's, plans exactly that, and the batches are those of the same ids
held wide. A footer whose statistics lie about the ids is a clear error, not a cache
over its budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.errors import DataError
from iolib.text import PackedTokens

EOS = 0
DOCS = 300


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


def _documents(top: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, top, int(n)) for n in rng.integers(1, 200, DOCS)]


def _write(root: Path, docs: list[np.ndarray], kind: pa.DataType, **options) -> str:
    root.mkdir()
    table = pa.table({"tokens": pa.array([d.tolist() for d in docs], pa.list_(kind))})
    pq.write_table(table, root / "part-0.parquet", row_group_size=50, **options)
    return str(root)


def _epoch(url: str, workers: int = 0) -> tuple[list[np.ndarray], dict, PackedTokens]:
    source = PackedTokens(url, column="tokens", seq_len=32, eos_id=EOS, cache_bytes=1 << 30)
    loader = DataLoader(source, batch_size=4, shuffle=True, seed=5, num_workers=workers)
    batches = [b["input_ids"].numpy().copy() for b in loader]
    stats = loader.stats()
    loader.close()
    return batches, stats, source


@pytest.mark.parametrize("kind", [pa.int32(), pa.int64()])
def test_ids_that_fit_uint16_are_held_in_two_bytes_with_the_same_batches(tmp_path, kind):
    docs = _documents(50_000)
    tokens = sum(d.size for d in docs)
    narrow, narrow_stats, source = _epoch(_write(tmp_path / "n", docs, kind))
    # The same ids without statistics: nothing bounds them up front, so they are held
    # as written; the batches are the same either way.
    plain, plain_stats, plain_source = _epoch(
        _write(tmp_path / "p", docs, kind, write_statistics=False)
    )
    assert len(narrow) == len(plain) and all(
        np.array_equal(a, b) for a, b in zip(narrow, plain, strict=True)
    )
    overhead = 24 * DOCS + 8 * source.group_bytes.size
    assert (
        narrow_stats["cache_held_bytes"] == int(source.group_bytes.sum()) == 2 * tokens + overhead
    )
    assert int(plain_source.group_bytes.sum()) == kind.bit_width // 8 * tokens + overhead
    assert plain_stats["cache_held_bytes"] == int(plain_source.group_bytes.sum())


@pytest.mark.parametrize("workers", [0, 2])
def test_ids_past_uint16_are_held_as_written_with_the_same_batches(tmp_path, workers):
    """One row group with an id of 65,536 keeps its int32; the others narrow."""
    docs = _documents(60_000)
    docs[120][0] = 65_536  # in the third row group of fifty documents
    wide, stats, source = _epoch(_write(tmp_path / "w", docs, pa.int32()), workers)
    again, _, _ = _epoch(_write(tmp_path / "w64", docs, pa.int64()), 0)
    assert len(wide) == len(again) and all(
        np.array_equal(a, b) for a, b in zip(wide, again, strict=True)
    )
    assert any((b == 65_536).any() for b in wide)
    counts = np.array([sum(d.size for d in docs[g * 50 : (g + 1) * 50]) for g in range(6)])
    want = counts * np.where(np.arange(6) == 2, 4, 2) + 24 * 50 + 8
    assert np.array_equal(source.group_bytes, want)
    assert stats["cache_held_bytes"] == int(want.sum())


def _lie_in_footer(path: Path, true_max: int, claimed_max: int) -> None:
    """Rewrite the footer's statistics: every 4-byte `true_max` in it says `claimed_max`."""
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - length
    footer = bytes(data[start:-8])
    old, new = true_max.to_bytes(4, "little"), claimed_max.to_bytes(4, "little")
    assert footer.count(old) >= 1
    data[start:-8] = footer.replace(old, new)
    path.write_bytes(bytes(data))


def test_a_footer_that_bounds_the_ids_wrongly_is_a_clear_error(tmp_path):
    docs = _documents(60_000)
    docs[10][0] = 0x00ABCDEF  # past uint16, in the first row group
    url = _write(tmp_path / "lie", docs, pa.int32())
    _lie_in_footer(Path(url) / "part-0.parquet", 0x00ABCDEF, 60_000)
    with pytest.raises(DataError, match=r"part-0\.parquet.*row group 0.*statistics"):
        _epoch(url)
