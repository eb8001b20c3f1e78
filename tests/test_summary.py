"""Parquet's `_metadata` summary: `iolib index` writes it, a source trusts it only while
it matches the directory, and then reads no footer of its own."""

from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from iolib.cli import cli
from iolib.sources import ParquetSource
from iolib.text import PackedTokens
from tests.token_data import doc_lengths, write_documents


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


def _write(directory, files: int = 3) -> list[pa.Table]:
    directory.mkdir(exist_ok=True)
    tables = []
    for f in range(files):
        table = pa.table(
            {"x": np.arange(f * 100, f * 100 + 100), "y": [f"r{i}" for i in range(100)]}
        )
        pq.write_table(table, directory / f"p{f}.parquet", row_group_size=30)
        tables.append(table)
    return tables


def _index(*args: str) -> str:
    result = CliRunner().invoke(cli, ["index", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_a_summary_replaces_every_footer(tmp_path) -> None:
    tables = _write(tmp_path / "d")
    assert "3 files, 12 row groups, 300 rows" in _index(str(tmp_path / "d"))
    # Damage a footer: a source that reads footers fails; one that trusts the summary
    # reads the (intact) column chunks by the summary's offsets.
    # (Its size and time kept: a file that changes either reads as stale, below.)
    victim = tmp_path / "d" / "p1.parquet"
    data, stat = bytearray(victim.read_bytes()), victim.stat()
    data[-4:] = b"XXXX"
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    source = ParquetSource(str(tmp_path / "d"))
    assert len(source) == 300
    got = source.read(np.array([299, 130, 5]))
    assert got.column("x").to_pylist() == [299, 130, 5]
    assert got.column("y").to_pylist() == ["r99", "r30", "r5"]
    whole = pa.concat_tables(tables)
    order = np.random.default_rng(0).permutation(300)
    assert source.read(order).column("x").to_pylist() == whole.column("x").take(order).to_pylist()


def test_a_stale_summary_is_ignored_with_a_warning(tmp_path, caplog) -> None:
    _write(tmp_path / "d", files=2)
    _index(str(tmp_path / "d"))
    pq.write_table(pa.table({"x": np.arange(7), "y": ["a"] * 7}), tmp_path / "d" / "p9.parquet")
    with caplog.at_level(logging.WARNING):
        assert len(ParquetSource(str(tmp_path / "d"))) == 207
    assert any("_metadata" in r.getMessage() for r in caplog.records)


def test_index_writes_the_token_index_beside_the_data(tmp_path) -> None:
    url = write_documents(tmp_path / "t", doc_lengths(60), row_group_size=8)
    out = _index(url, "--tokens", "tokens")
    assert "_iolib_tokens.tokens.npz" in out and "documents of 'tokens'" in out
    windows = PackedTokens(url, column="tokens", seq_len=8, eos_id=0)
    assert len(windows) == (int(doc_lengths(60).sum()) + 60) // 8
    assert not (tmp_path / "cache").exists()  # nothing counted, nothing cached locally


def test_index_refuses_a_file(tmp_path) -> None:
    _write(tmp_path / "d", files=1)
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "d" / "p0.parquet")])
    assert result.exit_code != 0 and "not a directory" in result.output
