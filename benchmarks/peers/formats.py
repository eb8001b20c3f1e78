"""The benchmark's data, made once under a local folder, in each system's own format.

- tokens: documents of log-normal length (median ~400 tokens, ids 1..49,999, eos 0).
  iolib: Parquet, one `list<int32>` column, written by pyarrow's default writer
  (`pq.write_table`: one row group a file here) or with row groups of `row_group_mb`.
  MDS (streaming's MDSWriter) and WebDataset-free litdata (`optimize` with
  `TokensLoader`): the same documents, each followed by eos, concatenated; MDS holds
  them as windows of seq_len (llm-foundry's `concat_tokens`), litdata as its token
  chunks, which it cuts into windows when read.
- images: JPEGs of 192..320 px sides with a label. iolib: an image folder converted
  by `iolib convert` with its defaults (image, label, path); MDS (bytes, int);
  litdata (bytes, int); WebDataset tars (.jpg, .cls).

Shards (MDS shards, litdata chunks, tars, token Parquet files) are `shard_mb` each: 64 MB,
MosaicML's default `size_limit` and litdata's documented `chunk_bytes`.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

EOS = 0


# -- the data --------------------------------------------------------------------------
def token_documents(tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(flat int32 token ids, document offsets) of documents totalling about `tokens`."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6, 1, size=tokens // 300 + 1), 1, 32_000).astype(np.int64)
    lengths = lengths[np.cumsum(lengths) <= tokens]
    values = rng.integers(1, 50_000, size=int(lengths.sum()), dtype=np.int32)
    return values, np.concatenate([[0], np.cumsum(lengths)])


def packed_stream(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The documents concatenated, each followed by eos (what PackedTokens packs)."""
    out = np.empty(values.size + offsets.size - 1, dtype=np.int32)
    ends = offsets[1:] + np.arange(1, offsets.size)  # position after each eos
    out[ends - 1] = EOS
    mask = np.ones(out.size, dtype=bool)
    mask[ends - 1] = False
    out[mask] = values
    return out


def jpeg_images(n: int, seed: int = 0) -> Iterator[tuple[bytes, int]]:
    """n (JPEG bytes, label): smooth gradients plus noise, so sizes are photo-like."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        h, w = (int(s) for s in rng.integers(192, 321, size=2))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x + 3 * i) % 256, (y * 2 + i) % 256, ((x + y) // 2 + 5 * i) % 256], -1)
        pixels = np.clip(base + rng.integers(-40, 40, base.shape), 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        yield buffer.getvalue(), int(rng.integers(0, 1000))


# -- writers ---------------------------------------------------------------------------
def _fresh(directory: Path) -> Path:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    return directory


def write_parquet(directory: Path, table, shard_mb: float, row_group_mb: float) -> None:
    """`table` as Parquet files of about `shard_mb`, row groups of about `row_group_mb`
    (0: pyarrow's default writer, `pq.write_table(part, path)`: up to 1 Mi rows a group,
    so one group a file for these tables)."""
    import pyarrow.parquet as pq

    _fresh(directory)
    per_row = max(1.0, table.nbytes / max(1, table.num_rows))
    per_file = max(1, int(shard_mb * 1e6 / per_row))
    group = None
    if row_group_mb:
        group = max(1, int(row_group_mb * 1e6 / per_row))
        per_file = max(group, per_file // group * group)
    for f, lo in enumerate(range(0, table.num_rows, per_file)):
        part = table.slice(lo, per_file)
        pq.write_table(part, directory / f"part-{f:05d}.parquet", row_group_size=group)


def row_groups(folder: str) -> list[tuple[int, int]]:
    """(compressed bytes, rows) of every row group of the Parquet files under `folder`."""
    import pyarrow.parquet as pq

    groups = []
    for path in sorted(Path(folder).rglob("*.parquet")):
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            groups.append((size, group.num_rows))
    return groups


def groups_touched(groups: int, rows: int, batch: int) -> float:
    """Row groups, of `rows` rows each, that `batch` rows drawn at random without
    replacement from `groups` of them touch on average: a full shuffle's first batch."""
    total = groups * rows
    missed = 1.0  # the chance that one given row group gives none of the batch's rows
    for i in range(min(batch, total)):
        missed *= max(0, total - rows - i) / (total - i)
    return groups * (1.0 - missed)


def bytes_touched(sizes: list[int], batch: int) -> float:
    """Bytes of the row groups (of `sizes` bytes, each holding windows in proportion to
    its bytes) that `batch` windows drawn at random from all of them touch on average:
    a shuffled `PackedTokens` first batch where the corpus is one shuffle window."""
    total = sum(sizes)
    return sum(s * (1.0 - (1.0 - s / total) ** batch) for s in sizes) if total else 0.0


def first_batch_bytes(workload: str, system: str, folder: str, cfg: dict, facts: dict) -> int:
    """The bytes a first batch needs, in the read units of the system's format: whole
    row groups (iolib), a whole shard or chunk (streaming, litdata download one before
    reading it) or the batch's samples (WebDataset streams a tar). iolib's tokens are
    shuffled over the whole corpus where it fits the default shuffle window (the row
    groups a batch of random windows touches). iolib's images are
    shuffled over the whole set (its default) or within `--image-window-mb`: the row
    groups a random batch from the first window touches."""
    files = [p for p in Path(folder).rglob("*") if p.is_file() and p.name != ".done"]
    if system == "iolib":
        groups = row_groups(folder)
        size = sorted(g for g, _ in groups)[len(groups) // 2]
        rows = sorted(r for _, r in groups)[len(groups) // 2]
        if workload == "tokens":
            # Shuffled, a batch's windows come from anywhere in the shuffle window (by
            # default 512 MiB decoded, more than this corpus): the row groups they touch.
            from iolib.plan import DEFAULT_SHUFFLE_WINDOW

            decoded = facts["tokens"]["tokens_with_eos"] * 4
            if decoded <= DEFAULT_SHUFFLE_WINDOW:
                return int(bytes_touched([g for g, _ in groups], cfg["token_batch"]))
            per_token = size / max(1, facts["tokens"]["tokens_with_eos"] / len(groups))
            need = cfg["token_batch"] * cfg["seq_len"] * per_token
            return int(size * max(1, -(-need // size)))
        # As systems.iolib_loader sets it: a cache below the data comes with half of it.
        window = int((cfg.get("image_window_mb") or cfg.get("image_cache_mb", 0) / 2) * 2**20)
        largest = max(g for g, _ in groups)
        in_window = len(groups) if not window else min(len(groups), max(1, window // largest))
        return int(size * groups_touched(in_window, rows, cfg["image_batch"]))
    if system == "webdataset":
        return int(folder_bytes(folder) * cfg["image_batch"] / max(1, facts["images"]["images"]))
    shards = sorted(p.stat().st_size for p in files if not p.name.endswith(".json"))
    return shards[len(shards) // 2]


def tokens_parquet(directory: Path, values, offsets, shard_mb: float, rg_mb: float) -> None:
    import pyarrow as pa

    column = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values))
    write_parquet(directory, pa.table({"tokens": column}), shard_mb, rg_mb)


def _mds_writer():
    from benchmarks.peers.systems import _torchvision_or_stand_in

    _torchvision_or_stand_in()  # streaming imports torchvision; see there
    from streaming import MDSWriter

    return MDSWriter


def tokens_mds(directory: Path, stream: np.ndarray, seq_len: int, shard_mb: float) -> None:
    MDSWriter = _mds_writer()

    windows = stream[: stream.size // seq_len * seq_len].reshape(-1, seq_len)
    columns = {"tokens": f"ndarray:int32:{seq_len}"}
    limit = int(shard_mb * 1e6)
    with MDSWriter(out=str(_fresh(directory)), columns=columns, size_limit=limit) as out:
        for window in tqdm(windows, desc="MDS windows", unit="window", leave=False):
            out.write({"tokens": window})


def _litdata_documents(spec: str) -> Iterator:
    """litdata's optimize() input function: one group of documents as int32 tensors,
    each followed by eos (module-level: optimize's workers import it)."""
    import torch

    path, lo, hi = spec.split("|")
    data = np.load(path)
    values, offsets = data["values"], data["offsets"]
    for d in range(int(lo), int(hi)):
        doc = values[offsets[d] : offsets[d + 1]]
        yield torch.from_numpy(np.append(doc, np.int32(EOS)).astype(np.int32))


def tokens_litdata(directory: Path, values, offsets, shard_mb: float) -> None:
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    work = _fresh(directory.with_name(directory.name + "-input"))
    np.savez(work / "docs.npz", values=values, offsets=offsets)
    docs = offsets.size - 1
    step = max(1, docs // 64)
    specs = [f"{work / 'docs.npz'}|{lo}|{min(docs, lo + step)}" for lo in range(0, docs, step)]
    optimize(
        fn=_litdata_documents, inputs=specs, output_dir=str(_fresh(directory)),
        chunk_bytes=f"{int(shard_mb)}MB", item_loader=TokensLoader(), num_workers=1,
        mode="overwrite",
    )  # fmt: skip
    shutil.rmtree(work)


def images_convert(directory: Path, images: list[tuple[bytes, int]]) -> None:
    """The JPEGs as an image folder (SRC/<class>/<file>), then `iolib convert SRC DST`
    with its defaults, as a new user would."""
    import subprocess
    import sys

    folder = _fresh(directory.with_name(directory.name + "-folder"))
    for i, (data, label) in enumerate(images):
        (folder / f"{label:03d}").mkdir(exist_ok=True)
        (folder / f"{label:03d}" / f"{i:06d}.jpg").write_bytes(data)
    if directory.exists():
        shutil.rmtree(directory)
    subprocess.run(
        [sys.executable, "-m", "iolib.cli", "convert", str(folder), str(directory)], check=True
    )
    shutil.rmtree(folder)


def images_mds(directory: Path, images: list[tuple[bytes, int]], shard_mb: float) -> None:
    MDSWriter = _mds_writer()

    columns = {"image": "bytes", "label": "int"}
    limit = int(shard_mb * 1e6)
    with MDSWriter(out=str(_fresh(directory)), columns=columns, size_limit=limit) as out:
        for data, label in tqdm(images, desc="MDS images", unit="image", leave=False):
            out.write({"image": data, "label": label})


def _litdata_image(item: tuple[bytes, int]) -> dict:
    return {"image": item[0], "label": item[1]}


def images_litdata(directory: Path, images: list[tuple[bytes, int]], shard_mb: float) -> None:
    from litdata import optimize

    optimize(
        fn=_litdata_image, inputs=images, output_dir=str(_fresh(directory)),
        chunk_bytes=f"{int(shard_mb)}MB", num_workers=1, mode="overwrite",
    )  # fmt: skip


def images_wds(directory: Path, images: list[tuple[bytes, int]], shard_mb: float) -> None:
    import webdataset as wds

    pattern = str(_fresh(directory) / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxsize=int(shard_mb * 1e6), verbose=0) as sink:
        for i, (data, label) in enumerate(images):
            sink.write({"__key__": f"{i:08d}", "jpg": data, "cls": str(label).encode()})


# -- all of it -------------------------------------------------------------------------
def make_all(root: Path, cfg: dict, systems: list[str], workloads: list[str]) -> dict:
    """Write every (workload, system) folder missing under `root` (keyed by the config);
    return {workload: {system: folder}} and what the data holds."""
    key = "-".join(f"{k}{cfg[k]}" for k in ("tokens", "images", "shard_mb"))
    base = root / key
    out: dict = {"folders": {}, "facts": {}}
    facts_file = base / "facts.json"
    facts = json.loads(facts_file.read_text()) if facts_file.exists() else {}
    if "tokens" in workloads:
        out["folders"]["tokens"] = _make_tokens(base / "tokens", cfg, systems, facts)
    if "images" in workloads:
        out["folders"]["images"] = _make_images(base / "images", cfg, systems, facts)
    base.mkdir(parents=True, exist_ok=True)
    facts_file.write_text(json.dumps(facts, indent=2))
    out["facts"] = facts
    return out


def _done(folder: Path) -> bool:
    return (folder / ".done").exists()


def _mark(folder: Path) -> None:
    (folder / ".done").touch()


def _make_tokens(base: Path, cfg: dict, systems: list[str], facts: dict) -> dict:
    rg_mb = cfg["row_group_mb"]
    name = {"iolib": f"iolib-rg{rg_mb:g}" if rg_mb else "iolib-pyarrow"}
    folders = {s: base / name.get(s, s) for s in systems if s != "webdataset"}
    missing = [s for s, f in folders.items() if not _done(f)]
    if missing:
        values, offsets = token_documents(cfg["tokens"])
        stream = packed_stream(values, offsets)
        facts["tokens"] = {
            "documents": int(offsets.size - 1), "tokens": int(values.size),
            "tokens_with_eos": int(stream.size), "raw_bytes": int(stream.size * 4),
            "median_document": float(np.median(np.diff(offsets))),
        }  # fmt: skip
        for system in missing:
            folder = folders[system]
            if system == "iolib":
                tokens_parquet(folder, values, offsets, cfg["shard_mb"], rg_mb)
            elif system == "streaming":
                tokens_mds(folder, stream, cfg["seq_len"], cfg["shard_mb"])
            elif system == "litdata":
                tokens_litdata(folder, values, offsets, cfg["shard_mb"])
            _mark(folder)
    return {s: str(f) for s, f in folders.items()}


def _make_images(base: Path, cfg: dict, systems: list[str], facts: dict) -> dict:
    folders = {s: base / ("iolib-convert" if s == "iolib" else s) for s in systems}
    missing = [s for s, f in folders.items() if not _done(f)]
    if missing:
        made = jpeg_images(cfg["images"])
        images = list(tqdm(made, total=cfg["images"], desc="JPEGs", unit="image", leave=False))
        facts["images"] = {
            "images": len(images), "jpeg_bytes": int(sum(len(b) for b, _ in images)),
        }  # fmt: skip
        writers = {
            "iolib": lambda f: images_convert(f, images),
            "streaming": lambda f: images_mds(f, images, cfg["shard_mb"]),
            "litdata": lambda f: images_litdata(f, images, cfg["shard_mb"]),
            "webdataset": lambda f: images_wds(f, images, cfg["shard_mb"]),
        }
        for system in missing:
            writers[system](folders[system])
            _mark(folders[system])
    return {s: str(f) for s, f in folders.items()}


def folder_bytes(folder: str) -> int:
    return sum(
        p.stat().st_size for p in Path(folder).rglob("*") if p.is_file() and p.name != ".done"
    )
