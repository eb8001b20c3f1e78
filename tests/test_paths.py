"""Paths as users have them: a Hugging Face hub snapshot (a directory of symbolic links
to blobs), names holding glob characters, and files that are not regular files (a FIFO,
a device), which would be read forever."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from iolib import DataLoader
from iolib.cli import cli
from iolib.errors import DataError
from iolib.loader.testing import epoch_batches
from iolib.sources import ParquetSource
from iolib.text import PackedTokens
from tests.fixtures_s3 import s3_options  # noqa: F401
from tests.token_data import doc_lengths, write_documents

LENGTHS = doc_lengths(50, low=1, high=30)


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


def _snapshot(tmp_path: Path) -> str:
    """The hub's layout: snapshots/<revision>/ holds links to ../../blobs/<hash>."""
    data = write_documents(tmp_path / "export", LENGTHS, shards=3, row_group_size=8)
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, shard in enumerate(sorted(Path(data).glob("*.parquet"))):
        blob = blobs / f"{i:040x}"
        shard.rename(blob)
        (snapshot / shard.name).symlink_to(os.path.relpath(blob, snapshot))
    return str(snapshot)


def _tokens(url: str) -> int:
    loader = DataLoader(PackedTokens(url, column="tokens", seq_len=8, eos_id=0), batch_size=4)
    return sum(int((b["input_ids"] != 0).sum()) for b in epoch_batches(loader))


def test_a_directory_of_symlinked_shards_is_read(tmp_path, caplog) -> None:
    url = _snapshot(tmp_path)
    source = ParquetSource(url)
    assert len(source) == 50 and len(source.files) == 3
    assert source.read(np.arange(50)).column("id").to_pylist() == list(range(50))
    stream = int(LENGTHS.sum()) + 50
    want = int(LENGTHS.sum()) - (stream - stream // 8 * 8)  # the last partial window: eos last
    assert _tokens(url) <= int(LENGTHS.sum()) and _tokens(url) >= want
    result = CliRunner().invoke(cli, ["index", url, "--tokens", "tokens"])
    assert result.exit_code == 0, result.output
    assert "3 files, " in result.output
    with caplog.at_level(logging.WARNING):
        assert len(ParquetSource(url)) == 50  # the summary it wrote is trusted
    assert not caplog.records, [r.getMessage() for r in caplog.records]


def _table(first: int) -> pa.Table:
    return pa.table({"x": np.arange(first, first + 10)})


@pytest.mark.parametrize("folder", ["run[1]", "run?", "star*dir"])
def test_a_path_holding_glob_characters_is_read_as_written(tmp_path, folder) -> None:
    (tmp_path / folder).mkdir()
    pq.write_table(_table(0), tmp_path / folder / "part-000.parquet")
    for lookalike in ("run1", "runs", "starXdir"):  # what the pattern would match
        (tmp_path / lookalike).mkdir()
        pq.write_table(_table(100), tmp_path / lookalike / "part-000.parquet")
    for url in (tmp_path / folder, tmp_path / folder / "part-000.parquet"):
        source = ParquetSource(str(url))
        assert source.read(np.arange(10)).column("x").to_pylist() == list(range(10)), url


def test_a_glob_still_globs_where_nothing_has_its_name(tmp_path) -> None:
    for i in range(3):
        (tmp_path / f"run{i}").mkdir()
        pq.write_table(_table(10 * i), tmp_path / f"run{i}" / "part-000.parquet")
    assert len(ParquetSource(str(tmp_path / "run[01]" / "*.parquet"))) == 20


@pytest.mark.parametrize("where", ["file", "in a directory", "glob", "link to /dev/zero"])
def test_a_fifo_or_device_is_refused_not_read_forever(tmp_path, where) -> None:
    pq.write_table(_table(0), tmp_path / "a.parquet")
    odd = tmp_path / "b.parquet"
    if where == "link to /dev/zero":
        odd.symlink_to("/dev/zero")
    else:
        os.mkfifo(odd)
    url = {"file": odd, "in a directory": tmp_path, "glob": tmp_path / "*.parquet",
           "link to /dev/zero": odd}[where]  # fmt: skip
    with pytest.raises(DataError, match=r"b\.parquet' is not a regular file"):
        len(ParquetSource(str(url)))
    result = CliRunner().invoke(cli, ["inspect", str(url)])
    assert result.exit_code != 0
    assert "not a regular file" in result.output + str(result.exception)


def test_a_rewritten_shard_under_another_tools_summary_is_corrupt_not_transient(
    tmp_path,
) -> None:
    """A `_metadata` without recorded sizes (pyarrow's own) is checked by names only; a
    shard rewritten under it fails at once as corrupt ("Column cannot have more than one
    dictionary"), not after retries."""
    url = write_documents(tmp_path / "c", doc_lengths(90, low=0, high=40), shards=3,
                          row_group_size=8)  # fmt: skip
    files = sorted(Path(url).glob("*.parquet"))
    footers = []
    for f in files:
        footers.append(pq.read_metadata(f))
        footers[-1].set_file_path(f.name)
    pq.write_metadata(pq.read_schema(files[0]), Path(url) / "_metadata",
                      metadata_collector=footers)  # fmt: skip
    shard = Path(url) / "part-1.parquet"
    more = pa.table({"id": np.arange(1000, 1100),
                     "tokens": pa.array([[7] * 5] * 100, pa.list_(pa.int32()))})  # fmt: skip
    pq.write_table(pa.concat_tables([more, pq.read_table(shard)]), shard, row_group_size=8)
    source = ParquetSource(url)
    with pytest.raises(DataError, match=r"part-1\.parquet' row group 0 is corrupt") as error:
        source.read(np.arange(len(source)))
    assert "attempts" not in str(error.value)


def _on_s3(options: dict, keys: list[str]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**options)
    for i, key in enumerate(keys):
        with fs.open(f"iolib-bench/{key}", "wb") as f:
            pq.write_table(_table(100 * i), f)


def test_a_glob_on_an_object_store_costs_one_listing_before_the_footers(
    s3_options,  # noqa: F811
    tmp_path,
    monkeypatch,
) -> None:
    """The glob's own listing says whether `*.parquet` names a file as written: no look
    and no second listing of its own (each a round trip before the first batch)."""
    from benchmarks.peers.proxy import ThrottlingProxy

    _on_s3(s3_options, ["glob/a.parquet", "glob/b.parquet"])
    counted = {}
    with ThrottlingProxy(s3_options["endpoint_url"], latency=0, conn_rate=None,
                         total_rate=None) as proxy:  # fmt: skip
        options = dict(s3_options, endpoint_url=proxy.url)
        for name, url in [("files", ["s3://iolib-bench/glob/a.parquet",
                                     "s3://iolib-bench/glob/b.parquet"]),
                          ("glob", "s3://iolib-bench/glob/*.parquet")]:  # fmt: skip
            monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / name))  # nothing remembered
            proxy.reset()
            assert len(ParquetSource(url, storage_options=options)) == 20
            counted[name] = proxy.stats()["requests_by_method"]
    assert "HEAD" not in counted["glob"]
    assert counted["glob"]["GET"] == counted["files"].get("GET", 0) + 1  # the listing


def test_a_name_holding_glob_characters_is_read_as_written_on_an_object_store(
    s3_options,  # noqa: F811
) -> None:
    _on_s3(s3_options, ["odd/star*dir/part-000.parquet", "odd/starXdir/part-000.parquet"])
    for url in ("s3://iolib-bench/odd/star*dir", "s3://iolib-bench/odd/star*dir/part-000.parquet"):
        source = ParquetSource(url, storage_options=s3_options)
        assert source.read(np.arange(10)).column("x").to_pylist() == list(range(10)), url
    assert (
        len(ParquetSource("s3://iolib-bench/odd/star*/*.parquet", storage_options=s3_options)) == 20
    )


def test_a_filesystem_whose_files_take_no_size_still_reads_its_footers() -> None:
    """Files found by a listing open with its size; a filesystem whose `_open` has no
    such argument opens them as before."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Sizeless(MemoryFileSystem):
        protocol = "sizeless"
        root_marker = "/"
        store: ClassVar[dict] = {}
        pseudo_dirs: ClassVar[list] = [""]

        @classmethod
        def _strip_protocol(cls, path):
            return super()._strip_protocol(path.removeprefix("sizeless://"))

        def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None):
            return super()._open(path, mode, block_size, autocommit, cache_options)

        def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
            found = super().find(path, maxdepth, withdirs, detail=detail, **kwargs)
            if not detail:
                return found
            return {k: dict(e, ETag=f'"{e["size"]}"') for k, e in found.items()}  # a store's

    fsspec.register_implementation("sizeless", Sizeless, clobber=True)
    fs = Sizeless()
    for i in range(2):
        with fs.open(f"/data/part-{i}.parquet", "wb") as f:
            pq.write_table(_table(10 * i), f)
    source = ParquetSource("sizeless:///data/*.parquet")
    assert source.read(np.arange(20)).column("x").to_pylist() == list(range(20))
