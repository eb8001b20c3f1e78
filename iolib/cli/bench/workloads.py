"""What the benchmark reads: synthetic images and tokens, or a user's Parquet dataset.

Synthetic data is written twice, in the layout each loader is built for: Parquet shards
(row groups, read by iolib) and one object per sample (JPEG files, or one flat int32
token file read by byte range), which is what a map-style torch Dataset reads with one
request per `__getitem__`. Both layouts hold the same samples, so the comparison is
of loaders and layouts, not of data.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from iolib.errors import ConfigError

WORKLOAD_KINDS = ("images", "tokens")


@dataclass(frozen=True)
class Workload:
    """A dataset in one or two layouts, as relative paths under a root URL.

    kind: "images" (column of JPEG bytes) or "tokens" (fixed-length int32 sequences).
    parquet: Parquet shard paths (relative to the root) read by iolib.
    samples: per-sample object paths for torch (images); empty when torch reads tokens
        from `token_file` by byte range, or reads the Parquet rows (a user dataset).
    """

    name: str
    kind: str
    column: str
    num_samples: int
    parquet: tuple[str, ...]
    rows_per_group: int
    samples: tuple[str, ...] = ()
    token_file: str = ""
    seq_len: int = 0
    labels: tuple[int, ...] = field(default=(), repr=False)

    @property
    def synthetic(self) -> bool:
        return bool(self.samples or self.token_file)


def _smooth_image(rng: np.random.Generator, size: int) -> np.ndarray:
    """A photo-like image (smooth colour fields plus grain): JPEG size ~ real photos."""
    from PIL import Image

    small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    big = np.asarray(Image.fromarray(small).resize((size, size), Image.BICUBIC), np.int16)
    grain = rng.integers(-12, 13, big.shape, dtype=np.int16)
    return np.clip(big + grain, 0, 255).astype(np.uint8)


def jpeg_bytes(rng: np.random.Generator, size: int, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_smooth_image(rng, size)).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_images(
    root: str, num_samples: int, size: int = 256, rows_per_group: int = 256, seed: int = 0
) -> Workload:
    """Write `num_samples` JPEGs as Parquet shards and as one file per image under `root`."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    unique = [jpeg_bytes(rng, size) for _ in range(min(num_samples, 256))]
    images = [unique[i % len(unique)] for i in range(num_samples)]
    labels = [int(x) for x in rng.integers(0, 1000, num_samples)]
    samples = []
    os.makedirs(os.path.join(root, "files"), exist_ok=True)
    for i, data in enumerate(images):
        rel = f"files/{i:07d}.jpg"
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        samples.append(rel)
    table = pa.table({"image": pa.array(images, pa.binary()), "label": labels})
    parquet = _write_shards(root, table, rows_per_group)
    return Workload(
        f"images-{size}", "images", "image", num_samples, parquet, rows_per_group,
        samples=tuple(samples), labels=tuple(labels),
    )  # fmt: skip


def make_tokens(
    root: str, num_samples: int, seq_len: int = 2048, rows_per_group: int = 256, seed: int = 0
) -> Workload:
    """Write int32 token sequences as Parquet shards and as one flat `tokens.bin`."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 50257, (num_samples, seq_len), dtype=np.int32)
    os.makedirs(root, exist_ok=True)
    tokens.tofile(os.path.join(root, "tokens.bin"))
    flat = pa.array(tokens.reshape(-1))
    column = pa.FixedSizeListArray.from_arrays(flat, seq_len)
    table = pa.table({"tokens": column})
    parquet = _write_shards(root, table, rows_per_group)
    return Workload(
        f"tokens-{seq_len}", "tokens", "tokens", num_samples, parquet, rows_per_group,
        token_file="tokens.bin", seq_len=seq_len,
    )  # fmt: skip


def _write_shards(root: str, table: Any, rows_per_group: int, groups_per_shard: int = 4):
    import pyarrow.parquet as pq

    os.makedirs(os.path.join(root, "parquet"), exist_ok=True)
    rows_per_shard = rows_per_group * groups_per_shard
    paths = []
    for k, start in enumerate(range(0, table.num_rows, rows_per_shard)):
        rel = f"parquet/shard-{k:05d}.parquet"
        part = table.slice(start, rows_per_shard)
        pq.write_table(part, os.path.join(root, rel), row_group_size=rows_per_group)
        paths.append(rel)
    return tuple(paths)


def inspect_dataset(
    url: str, storage_options: dict | None, kind: str | None
) -> tuple[str, Workload]:
    """Describe a user's Parquet dataset; choose the column the workload needs.

    Returns (root URL, workload). Images need a binary column, tokens a list of
    integers. Raises ConfigError with the
    fix when the URL cannot be read or holds no such column.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iolib.storage import open_filesystem

    try:
        fs, path = open_filesystem(url, storage_options)
        if fs.isdir(path):
            files = sorted(p for p in fs.find(path) if p.endswith(".parquet"))
        else:
            files = sorted(fs.glob(path)) if any(c in path for c in "*?[") else [path]
        if not files:
            raise ConfigError(
                f"No .parquet files at {url!r}. Fix: point --data at Parquet shards; for an "
                f"image folder, convert it first: iolib convert {url} SHARDS."
            )
        with fs.open(files[0], "rb") as f:
            meta = pq.ParquetFile(f).metadata
            schema = meta.schema.to_arrow_schema()
            rows_per_group = meta.row_group(0).num_rows if meta.num_row_groups else 0
    except ConfigError:
        raise
    except Exception as exc:  # unreachable URL, permission, not Parquet
        raise ConfigError(
            f"Cannot read dataset {url!r}: {type(exc).__name__}: {exc}. "
            "Fix: check the URL and --storage-options."
        ) from exc

    def is_tokens(t: pa.DataType) -> bool:
        return (pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or
                pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)  # fmt: skip

    finders: dict[str, Callable[[pa.DataType], bool]] = {
        "images": lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t),
        "tokens": is_tokens,
    }
    kinds = [kind] if kind else list(WORKLOAD_KINDS)
    for k in kinds:
        cols = [f.name for f in schema if finders[k](f.type)]
        if cols:
            column = cols[0]
            break
    else:
        want = "binary (image bytes)" if kind == "images" else "integer list (tokens)"
        raise ConfigError(
            f"Dataset {url!r} has no {want if kind else 'image or token'} column "
            f"(columns: {', '.join(schema.names)}). Fix: choose --workload "
            f"{'tokens' if kind == 'images' else 'images'} or another dataset."
        )
    prefix = os.path.commonpath(files) if len(files) > 1 else os.path.dirname(files[0])
    rel = tuple(os.path.relpath(f, prefix) for f in files)
    total = 0
    for f in files:
        with fs.open(f, "rb") as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    name = f"{k}-{os.path.basename(prefix.rstrip('/')) or 'data'}"
    root = fs.unstrip_protocol(prefix)
    return root, Workload(name, k, column, total, rel, rows_per_group)
