"""Exact ranged reads of Parquet row groups: iolib's `coalesce` + `RangedFile` against
what fsspec and pyarrow already ship, on the throttled store and on local disk.

Strategies (each reads one batch of row groups from a fresh handle, the footer known):

- iolib: `coalesce` + `RangedFile.load` (one `cat_ranges`), pyarrow reads from memory;
- fsspec parts: `fsspec.utils.merge_offset_ranges` + `cat_ranges` + a file opened with
  `cache_type="parts"` (`fsspec.caching.KnownPartsOfAFile`, strict);
- fsspec open_parquet_file: `fsspec.parquet.open_parquet_file` (reads the footer itself);
- pyarrow pre_buffer: `pq.ParquetFile(pre_buffer=True)` over an unbuffered fsspec file
  (pyarrow's default `CacheOptions`);
- pyarrow CacheOptions: a dataset fragment with `pre_buffer=True` and
  `pa.CacheOptions(hole_size_limit=1 MiB, range_size_limit=64 MiB)` (iolib's limits),
  through `PyFileSystem(FSSpecHandler(...))`; it reads the footer itself.

Shapes: many small columns (all, and every 10th), one big binary column, and a batch of
16 small row groups. Requests and bytes are counted by the throttled wrapper.

    python benchmarks/bench_ranges.py

Writes benchmarks/results/ranges.md.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from fsspec.parquet import open_parquet_file
from fsspec.utils import merge_offset_ranges
from pyarrow.fs import FSSpecHandler, PyFileSystem

from iolib.sources.ranges import HOLE_BYTES, MAX_REQUEST_BYTES, RangedFile, coalesce, column_spans

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Case:
    """One read: `groups` of file `name`, `columns` (None: all)."""

    label: str
    name: str
    groups: tuple[int, ...]
    columns: tuple[str, ...] | None


def write_files(directory: Path) -> list[Case]:
    """The Parquet files of the three shapes, and the reads made of them."""
    rng = np.random.default_rng(0)
    wide = pa.table({f"c{i:03d}": rng.random(2048, dtype=np.float32) for i in range(200)})
    pq.write_table(wide, directory / "wide.parquet", row_group_size=512)
    blobs = pa.table(
        {
            "label": np.arange(128, dtype=np.int64),
            "blob": pa.array([rng.bytes(64 << 10) for _ in range(128)], pa.binary()),
        }
    )
    pq.write_table(blobs, directory / "blob.parquet", row_group_size=32)
    small = pa.table(
        {
            "id": np.arange(32768, dtype=np.int64),
            "x": rng.random(32768),
            "y": rng.random(32768, dtype=np.float32),
            "k": rng.integers(0, 100, 32768, dtype=np.int32),
        }
    )
    pq.write_table(small, directory / "small.parquet", row_group_size=512)
    every_10th = tuple(f"c{i:03d}" for i in range(0, 200, 10))
    return [
        Case("200 float32 columns, 1 row group (~0.5 MB), all columns", "wide", (1,), None),
        Case("200 float32 columns, 1 row group, every 10th column", "wide", (1,), every_10th),
        Case("1 binary column of 64 KiB blobs, 1 row group (~2 MB)", "blob", (1,), None),
        Case("4 columns, batch of 16 row groups of 512 rows (~16 KB each)", "small",
             tuple(range(8, 24)), None),
    ]  # fmt: skip


@dataclass
class File:
    path: str
    size: int
    footer: pq.FileMetaData
    spans: list[dict[str, tuple[tuple[int, int], ...]]]


def _spans(f: File, case: Case) -> list[tuple[int, int]]:
    by_group = [f.spans[g] for g in case.groups]
    return [s for cols in by_group for name in case.columns or cols for s in cols[name]]


def read_iolib(fs, f: File, case: Case) -> pa.Table:
    ranged = RangedFile(fs, f.path, f.size)
    ranged.load(coalesce(_spans(f, case)))
    reader = pq.ParquetFile(ranged, metadata=f.footer, pre_buffer=False)
    return reader.read_row_groups(list(case.groups), columns=case.columns, use_threads=False)


def read_fsspec_parts(fs, f: File, case: Case) -> pa.Table:
    spans = _spans(f, case)
    paths, starts, ends = merge_offset_ranges(
        [f.path] * len(spans),
        [a for a, _ in spans],
        [b for _, b in spans],
        max_gap=HOLE_BYTES,
        max_block=MAX_REQUEST_BYTES,
    )
    datas = fs.cat_ranges(paths, starts, ends, on_error="raise")
    parts = dict(zip(zip(starts, ends, strict=True), datas, strict=True))
    options = {"data": parts, "strict": True}
    with fs.open(f.path, "rb", size=f.size, cache_type="parts", cache_options=options) as fh:
        reader = pq.ParquetFile(fh, metadata=f.footer, pre_buffer=False)
        return reader.read_row_groups(list(case.groups), columns=case.columns, use_threads=False)


def read_open_parquet_file(fs, f: File, case: Case) -> pa.Table:
    columns = list(case.columns) if case.columns else None
    with open_parquet_file(
        f.path,
        fs=fs,
        columns=columns,
        row_groups=list(case.groups),
        engine="pyarrow",
        max_gap=HOLE_BYTES,
        max_block=MAX_REQUEST_BYTES,
    ) as fh:
        reader = pq.ParquetFile(fh, metadata=f.footer, pre_buffer=False)
        return reader.read_row_groups(list(case.groups), columns=case.columns, use_threads=False)


def read_pyarrow_prebuffer(fs, f: File, case: Case) -> pa.Table:
    with fs.open(f.path, "rb", size=f.size, cache_type="none") as fh:
        reader = pq.ParquetFile(fh, metadata=f.footer, pre_buffer=True)
        return reader.read_row_groups(list(case.groups), columns=case.columns, use_threads=False)


def read_pyarrow_cache_options(fs, f: File, case: Case) -> pa.Table:
    options = ds.ParquetFragmentScanOptions(
        pre_buffer=True,
        cache_options=pa.CacheOptions(
            hole_size_limit=HOLE_BYTES, range_size_limit=MAX_REQUEST_BYTES, lazy=False
        ),
    )
    fmt = ds.ParquetFileFormat(default_fragment_scan_options=options)
    arrow_fs = PyFileSystem(FSSpecHandler(fs))
    fragment = fmt.make_fragment(f.path, arrow_fs, row_groups=list(case.groups), file_size=f.size)
    columns = list(case.columns) if case.columns else None
    return fragment.to_table(columns=columns, use_threads=False)


STRATEGIES: dict[str, Callable] = {
    "iolib coalesce + RangedFile": read_iolib,
    "fsspec merge_offset_ranges + KnownPartsOfAFile": read_fsspec_parts,
    "fsspec open_parquet_file": read_open_parquet_file,
    "pyarrow pre_buffer (default CacheOptions)": read_pyarrow_prebuffer,
    "pyarrow fragment pre_buffer + CacheOptions(1 MiB, 64 MiB)": read_pyarrow_cache_options,
}


def store(latency_ms: float, mbps: float, block_size: int | None) -> fsspec.AbstractFileSystem:
    """A throttled local filesystem: counts requests and bytes whatever its speed. Buffered
    files read ahead `block_size` (the default 1 MiB, as s3fs does); 0 reads exactly."""
    options = {"latency_ms": latency_ms, "bandwidth_mbps": mbps, "skip_instance_cache": True}
    if block_size is not None:
        options["block_size"] = block_size
    return fsspec.filesystem("throttled", target_protocol="file", **options)


def measure(stores: dict[str, fsspec.AbstractFileSystem], f: File, case: Case, repeats: int):
    """Per strategy: median time, requests and bytes of one read. The strategies take
    turns within each repeat, so a load that comes and goes on a shared machine falls on
    all of them alike."""
    samples: dict[str, list[tuple[float, int, int]]] = {label: [] for label in STRATEGIES}
    for repeat in range(repeats + 1):  # the first is a warm-up (page cache, imports)
        for label, read in STRATEGIES.items():
            fs = stores[label]
            r0, b0 = fs.requests, fs.bytes_read
            start = time.perf_counter()
            read(fs, f, case)
            elapsed = time.perf_counter() - start
            if repeat:
                samples[label].append((elapsed, fs.requests - r0, fs.bytes_read - b0))
    return {
        label: {
            "ms": statistics.median(t for t, _, _ in rows) * 1e3,
            "requests": statistics.median(r for _, r, _ in rows),
            "bytes": statistics.median(b for _, _, b in rows),
        }
        for label, rows in samples.items()
    }


@click.command()
@click.option("--latency-ms", default=40.0, show_default=True, help="Slow store: first byte.")
@click.option("--mbps", default=5.0, show_default=True, help="Slow store: MB/s per request.")
@click.option("--repeats", default=7, show_default=True, help="Timed reads per cell, slow store.")
@click.option("--local-repeats", default=51, show_default=True, help="Timed reads, local disk.")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS / "ranges.md",
              show_default=True, help="Report.")  # fmt: skip
def main(latency_ms: float, mbps: float, repeats: int, local_repeats: int, out: Path) -> None:
    """Measure iolib's exact ranged reads against fsspec's and pyarrow's."""
    stores = [
        (f"throttled {latency_ms:g} ms, {mbps:g} MB/s per request", latency_ms, mbps, repeats),
        ("local disk (throttled:: with no delay, to count requests)", 0.0, 0.0, local_repeats),
    ]
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = write_files(Path(tmp))
        files = {}
        for name in {c.name for c in cases}:
            path = str(Path(tmp) / f"{name}.parquet")
            footer = pq.ParquetFile(path).metadata
            spans = [column_spans(footer.row_group(g)) for g in range(footer.num_row_groups)]
            files[name] = File(path, Path(path).stat().st_size, footer, spans)
        for title, lat, bw, reps in stores:
            rows = []
            for case in cases:
                f = files[case.name]
                expected = read_iolib(store(0, 0, None), f, case)
                # pyarrow's reads go through a buffered fsspec file: give it one that
                # reads exactly (block 0), so read-ahead does not count against it.
                stores = {
                    label: store(lat, bw, 0 if label.startswith("pyarrow") else None)
                    for label in STRATEGIES
                }
                for label, read in STRATEGIES.items():
                    if not read(stores[label], f, case).equals(expected):
                        raise AssertionError(f"{label} read other data for {case.label}")
                for label, m in measure(stores, f, case, reps).items():
                    rows.append((case.label, label, m))
                    click.echo(f"{title} | {case.label} | {label} | {m}")
            sections.append((title, reps, rows))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(sections, latency_ms, mbps, repeats, local_repeats))
    click.echo(out.read_text())


def render(sections, latency_ms, mbps, repeats, local_repeats) -> str:
    lines = [
        "# Exact ranged reads: iolib against fsspec and pyarrow",
        "",
        f"`python benchmarks/bench_ranges.py --latency-ms {latency_ms:g} --mbps {mbps:g} "
        f"--repeats {repeats} --local-repeats {local_repeats}` (2-core machine, shared). "
        "Each cell: median over the repeats (after one warm-up; the strategies take turns "
        "within a repeat) of one batch read from a fresh handle with the footer known; "
        "requests and bytes counted by `throttled::`. "
        "Every strategy's table is checked equal to iolib's.",
        "",
    ]
    for title, reps, rows in sections:
        lines += [f"## {title} (median of {reps})", ""]
        lines += [
            "| read | strategy | requests | bytes | ms | time / iolib's |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        ours = {case: m["ms"] for case, label, m in rows if label.startswith("iolib")}
        for case, label, m in rows:
            lines.append(
                f"| {case} | {label} | {m['requests']:g} | {m['bytes']:,.0f} | {m['ms']:.2f} "
                f"| {m['ms'] / ours[case]:.2f} |"
            )
        lines.append("")
    lines += [
        "## What iolib keeps",
        "",
        "The decision and its figures are in `iolib/sources/ranges.py`'s docstring: "
        "`coalesce` is fsspec's `merge_offset_ranges` (the same requests and bytes in every "
        "cell); `RangedFile` stays, for what `KnownPartsOfAFile` does not do (a read outside "
        "the loaded parts, short bodies, servers that ignore ranges, file systems whose "
        "`open` ignores `cache_type`) and a copy fewer per read.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
