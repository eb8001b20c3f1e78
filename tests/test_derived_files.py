"""The files `iolib index` derives from the data (the token index beside the data, its
copy in the local cache, the `_metadata` summary), each damaged every way a run can meet
it: truncated, empty, garbage, crafted but well formed, stale, a FIFO, a directory (and
for the index: impossible counts, a header that would inflate to gigabytes, a link to
/dev/zero). Each outcome is checked: the tokens delivered are the data's (counted and
compared with a clean copy of the data), or the documented error; no hang; the damaged
file is left in place."""

from __future__ import annotations

import io
import logging
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from iolib import DataLoader
from iolib.cli import cli
from iolib.loader.testing import epoch_batches
from iolib.sources import ParquetSource
from iolib.text import PackedTokens
from iolib.text.tokenindex import TokenIndex
from tests.token_data import doc_lengths, write_documents

SEQ, EOS = 16, 0
LENGTHS = doc_lengths(90, low=0, high=40)
DAMAGES = ["truncated", "empty", "garbage", "crafted", "stale", "fifo", "directory"]
INDEX_ONLY = ["impossible", "bomb", "devzero"]


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


def _index(*args: str) -> str:
    result = CliRunner().invoke(cli, ["index", *args])
    assert result.exit_code == 0, result.output
    return result.output


def _delivered(url: str) -> tuple[np.ndarray, int]:
    """The tokens (not eos) of an epoch, sorted, and the rows a ParquetSource counts."""
    loader = DataLoader(PackedTokens(url, column="tokens", seq_len=SEQ, eos_id=EOS),
                        batch_size=4, shuffle=False, seed=1)  # fmt: skip
    ids = np.concatenate([b["input_ids"].reshape(-1) for b in epoch_batches(loader, 0)])
    return np.sort(ids[ids != EOS]), len(ParquetSource(url))


def _clean(url: str, tmp_path: Path) -> tuple[np.ndarray, int]:
    """What the same data delivers with no derived file at all (a copy of its shards)."""
    copy = tmp_path / "clean"
    copy.mkdir()
    for shard in Path(url).glob("*.parquet"):
        shutil.copy(shard, copy / shard.name)
    return _delivered(str(copy))


def _rewrite_a_shard(url: str) -> None:
    """A shard re-exported in place with more rows, its first row groups the same."""
    shard = Path(url) / "part-1.parquet"
    table = pq.read_table(shard)
    more = pa.table({"id": np.arange(1000, 1020),
                     "tokens": pa.array([[7] * 5] * 20, pa.list_(pa.int32()))})  # fmt: skip
    pq.write_table(pa.concat_tables([table, more]), shard, row_group_size=8)


def _crafted_index(path: Path, change) -> None:
    index = TokenIndex.from_bytes(path.read_bytes())
    tokens, documents = index.tokens.copy(), index.documents.copy()
    change(tokens, documents)
    path.write_bytes(TokenIndex(index.fingerprint, index.column, tokens, documents).to_bytes())


def _bomb(path: Path) -> None:
    """A well-formed zip whose `tokens` header declares 2^40 int64 (8 TiB)."""
    out = io.BytesIO()
    with zipfile.ZipFile(path) as good, zipfile.ZipFile(out, "w") as bad:
        for name in good.namelist():
            data = good.read(name)
            if name == "tokens.npy":
                header = io.BytesIO()
                np.lib.format.write_array_header_1_0(
                    header, {"descr": "<i8", "fortran_order": False, "shape": (2**40,)}
                )
                data = header.getvalue() + b"\0" * 64
            bad.writestr(name, data)
    path.write_bytes(out.getvalue())


def _other_directory_summary(tmp_path: Path, path: Path) -> None:
    """The `_metadata` of another directory whose files have the same names."""
    other = write_documents(tmp_path / "other", doc_lengths(70, seed=5), shards=3,
                            row_group_size=8)  # fmt: skip
    _index(other)
    shutil.copy(Path(other) / "_metadata", path)


def _damage(kind: str, path: Path, url: str, tmp_path: Path) -> None:
    data = path.read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif kind == "crafted" and path.name == "_metadata":
        _other_directory_summary(tmp_path, path)
    elif kind == "crafted":  # the right fingerprint, one count one short
        _crafted_index(path, lambda tokens, documents: tokens.__setitem__(2, tokens[2] - 1))
    elif kind == "impossible":  # a count no row group of this data can hold
        _crafted_index(path, lambda tokens, documents: tokens.__setitem__(1, 2**62))
    elif kind == "bomb":
        _bomb(path)
    elif kind == "stale":
        _rewrite_a_shard(url)
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "devzero":
        path.unlink()
        path.symlink_to("/dev/zero")


def _state(path: Path) -> object:
    """What is at `path`, to check that it was left in place."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return "directory"
    if path.exists() and not path.is_file():
        return "special"
    return path.read_bytes()


@pytest.mark.parametrize(
    ("derived", "kind"),
    [(d, k) for d in ("index", "cache", "_metadata") for k in DAMAGES]
    + [(d, k) for d in ("index", "cache") for k in INDEX_ONLY]
    + [("_metadata", "devzero")],
)
def test_a_damaged_derived_file_delivers_the_data_or_says_what_to_do(
    tmp_path, caplog, derived, kind
) -> None:
    url = write_documents(tmp_path / "c", LENGTHS, shards=3, row_group_size=8)
    if derived == "cache":  # a run without `iolib index` keeps its count in the cache
        _delivered(url)
        (path,) = (tmp_path / "cache" / "token-index").glob("*.npz")
    else:
        _index(url, "--tokens", "tokens")
        path = Path(url) / ("_metadata" if derived == "_metadata" else "_iolib_tokens.tokens.npz")
    _damage(kind, path, url, tmp_path)
    before = _state(path)
    want = _clean(url, tmp_path)
    with caplog.at_level(logging.INFO):
        if kind == "crafted" and derived != "_metadata":
            with pytest.raises(Exception, match="run `iolib index` again") as error:
                _delivered(url)
            assert "row group 2" in str(error.value)
        else:
            got = _delivered(url)
            assert got[1] == want[1]
            np.testing.assert_array_equal(got[0], want[0])  # every token, counted
    if kind not in ("stale", "crafted"):  # the file is named, with what it is
        assert any(path.name in r.getMessage() for r in caplog.records if r.levelno >= 30)
    if derived == "_metadata" and kind in ("stale", "crafted"):
        assert any("stale _metadata: run `iolib index` again" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
    if not (derived == "cache" and kind not in ("crafted",)):  # the cache is iolib's own
        assert _state(path) == before  # left in place


def test_an_index_that_would_inflate_to_gigabytes_is_refused_before_reading(tmp_path) -> None:
    url = write_documents(tmp_path / "c", LENGTHS, shards=3, row_group_size=8)
    _index(url, "--tokens", "tokens")
    path = Path(url) / "_iolib_tokens.tokens.npz"
    _bomb(path)
    with pytest.raises(ValueError, match="tokens has shape"):
        TokenIndex.from_bytes(path.read_bytes(), groups=12)


@pytest.mark.parametrize("fails", ["encoding the index", "renaming"])
def test_index_is_written_atomically(tmp_path, monkeypatch, fails) -> None:
    """An `iolib index` that fails while writing leaves the files it found, whole (before:
    the token index was opened for writing, so emptied, before its bytes existed)."""
    url = write_documents(tmp_path / "c", LENGTHS, shards=3, row_group_size=8)
    _index(url, "--tokens", "tokens")
    files = [Path(url) / "_metadata", Path(url) / "_iolib_tokens.tokens.npz"]
    before = [f.read_bytes() for f in files]

    def fail(*args, **kwargs):
        raise OSError("disk full")

    if fails == "renaming":
        monkeypatch.setattr(os, "replace", fail)
    else:
        monkeypatch.setattr(TokenIndex, "to_bytes", fail)
    _rewrite_a_shard(url)
    result = CliRunner().invoke(cli, ["index", url, "--tokens", "tokens"])
    assert result.exit_code != 0
    kept = slice(None) if fails == "renaming" else slice(1, None)  # _metadata came first
    assert [f.read_bytes() for f in files][kept] == before[kept]
    assert sorted(p.name for p in Path(url).iterdir()) == sorted(
        ["_metadata", "_iolib_tokens.tokens.npz", "part-0.parquet", "part-1.parquet",
         "part-2.parquet"]
    )  # fmt: skip


def test_index_refuses_a_token_column_that_is_not_a_list_before_writing(tmp_path) -> None:
    url = write_documents(tmp_path / "c", LENGTHS, shards=2, row_group_size=8)
    result = CliRunner().invoke(cli, ["index", url, "--tokens", "id"])
    assert result.exit_code != 0
    assert "column 'id' is int64" in result.output and "list of integer" in result.output
    result = CliRunner().invoke(cli, ["index", url, "--tokens", "nope"])
    assert result.exit_code != 0 and "no column 'nope'" in result.output
    assert sorted(p.name for p in Path(url).iterdir()) == ["part-0.parquet", "part-1.parquet"]
