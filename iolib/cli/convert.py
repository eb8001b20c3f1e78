"""`iolib convert SRC DST`: an image folder to Parquet shards.

Why convert: an image folder costs one storage request per image; Parquet shards hold
thousands of images per file, read by row group, which suits remote storage and block
shuffling (``shuffle="block"``). The shards hold the encoded bytes (``image``), the
label (``label``, int64) and the image's path relative to SRC (``path``); ``_classes.json``
lists the class names in label order.

Only names convert chooses are written (``part-00000.parquet``, ``_classes.json``), so
no file or directory name found under SRC can make it write outside DST.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
from collections.abc import Iterator
from typing import Any

import click
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from iolib.cli.common import Number, storage_options_option
from iolib.decode.probe import DEFAULT_MAX_IMAGE_PIXELS, BadImage, probe
from iolib.errors import DataError
from iolib.plan.rng import order_rng
from iolib.sources.files import SCHEMA, ImageFolderSource
from iolib.sources.layout import ORDER_KEY  # the order written, in the shards' metadata
from iolib.storage import open_filesystem

SHARD_NAME = "part-{:05d}.parquet"
CLASSES_FILE = "_classes.json"
SKIPPED_FILE = "_skipped.txt"  # with --skip-bad: the files left out, and why
# Row groups of ~4 MB: at an object store's ~50 ms first byte and ~100 MB/s a connection
# a read spends about as long transferring as waiting, and with a few reads in flight
# the link stays busy; a block shuffle's window of 8 such groups (~32 MB) is what the
# default cache holds and what the first batch waits for.
DEFAULT_ROW_GROUP_MB = 4.0
COMPRESSIONS = ("none", "snappy", "zstd", "gzip", "lz4", "brotli")


def order_metadata(sorted_order: bool, seed: int) -> str:
    """The value of ORDER_KEY: JSON, e.g. ``{"order": "shuffled", "seed": 0}``."""
    if sorted_order:
        return json.dumps({"order": "sorted"})
    return json.dumps({"order": "shuffled", "seed": seed})


def relative_path(path: str, root: str) -> str:
    """`path` relative to `root`, made safe: never absolute, never a ``..`` or ``.``
    component (percent-encoded as ``%2E``), backslashes encoded as ``%5C``.

    >>> relative_path("/data/src/../../etc/x.jpg", "/data/src")
    '%2E%2E/%2E%2E/etc/x.jpg'
    """
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise DataError(f"Image {path!r} lies outside the folder {root!r} being converted.")
    parts = []
    for part in path[len(prefix) :].split("/"):
        if part in ("", "."):
            continue  # "a//b" and "a/./b" name "a/b"
        part = part.replace("\\", "%5C")
        parts.append("%2E%2E" if part == ".." else part)
    return "/".join(parts)


def shard_plan(total: int, rows_per_group: int, rows_per_shard: int) -> Iterator[list[int]]:
    """For each shard, the sizes of its row groups: full groups, then a shorter one where
    a shard (or the dataset) ends. Row groups never straddle shards.

    >>> list(shard_plan(10, 3, 5))
    [[3, 2], [3, 2]]
    """
    for start in range(0, total, rows_per_shard):
        rows = min(rows_per_shard, total - start)
        full, rest = divmod(rows, rows_per_group)
        yield [rows_per_group] * full + ([rest] if rest else [])


def byte_groups(sizes: list[int], target: int, rows_per_shard: int) -> list[list[int]]:
    """For each shard, the rows of its row groups: a group closes once its images reach
    `target` bytes (at least one image each), or where the shard ends.

    >>> byte_groups([3, 3, 3, 3, 3], 6, 4)
    [[2, 2], [1]]
    """
    shards: list[list[int]] = []
    for start in range(0, len(sizes), rows_per_shard):
        groups, rows, held = [], 0, 0
        for size in sizes[start : start + rows_per_shard]:
            rows, held = rows + 1, held + size
            if held >= target:
                groups.append(rows)
                rows, held = 0, 0
        if rows:
            groups.append(rows)
        shards.append(groups)
    return shards


def _check_destination(fs: Any, path: str, url: str, overwrite: bool) -> None:
    """DST must be absent or empty; with --overwrite, remove an earlier conversion."""
    if not fs.exists(path):
        return
    if not fs.isdir(path):
        raise DataError(f"DST {url!r} is a file; give a directory for the Parquet shards.")
    entries = [posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)]
    if not entries:
        return
    if not overwrite:
        raise DataError(
            f"DST {url!r} is not empty ({len(entries)} entries, e.g. {sorted(entries)[0]!r}). "
            "Choose an empty or new directory, or pass --overwrite to replace an earlier "
            "conversion there."
        )
    ours = [e for e in entries if _written_by_convert(e)]
    foreign = [e for e in entries if e.endswith((".parquet", ".pq")) and e not in ours]
    if foreign:
        raise DataError(
            f"DST {url!r} holds Parquet files convert did not write ({sorted(foreign)[:3]}); "
            "they would mix into the dataset. Choose another directory or remove them."
        )
    for name in ours:
        fs.rm(posixpath.join(path, name))


def _written_by_convert(name: str) -> bool:
    if name in (CLASSES_FILE, SKIPPED_FILE) or name.startswith(".tmp-"):
        return True
    stem = name.removeprefix("part-").removesuffix(".parquet")
    return name.startswith("part-") and name.endswith(".parquet") and stem.isdigit()


def _write_atomically(fs: Any, directory: str, name: str, write: Any) -> None:
    """Write through a temporary name in `directory`, then rename: a reader never sees a
    half-written file, and a crash leaves only a ``.tmp-*`` file behind."""
    temp = posixpath.join(directory, f".tmp-{name}")
    try:
        with fs.open(temp, "wb") as handle:
            write(handle)
        fs.mv(temp, posixpath.join(directory, name))
    except BaseException:
        if fs.exists(temp):
            fs.rm(temp)
        raise


def _check_image(value: bytes) -> None:
    """Raise BadImage unless `value` decodes: its header first (cheap), then a decode at
    1/8 scale where the format allows (a 500x500 JPEG: 0.8 ms of CPU against 1.1 ms for a
    full decode; entropy decoding, which finds truncation, cannot be skipped)."""
    probe(value, DEFAULT_MAX_IMAGE_PIXELS)
    try:
        with Image.open(io.BytesIO(value)) as img:
            img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
    except Exception as exc:  # Pillow raises several types for broken image data
        raise BadImage(f"its image data is broken ({type(exc).__name__}: {exc})") from None


@contextlib.contextmanager
def _removed_on_failure(fs: Any, written: list[str]) -> Iterator[None]:
    """Remove this run's shards if it fails (a bad image): DST is left as it was found,
    never half a dataset that a loader would read as whole."""
    try:
        yield
    except BaseException:
        for path in written:
            if fs.exists(path):
                fs.rm(path)
        raise


def _is_inside(path: str, root: str) -> bool:
    return path.rstrip("/") == root.rstrip("/") or path.startswith(root.rstrip("/") + "/")


@click.command("convert")
@click.argument("src")
@click.argument("dst")
@click.option(
    "--row-group-mb",
    type=Number(float, 0, 4096, low_open=True),
    default=DEFAULT_ROW_GROUP_MB,
    show_default=True,
    help="Target size of a Parquet row group, the unit of a read, in MB (10^6 bytes) of "
    "encoded images: a group closes at the first image that reaches it. Bytes, not rows, "
    "so small and large images alike make groups one request reads in about its latency "
    "again on object storage, and a block-shuffle window of 8 fits the default cache.",
)
@click.option(
    "--rows-per-group",
    type=Number(int, 1, 10_000_000),
    default=None,
    help="Images per row group instead of --row-group-mb (a fixed count, whatever the "
    "images weigh).",
)
@click.option(
    "--rows-per-shard",
    type=Number(int, 1, 1_000_000_000),
    default=8192,
    show_default=True,
    help="Images per Parquet file; keep files around 100 MB-1 GB for object stores. Row "
    "groups never straddle files, so a shard's last group may be shorter.",
)
@click.option(
    "--compression",
    type=click.Choice(COMPRESSIONS),
    default="none",
    show_default=True,
    help="Parquet codec. Default none: JPEG/PNG bytes are already compressed. Measured on "
    "300 synthetic 256x256 JPEGs: snappy saved 0.3%, zstd 6% at about 3x the read CPU. "
    "Use zstd where storage bytes cost more than CPU.",
)
@click.option(
    "--shuffle-seed",
    type=Number(int, 0, 2**63 - 1),
    default=0,
    show_default=True,
    help="Write the images in an order shuffled by this seed, so that every row group "
    "holds a mix of classes and shuffle='block' batches are as mixed as a full shuffle's.",
)
@click.option(
    "--sorted",
    "sorted_order",
    is_flag=True,
    help="Write the images sorted by class, then file name, instead of shuffled. A "
    "shuffle='block' over such shards puts a few classes in each batch (it says so).",
)
@click.option(
    "--skip-bad",
    is_flag=True,
    help="Leave out files that do not decode as images, and list them (with why) in "
    "DST/_skipped.txt. Without it, convert stops and names every such file.",
)
@click.option("--overwrite", is_flag=True, help="Replace an earlier conversion in DST.")
@storage_options_option
def convert(
    src: str,
    dst: str,
    row_group_mb: float,
    rows_per_group: int | None,
    rows_per_shard: int,
    compression: str,
    shuffle_seed: int,
    sorted_order: bool,
    skip_bad: bool,
    overwrite: bool,
    storage_options: dict[str, Any],
) -> None:
    """Convert an image folder SRC (SRC/<class>/<file>) to Parquet shards in DST.

    SRC and DST are paths or fsspec URLs (s3://..., memory://...). Columns: image
    (encoded bytes), label (int64, the class's index in sorted class names) and path
    (relative to SRC). DST/_classes.json lists the class names in label order. The images
    are written in an order shuffled by --shuffle-seed (0), so each row group mixes the
    classes; the order is recorded in the shards' metadata. --sorted keeps class order.

    Example: iolib convert data/train data/train-parquet --row-group-mb 8
    """
    from tqdm import tqdm

    options = storage_options
    source = ImageFolderSource(src, options)
    src_fs, src_root = open_filesystem(src, options)
    dst_fs, dst_root = open_filesystem(dst, options)
    if not src_fs.exists(src_root):
        raise DataError(f"SRC {src!r} does not exist. Give the image folder (SRC/<class>/<file>).")
    if type(src_fs) is type(dst_fs) and _is_inside(dst_root, src_root):
        raise DataError(
            f"DST {dst!r} lies inside SRC {src!r}: it would become a class of its own. "
            "Write the shards outside the image folder."
        )
    total = len(source)  # lists SRC; raises DataError naming the layout if it is empty
    _check_destination(dst_fs, dst_root, dst, overwrite)
    dst_fs.makedirs(dst_root, exist_ok=True)

    order = (
        np.arange(total, dtype=np.int64)
        if sorted_order
        else order_rng(shuffle_seed, 0).permutation(total).astype(np.int64)
    )
    schema = SCHEMA.with_metadata({ORDER_KEY: order_metadata(sorted_order, shuffle_seed)})
    if rows_per_group is not None:
        sizes = list(shard_plan(total, rows_per_group, rows_per_shard))
    else:
        listed = {p: info["size"] for p, info in src_fs.find(src_root, detail=True).items()}
        paths = source.paths
        image_bytes = [int(listed.get(paths[i], 0)) for i in order]
        sizes = byte_groups(image_bytes, int(row_group_mb * 1e6), rows_per_shard)
    done = 0
    written: list[str] = []
    bad: list[tuple[str, str]] = []  # (path under SRC, why): every one found, in one pass
    with (
        _removed_on_failure(dst_fs, written),
        tqdm(total=total, unit="img", desc="convert", disable=None, leave=False) as bar,
    ):
        for number, groups in enumerate(sizes):

            def write(handle: Any, groups: list[int] = groups, first: int = done) -> None:
                with pq.ParquetWriter(
                    handle,
                    schema,
                    compression=compression,
                    use_dictionary=["label"],  # unique bytes and paths gain nothing
                    write_statistics=["label"],  # min/max of image bytes would bloat footers
                ) as writer:
                    at = first
                    for rows in groups:
                        table = _read_group(source, order[at : at + rows], src_root, bad)
                        if table.num_rows:
                            writer.write_table(table.replace_schema_metadata(schema.metadata))
                        at += rows
                        bar.update(rows)

            _write_atomically(dst_fs, dst_root, SHARD_NAME.format(number), write)
            written.append(posixpath.join(dst_root, SHARD_NAME.format(number)))
            done += sum(groups)
        if bad and not skip_bad:
            raise DataError(_bad_images_message(bad, src_root))

    classes = json.dumps(source.classes, indent=1).encode()
    _write_atomically(dst_fs, dst_root, CLASSES_FILE, lambda handle: handle.write(classes))
    if bad:
        listing = "".join(f"{path}\t{why}\n" for path, why in bad).encode()
        _write_atomically(dst_fs, dst_root, SKIPPED_FILE, lambda handle: handle.write(listing))
    click.echo(
        f"Wrote {total - len(bad)} images of {len(source.classes)} classes to {len(sizes)} "
        f"shard(s) in {dst} ({sum(len(g) for g in sizes)} row groups), "
        + ("sorted by class." if sorted_order else f"shuffled with seed {shuffle_seed}.")
    )
    if bad:
        click.echo(
            f"Left out {len(bad)} file(s) that do not decode as images; they are listed in "
            f"{posixpath.join(dst.rstrip('/'), SKIPPED_FILE)}.",
            err=True,
        )
    if source.links_outside:
        click.echo(
            f"Left out {source.links_outside} file(s) reached through symbolic links that "
            f"lead out of {src}.",
            err=True,
        )


def _bad_images_message(bad: list[tuple[str, str]], root: str) -> str:
    """One line naming every file that does not decode, and the two ways on."""
    fix = (
        "Remove the file(s) from SRC (or replace them) and run convert again, or pass --skip-bad "
        "to leave them out (they are then listed in DST/_skipped.txt); no shard of this "
        "run was kept."
    )
    if len(bad) == 1:
        path, why = bad[0]
        return f"{posixpath.join(root, path)} is not an image a loader can decode: {why}. {fix}"
    listed = "; ".join(f"{posixpath.join(root, path)} ({why})" for path, why in bad)
    return f"{len(bad)} files are not images a loader can decode: {listed}. {fix}"


def _read_group(
    source: ImageFolderSource, indices: np.ndarray, root: str, bad: list[tuple[str, str]]
) -> pa.Table:
    """One row group's rows, read in one batched request, with safe relative paths; every
    value checked to decode (a text file named a.jpg, or a truncated JPEG, never reaches
    the shards): those that do not are left out and added to `bad`."""
    table = source.read(indices)
    paths = [relative_path(p, root) for p in table.column("path").to_pylist()]
    keep = []
    for value, path in zip(table.column("image").to_pylist(), paths, strict=True):
        try:
            _check_image(value)
            keep.append(True)
        except BadImage as exc:
            bad.append((path, str(exc)))
            keep.append(False)
    table = table.set_column(2, "path", pa.array(paths, pa.string()))
    return table if all(keep) else table.filter(pa.array(keep))
