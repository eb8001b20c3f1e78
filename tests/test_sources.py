"""Sources read real files through fsspec; bad input gets an error naming file and fix."""

from __future__ import annotations

import threading
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib import DataLoader
from iolib.errors import ConfigError, DataError, StateError, failure_text
from iolib.sources import ImageFolderSource, ParquetSource, TorchDatasetSource
from tests.conftest import jpeg_bytes, write_parquet_shards
from tests.failures import raises_failure


def test_parquet_directory_glob_list_and_file_agree(token_dir) -> None:
    files = sorted(str(p) for p in token_dir.glob("*.parquet"))
    by_dir = ParquetSource(str(token_dir))
    by_glob = ParquetSource(str(token_dir / "*.parquet"))
    by_list = ParquetSource(files)
    assert len(by_dir) == len(by_glob) == len(by_list) == 100
    assert by_dir.fingerprint() == by_glob.fingerprint() == by_list.fingerprint()
    assert len(ParquetSource(files[0])) == 33
    assert by_dir[42] == {
        "id": 42,
        "label": 0,
        "tokens": [(42 * 31 + i) % 50_000 for i in range(8)],
    }


def test_parquet_reads_by_row_group_in_batch_order(token_dir) -> None:
    source = ParquetSource(str(token_dir), columns=["id"])
    indices = np.array([99, 0, 50, 17, 16, 51], dtype=np.int64)
    table = source.read(indices)
    assert table.column_names == ["id"]
    assert table.column("id").to_pylist() == indices.tolist()
    assert source.blocks()[:2] == (17, 16)  # 33 rows in groups of 17


def test_parquet_column_projection_reads_fewer_bytes(token_dir) -> None:
    def bytes_read(columns):
        loader = DataLoader(ParquetSource(str(token_dir), columns=columns), batch_size=10)
        list(loader)
        return loader.stats()["bytes_read"]

    assert 0 < bytes_read(["label"]) < bytes_read(None)


def test_row_group_reads_stay_on_the_reading_thread(tmp_path, monkeypatch) -> None:
    """pyarrow's pre-buffering reads a Python file from its own IO threads, which then
    hold references to it; one dropped while the interpreter exits needs the GIL and
    aborts the process (seen in CI: a script exiting mid-epoch died with SIGABRT)."""
    from iolib.storage import wrapper

    # Row groups of 128 KiB: more than pyarrow's 64 KiB speculative footer read, which
    # would otherwise bring a whole small file into fsspec's readahead block.
    rows = np.random.default_rng(0).integers(0, 1 << 60, 4 * 16384)
    pq.write_table(pa.table({"x": rows}), tmp_path / "a.parquet", row_group_size=16384)
    alien: list[bool] = []  # per read: was it on a thread that Python did not start?
    fetch = wrapper._RangeFetcher.__call__

    def recording(self, start: int, end: int) -> bytes:
        alien.append(isinstance(threading.current_thread(), threading._DummyThread))
        return fetch(self, start, end)

    monkeypatch.setattr(wrapper._RangeFetcher, "__call__", recording)
    options = {"throttled": {"latency_ms": 0, "block_size": 4096, "skip_instance_cache": True}}
    source = ParquetSource(f"throttled::file://{tmp_path}", storage_options=options)
    alien.clear()  # the footers
    assert source.read(np.arange(len(rows))).column("x").to_numpy().tolist() == rows.tolist()
    assert alien and not any(alien)


def test_a_new_reader_thread_requests_no_footer_or_size(tmp_path, monkeypatch) -> None:
    """The footers read when planning serve every worker: a thread's first read of a
    file asks storage for row-group bytes only (the footer and size cost two round
    trips per worker and file, 106 ms on the object-store profile)."""
    from iolib.storage.throttle import ThrottledFileSystem

    rows = np.arange(4 * 16384)
    pq.write_table(pa.table({"x": rows}), tmp_path / "a.parquet", row_group_size=16384)
    size = (tmp_path / "a.parquet").stat().st_size
    footer_at = size - 8 - pq.ParquetFile(tmp_path / "a.parquet").metadata.serialized_size
    requests: list[tuple[str, int | None]] = []
    request = ThrottledFileSystem.before_request

    def recording(self, kind: str, path: str, start, end):
        requests.append((kind, start))
        return request(self, kind, path, start, end)

    monkeypatch.setattr(ThrottledFileSystem, "before_request", recording)
    options = {"throttled": {"latency_ms": 0, "block_size": 4096, "skip_instance_cache": True}}
    source = ParquetSource(f"throttled::file://{tmp_path}", storage_options=options)
    assert len(source) == len(rows)  # plans: lists the files, reads their footers
    requests.clear()
    read: list = []
    worker = threading.Thread(target=lambda: read.append(source.read(np.arange(len(rows)))))
    worker.start()
    worker.join(timeout=60)
    assert read and read[0].column("x").to_numpy().tolist() == rows.tolist()
    assert requests and all(kind == "read" for kind, _ in requests), requests
    assert all(start < footer_at for _, start in requests), (footer_at, requests)


def test_parquet_on_fsspec_memory_filesystem() -> None:
    fs = fsspec.filesystem("memory")
    table = pa.table({"x": np.arange(30)})
    with fs.open("/mem-test/a.parquet", "wb") as handle:
        pq.write_table(table, handle, row_group_size=8)
    loader = DataLoader(ParquetSource("memory:///mem-test/a.parquet"), batch_size=7, num_workers=2)
    assert np.concatenate([b["x"].numpy() for b in loader]).tolist() == list(range(30))


def test_columnar_collate_gives_tensors_and_lists(token_dir, image_folder) -> None:
    batch = next(iter(DataLoader(ParquetSource(str(token_dir)), batch_size=4)))
    assert batch["tokens"].shape == (4, 8) and batch["tokens"].dtype.is_floating_point is False
    images = next(iter(DataLoader(ImageFolderSource(str(image_folder)), batch_size=4)))
    assert isinstance(images["image"][0], bytes) and images["label"].tolist() == [0, 0, 0, 0]
    assert images["path"][0].endswith("class_0/img_000.jpg")


def test_image_folder_labels_follow_sorted_classes(image_folder) -> None:
    source = ImageFolderSource(str(image_folder))
    assert source.classes == ["class_0", "class_1", "class_2"]
    assert len(source) == 21 and source[20]["label"] == 2
    assert source[8]["image"] == jpeg_bytes(1001)


# -- bad input -------------------------------------------------------------------------


def test_missing_file_names_it(tmp_path) -> None:
    with pytest.raises(DataError, match=r"nope\.parquet.*does not exist"):
        len(ParquetSource(str(tmp_path / "nope.parquet")))


def test_glob_matching_nothing(tmp_path) -> None:
    with pytest.raises(DataError, match=r"No Parquet files match"):
        len(ParquetSource(str(tmp_path / "*.parquet")))


def test_missing_column_names_file_and_columns(token_dir) -> None:
    with pytest.raises(DataError, match=r"No Parquet file of .* has column\(s\) \['pixels'\]"):
        len(ParquetSource(str(token_dir), columns=["id", "pixels"]))


def test_truncated_parquet_footer(tmp_path) -> None:
    path = write_parquet_shards(tmp_path / "t", 40, shards=1)[0]
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"Parquet footer of .*part-000.parquet.*truncated"):
        len(ParquetSource(path))


def test_corrupt_row_group_names_file_and_group(tmp_path) -> None:
    path = tmp_path / "c.parquet"
    values = np.random.default_rng(0).integers(0, 2**62, 2000)
    pq.write_table(pa.table({"x": values}), path, row_group_size=1000, compression="snappy")
    meta = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = meta.dictionary_page_offset or meta.data_page_offset
    end = start + meta.total_compressed_size // 2
    data[start + 10 : end] = b"\xff" * (end - start - 10)  # garble row group 1's pages
    path.write_bytes(bytes(data))
    loader = DataLoader(ParquetSource(str(path)), batch_size=100, num_workers=2)
    with raises_failure(DataError, match=r"c.parquet.*row group 1") as info:
        list(loader)
    assert info.value.iolib_stage == "read"


def test_empty_dataset(tmp_path) -> None:
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"x": pa.array([], pa.int64())}), path)
    with pytest.raises(DataError, match="no samples"):
        list(DataLoader(ParquetSource(str(path)), batch_size=4))


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_non_positive_batch_size(token_dir, bad) -> None:
    with pytest.raises(ConfigError, match="`batch_size` must be a positive integer"):
        DataLoader(ParquetSource(str(token_dir)), batch_size=bad)


def test_state_from_another_dataset_or_config(token_dir, tmp_path) -> None:
    state = DataLoader(ParquetSource(str(token_dir)), batch_size=8, seed=1).state_dict()
    other = write_parquet_shards(tmp_path / "other", 60)
    with pytest.raises(StateError, match=r"dataset: state has .*num_samples: state has 100"):
        DataLoader(ParquetSource(other), batch_size=8, seed=1).load_state_dict(state)
    with pytest.raises(StateError, match=r"seed: state has 1, loader has 2.*batch_size"):
        DataLoader(ParquetSource(str(token_dir)), batch_size=4, seed=2).load_state_dict(state)
    with pytest.raises(StateError, match="lacks key"):
        DataLoader(ParquetSource(str(token_dir)), batch_size=8).load_state_dict({"epoch": 0})


def test_worker_exception_names_sample_and_keeps_traceback() -> None:
    class Broken(torch_dataset_base()):
        def __len__(self):
            return 20

        def __getitem__(self, index):
            if index == 13:
                raise KeyError("label missing")
            return index

    for workers, mode in ((0, "auto"), (2, "thread"), (2, "process")):
        loader = DataLoader(Broken(), batch_size=4, num_workers=workers, worker_mode=mode)
        # The message, and where it failed (a note, or ahead of it when rebuilt from text).
        either = r"sample\(s\) \[13\].*label missing|label missing.*sample\(s\) \[13\]"
        with raises_failure(KeyError, match=either) as info:
            list(loader)
        assert info.value.iolib_samples == [13]
        assert "__getitem__" in failure_text(info.value)


def test_iterable_dataset_is_refused_with_reason() -> None:
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            yield 1

    with pytest.raises(ConfigError, match="IterableDataset"):
        TorchDatasetSource(Stream())


def torch_dataset_base():
    from torch.utils.data import Dataset

    return Dataset


def test_empty_class_folder_is_named(image_folder) -> None:
    (image_folder / "class_9").mkdir()
    with pytest.raises(DataError, match=r"\['class_9'\] .* hold no images"):
        len(ImageFolderSource(str(image_folder)))


def test_row_group_cache_holds_a_block_shuffle_window(tmp_path) -> None:
    """Each row group is read from storage once per epoch under block shuffling, even
    when Parquet's encoded size understates the Arrow size."""
    write_parquet_shards(tmp_path / "w", 600, shards=2, row_group_size=50, seq_len=64)
    loader = DataLoader(
        ParquetSource(str(tmp_path / "w")),
        batch_size=16,
        shuffle="block",
        shuffle_window=4,
        num_workers=2,
    )
    list(loader)
    _assert_one_pass(loader, tmp_path / "w")


@pytest.mark.parametrize("workers", [0, 2])
def test_bytes_read_to_size_the_cache_are_counted(tmp_path, workers) -> None:
    """Binary values have no size in the footer: planning reads a row group to size the
    cache, on a thread that makes no batch. Its bytes count like any other's."""
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(int(n)) for n in rng.integers(100, 3000, 400)]
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": np.arange(400)})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=50)
    loader = DataLoader(
        ParquetSource(str(tmp_path)), batch_size=32, shuffle=True, num_workers=workers
    )
    list(loader)
    assert loader.stats()["row_group_reads"] == 8
    _assert_one_pass(loader, tmp_path)


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_values_written_without_a_dictionary_are_sized_from_the_footer(
    tmp_path, kind, compression
) -> None:
    """Strings and binary stored back to back (no dictionary, as `iolib convert` writes
    images) have their Arrow size in the footer: no row group is read to size the cache,
    and the estimate covers each decoded row group, not far over it. The same values
    with a dictionary are still measured by a read."""
    rng = np.random.default_rng(1)
    words = [None if i % 7 == 0 else rng.bytes(int(n)).hex() for i, n in enumerate(
        rng.integers(0, 400, 600))]  # fmt: skip
    values = words if pa.types.is_string(kind) or pa.types.is_large_string(kind) else [
        None if w is None else bytes.fromhex(w) for w in words]  # fmt: skip
    table = pa.table({"value": pa.array(values, kind), "label": np.arange(600)})
    plain, coded = tmp_path / "plain", tmp_path / "coded"
    for folder, dictionary in ((plain, False), (coded, True)):
        folder.mkdir()
        pq.write_table(table, folder / "a.parquet", row_group_size=30,
                       use_dictionary=dictionary, compression=compression)  # fmt: skip
    source = ParquetSource(str(plain))
    decoded = [pq.ParquetFile(plain / "a.parquet").read_row_group(g).nbytes for g in range(20)]
    for estimate, size in zip(source.estimated_bytes(), decoded, strict=True):
        # Over by the length prefixes and the page's header, whose statistics repeat the
        # smallest and largest value: the cache is never sized below what it holds.
        assert size <= estimate <= 1.25 * size + 1024
    reads = {}
    for folder in (plain, coded):
        # Windows of one row group: a first batch reads its own, and one more where
        # sizing the cache reads a row group that the first window is not.
        extra = []
        for seed in range(4):
            loader = DataLoader(ParquetSource(str(folder), readahead=0, shuffle_window=1),
                                batch_size=8, shuffle=True, seed=seed)  # fmt: skip
            groups = {int(label) // 30 for label in next(iter(loader))["label"]}
            extra.append(loader.stats()["row_group_reads"] - len(groups))
        reads[folder.name] = extra
    assert reads["plain"] == [0, 0, 0, 0]
    assert max(reads["coded"]) == 1


def _assert_one_pass(loader: DataLoader, folder: Path) -> None:
    """stats() counts every byte fetched (holes and all): each column chunk once, not
    twice (two threads taking one row group into their requests once read 8% twice)."""
    source = loader.source
    one_pass = sum(v for f in source.files for g in f.column_bytes for v in g.values())
    stored = sum(p.stat().st_size for p in folder.rglob("*.parquet"))
    fetched = loader.stats()["bytes_read"]
    assert one_pass <= fetched <= min(1.02 * one_pass, stored), (fetched, one_pass, stored)
