"""The torch side of the comparison: map-style Datasets that read one sample per request,
and the collate functions both loaders share.

Each Dataset holds only (url, storage_options) and opens its filesystem lazily in the
process that reads, as a torch user would (and as fsspec requires across fork).
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import torch

from iolib.errors import DataError
from iolib.storage import open_filesystem


class _Lazy(torch.utils.data.Dataset):
    def __init__(self, root: str, storage_options: dict | None) -> None:
        self.root = root.rstrip("/")
        self.storage_options = storage_options
        self._fs: Any = None
        self._pid = -1

    def _open(self) -> tuple[Any, str]:
        if self._fs is None or self._pid != os.getpid():
            self._fs, self._base = open_filesystem(self.root, self.storage_options)
            self._pid = os.getpid()
        return self._fs, self._base

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None, "_pid": -1}


class FileSampleDataset(_Lazy):
    """One object per sample (an image folder): `__getitem__` makes one GET."""

    def __init__(self, root, storage_options, files, labels) -> None:
        super().__init__(root, storage_options)
        self.files = list(files)
        self.labels = list(labels)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict:
        fs, base = self._open()
        return {"image": fs.cat_file(f"{base}/{self.files[i]}"), "label": self.labels[i]}


class TokenRangeDataset(_Lazy):
    """A flat int32 token file (nanoGPT style): `__getitem__` reads one byte range."""

    def __init__(self, root, storage_options, file, seq_len, num_samples) -> None:
        super().__init__(root, storage_options)
        self.file = file
        self.seq_len = seq_len
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict:
        fs, base = self._open()
        n = self.seq_len * 4
        data = fs.cat_file(f"{base}/{self.file}", start=i * n, end=(i + 1) * n)
        return {"tokens": np.frombuffer(data, dtype=np.int32)}


class ParquetRowDataset(_Lazy):
    """A per-sample Parquet reader as torch users write it: find the row group of
    sample i, read it (keeping the last one), return the row. What a user runs without
    iolib on Parquet shards, and the benchmark's torch baseline (`--torch-reads
    row-groups`): one request per row group read, not per sample, while the order visits
    a row group's rows together (shuffle none); a global shuffle re-reads a row group for
    almost every sample, as it would for that user."""

    def __init__(self, root, storage_options, files, column, labels: bool = False) -> None:
        super().__init__(root, storage_options)
        self.files = list(files)
        self.column = column
        self.columns = [column, "label"] if labels else [column]
        self._index: list[tuple[int, int, int]] | None = None  # (start, file, group)
        self._last: tuple[tuple[int, int], Any] | None = None

    def _groups(self) -> list[tuple[int, int, int]]:
        import pyarrow.parquet as pq

        if self._index is None:
            fs, base = self._open()
            index, start = [], 0
            for k, name in enumerate(self.files):
                with fs.open(f"{base}/{name}", "rb") as f:
                    meta = pq.ParquetFile(f).metadata
                for g in range(meta.num_row_groups):
                    index.append((start, k, g))
                    start += meta.row_group(g).num_rows
            self._index, self._len = index, start
        return self._index

    def __len__(self) -> int:
        self._groups()
        return self._len

    def __getitem__(self, i: int) -> dict:
        import bisect

        import pyarrow.parquet as pq

        groups = self._groups()
        pos = bisect.bisect_right([s for s, _, _ in groups], i) - 1
        start, k, g = groups[pos]
        if self._last is None or self._last[0] != (k, g):
            fs, base = self._open()
            # pre_buffer=False as in ParquetSource: pyarrow's IO threads must not hold
            # the Python file (an abort at interpreter exit), and it is no slower.
            with fs.open(f"{base}/{self.files[k]}", "rb") as f:
                table = pq.ParquetFile(f, pre_buffer=False).read_row_group(g, columns=self.columns)
            self._last = ((k, g), table)
        row = {name: self._last[1].column(name)[i - start].as_py() for name in self.columns}
        value = row[self.column]
        row[self.column] = np.asarray(value, np.int32) if isinstance(value, list) else value
        return row


def decode_jpeg(data: bytes, size: int | None = None) -> np.ndarray:
    """Pillow decode to HxWx3 uint8: the CPU cost both loaders pay per image.

    With `size`, an image of another size is resized (bilinear) to `size` x `size`, so a
    real folder of mixed sizes stacks into one batch; synthetic images already have
    that size and pay nothing more.
    """
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        rgb = img.convert("RGB")
        if size is not None and rgb.size != (size, size):
            rgb = rgb.resize((size, size), Image.BILINEAR)
        return np.asarray(rgb)


class Collate:
    """Shared batch assembly: decode image bytes (if `decode`), stack tokens.

    A class, not a closure, so torch can pickle it to worker processes.
    """

    def __init__(
        self, column: str, decode: bool, size: int | None = None, pipeline: Any = None
    ) -> None:
        self.column = column
        self.decode = decode
        self.size = size
        self.pipeline = pipeline  # an ImagePipeline run on the collated bytes (torch's side)
        self.batches = 0

    def __call__(self, rows: list[dict]) -> dict:
        values = [r[self.column] for r in rows]
        out: dict[str, Any] = {}
        if isinstance(values[0], (bytes, bytearray, memoryview)):
            if self.decode:
                out[self.column] = torch.from_numpy(np.stack(self._decode_all(values)))
            else:
                out[self.column] = [bytes(v) for v in values]
        else:
            out.update(_tokens(self.column, values))
        if "label" in rows[0]:
            out["label"] = torch.tensor([int(r["label"]) for r in rows])
        if self.pipeline is not None:
            # Each batch's own indices, so crops differ between batches as in iolib.
            first, self.batches = self.batches * len(rows), self.batches + 1
            out, _ = self.pipeline(out, np.arange(first, first + len(rows)), seed=0, epoch=0)
        return out

    def _decode_all(self, values: list[Any]) -> list[np.ndarray]:
        images = []
        for k, value in enumerate(values):
            try:
                images.append(decode_jpeg(value, self.size))
            except Exception as exc:  # Pillow raises several types: say which value failed
                head = bytes(value[:8]).hex(" ")
                raise DataError(
                    f"Value {k} of the batch in column {self.column!r} is not an image Pillow "
                    f"can decode ({type(exc).__name__}; first bytes: {head}). Use --no-decode, "
                    "or a column of encoded images."
                ) from None
        return images


def _tokens(column: str, values: list[Any]) -> dict[str, torch.Tensor]:
    """Token rows as a batch: stacked where all have one length, else padded with 0 to
    the longest with `<column>_mask` and `<column>_lengths`, as iolib's padded lists (a
    real corpus is variable-length; np.stack refused it)."""
    arrays = [np.asarray([] if v is None else v) for v in values]
    if len({a.shape for a in arrays}) == 1:
        return {column: torch.from_numpy(np.stack(arrays))}
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    dtype = np.result_type(*[a.dtype for a in arrays if a.size] or [np.int32])
    padded = np.zeros((len(arrays), int(lengths.max())), dtype=dtype)
    mask = np.arange(padded.shape[1])[None, :] < lengths[:, None]
    padded[mask] = np.concatenate([a.reshape(-1) for a in arrays])
    return {
        column: torch.from_numpy(padded),
        f"{column}_mask": torch.from_numpy(mask),
        f"{column}_lengths": torch.from_numpy(lengths),
    }


def batch_nbytes(batch: Any) -> int:
    """Bytes held by a batch: tensors, arrays, bytes, nested in dicts/lists."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    if isinstance(batch, np.ndarray):
        return batch.nbytes
    if isinstance(batch, (bytes, bytearray, memoryview)):
        return len(batch)
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v) for v in batch)
    return 0
