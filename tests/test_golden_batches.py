"""Golden batches: a refactor that reads the same data the same way gives the same bytes.

Each case builds a small real dataset the same way every time, reads it through the
public API and hashes every batch (dtype, shape, bytes; keys in order). The digests in
tests/golden_batches.json were recorded before the architecture change (issue 32) and
must not move unless a change of order is intended, said in its commit and recorded
again with ``python -m tests.test_golden_batches``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from iolib import DataLoader
from iolib.decode.images import ImagePipeline
from iolib.loader.testing import to_numpy_tree
from iolib.sources import ImageFolderSource, ParquetSource
from iolib.text import PackedTokens, TokenBudgetBatches
from tests.conftest import write_image_folder, write_parquet_shards
from tests.image_samples import bad_blob, encode, make_image
from tests.token_data import doc_lengths, write_documents

GOLDEN = Path(__file__).with_name("golden_batches.json")


def _update(h: Any, value: Any) -> None:
    """Feed one batch tree into the hash: structure, dtype, shape and bytes."""
    if isinstance(value, np.ndarray):
        h.update(f"a{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        h.update(b"d")
        for key, item in value.items():
            h.update(repr(key).encode())
            _update(h, item)
    elif isinstance(value, (list, tuple)):
        h.update(f"l{len(value)}".encode())
        for item in value:
            _update(h, item)
    else:
        h.update(f"v{type(value).__name__}:{value!r}".encode())


def digest(batches: list[Any]) -> str:
    h = hashlib.sha256()
    for batch in batches:
        _update(h, to_numpy_tree(batch))
    return h.hexdigest()


def _epochs(loader: DataLoader, epochs: int = 2) -> list[Any]:
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.extend(loader)
    return out


class _Squares(Dataset):
    def __len__(self) -> int:
        return 203

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.tensor([i, i * i], dtype=torch.int64), "y": float(i) / 7}


class _Stream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(57))


def _noise(sample: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    return {**sample, "noise": rng.standard_normal(3).astype(np.float32)}


def _image_shard(directory: Path) -> str:
    blobs = [encode(make_image(i), "JPEG") for i in range(30)]
    blobs[7] = bad_blob("truncated", blobs[7])
    table = pa.table({"image": pa.array(blobs, pa.binary()), "label": pa.array(range(30))})
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, directory / "part-000.parquet", row_group_size=8)
    return str(directory / "part-000.parquet")


def _resumed(make: Callable[[], DataLoader], after: int) -> list[Any]:
    """The first `after` batches of a loader, then the rest from a new one resumed."""
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(after)]
    state = first.state_dict()
    first.close()
    second = make()
    second.load_state_dict(state)
    return head + list(second)


def _cases(tmp: Path) -> dict[str, Callable[[], list[Any]]]:
    tokens = tmp / "tokens"
    write_parquet_shards(tokens, 150, shards=3, row_group_size=13)
    docs = write_documents(tmp / "docs", doc_lengths(120, seed=4, high=70), shards=3)
    images = _image_shard(tmp / "images")
    folder = write_image_folder(tmp / "folder", classes=2, per_class=6)

    def parquet(**kw: Any) -> DataLoader:
        held = {"cache_bytes": kw.pop("cache_bytes", None), "shuffle_window": kw.pop("bytes", None)}
        return DataLoader(ParquetSource(str(tokens), **held), batch_size=10, **kw)

    # The shuffle window was half of `cache_bytes` before it became its own argument: a
    # window of half the old cache keeps these digests (issue 42).
    def packed(window: int, **kw: Any) -> DataLoader:
        windows = PackedTokens(
            docs,
            column="tokens",
            seq_len=24,
            eos_id=0,
            cache_bytes=max(2 * window, 1 << 20),
            shuffle_window=window,
            document_ids=True,
            lanes=kw.pop("lanes", "auto"),
        )
        return DataLoader(windows, batch_size=4, shuffle=True, seed=9, **kw)

    pil = ImagePipeline(size=16, backend="pil", device="cpu", on_error="skip")
    return {
        "map_shuffle": lambda: _epochs(DataLoader(_Squares(), batch_size=8, shuffle=True, seed=5)),
        "map_sequential_workers": lambda: _epochs(
            DataLoader(_Squares(), batch_size=9, num_workers=2, worker_mode="thread", seed=5)
        ),
        "map_rank_1_of_3": lambda: _epochs(
            DataLoader(_Squares(), batch_size=6, shuffle=True, seed=2, rank=1, world_size=3)
        ),
        "map_block_drop_last": lambda: _epochs(
            DataLoader(_Squares(), batch_size=8, shuffle="block", seed=1, drop_last=True)
        ),
        "map_transform_rng": lambda: _epochs(
            DataLoader(_Squares(), batch_size=5, shuffle=True, seed=3, transform=_noise)
        ),
        "map_resume": lambda: _resumed(
            lambda: DataLoader(_Squares(), batch_size=8, shuffle=True, seed=6), after=7
        ),
        "iterable": lambda: _epochs(DataLoader(_Stream(), batch_size=4, seed=1)),
        "parquet_global": lambda: _epochs(parquet(shuffle=True, seed=4)),
        "parquet_process_workers": lambda: _epochs(
            parquet(shuffle=True, seed=4, num_workers=2, worker_mode="process")
        ),
        "parquet_block_window": lambda: _epochs(parquet(shuffle="block", shuffle_window=2, seed=4)),
        "parquet_small_cache": lambda: _epochs(
            parquet(shuffle=True, seed=4, cache_bytes=4000, bytes=2000)
        ),
        "parquet_rank_2_of_4": lambda: _epochs(parquet(shuffle=True, seed=8, rank=2, world_size=4)),
        "parquet_resume": lambda: _resumed(lambda: parquet(shuffle=True, seed=4), after=5),
        "packed_fits": lambda: _epochs(packed(1 << 29)),
        "packed_windowed": lambda: _epochs(packed(7000)),
        "packed_rank_1_of_2": lambda: _epochs(packed(1 << 29, rank=1, world_size=2)),
        "packed_resume": lambda: _resumed(lambda: packed(7000), after=3),
        "token_budget": lambda: _epochs(
            DataLoader(
                TokenBudgetBatches(docs, column="tokens", max_tokens=150),
                batch_size=1,
                shuffle=True,
                seed=3,
            )
        ),
        "images_pil_skip": lambda: _epochs(
            DataLoader(ParquetSource(images), batch_size=6, shuffle=True, seed=3, decode=pil)
        ),
        "image_folder": lambda: [  # paths name the temporary directory: compared apart
            {k: v for k, v in b.items() if k != "path"}
            for b in _epochs(
                DataLoader(ImageFolderSource(str(folder)), batch_size=4, shuffle=True, seed=7)
            )
        ],
    }


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], list[Any]]]:
    return _cases(tmp_path_factory.mktemp("golden"))


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


CASE_NAMES = sorted(json.loads(GOLDEN.read_text())) if GOLDEN.exists() else []


def test_every_case_has_a_golden_digest(cases: dict[str, Callable[[], list[Any]]]) -> None:
    assert sorted(cases) == CASE_NAMES


@pytest.mark.parametrize("name", CASE_NAMES)
def test_batches_match_the_golden_digest(name: str, cases: dict) -> None:
    expected = json.loads(GOLDEN.read_text())[name]
    assert digest(cases[name]()) == expected, f"{name}: batches changed"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["IOLIB_CACHE_DIR"] = f"{tmp}/cache"
        made = {k: digest(make()) for k, make in sorted(_cases(Path(tmp)).items())}
    GOLDEN.write_text(json.dumps(made, indent=1) + "\n")
    print(f"recorded {len(made)} golden digests in {GOLDEN}")
