"""`iolib inspect URL`: what a dataset holds, before a loader reads it.

For Parquet (a file, a directory or a glob): files, rows, row groups (count and
min/median/max rows), the schema, and bytes (total and compressed per column), all from
the footers, so no data page is read. For an image folder: classes, images per class
and bytes, from one listing. ``--json`` prints the same figures for machines.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import click
import numpy as np

from iolib.cli.common import as_given, storage_options_option
from iolib.errors import DataError
from iolib.storage import open_filesystem

_PARQUET_SUFFIXES = (".parquet", ".pq")
_MAX_FILES_SHOWN = 20  # in the text report; --json lists all


def detect_format(url: str, options: dict[str, Any]) -> str:
    """'parquet' for a Parquet file, a glob or a directory holding Parquet files; else
    'images' for a directory (an image folder)."""
    if not url.strip():
        raise DataError("URL is empty: name a Parquet file, directory, glob or image folder.")
    fs, path = open_filesystem(url, options)
    if any(c in path for c in "*?[") or path.endswith(_PARQUET_SUFFIXES):
        return "parquet"
    if not fs.exists(path):
        raise DataError(f"{url!r} does not exist. Check the path (and -o storage options).")
    if not fs.isdir(path):
        return "parquet"
    found = fs.ls(path, detail=False)  # the directory's own files, as ParquetSource reads
    return "parquet" if any(p.endswith(_PARQUET_SUFFIXES) for p in found) else "images"


def parquet_summary(urls: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """Footer figures of every file that ``ParquetSource(urls)`` would read."""
    from iolib.sources import ParquetSource

    files = ParquetSource(urls, storage_options=options).files
    groups = np.array([n for f in files for n in f.row_groups], dtype=np.int64)
    column_bytes: dict[str, int] = {}
    for f in files:
        for group in f.column_bytes:
            for name, size in group.items():
                column_bytes[name] = column_bytes.get(name, 0) + size
    schema = files[0].schema
    summary: dict[str, Any] = {
        "format": "parquet",
        "urls": list(urls),
        "files": len(files),
        "rows": int(groups.sum()),
        "row_groups": {
            "count": int(groups.size),
            "min_rows": int(groups.min()) if groups.size else 0,
            "median_rows": float(np.median(groups)) if groups.size else 0.0,
            "max_rows": int(groups.max()) if groups.size else 0,
        },
        "schema": {field.name: str(field.type) for field in schema},
        "bytes": {"total": sum(f.size for f in files), "columns": column_bytes},
        "per_file": [
            {
                "url": as_given(f.url, urls[f.root]),
                "rows": sum(f.row_groups),
                "row_groups": len(f.row_groups),
                "bytes": f.size,
            }
            for f in files
        ],
    }
    differ = [as_given(f.url, urls[f.root]) for f in files if not f.schema.equals(schema)]
    if differ:
        summary["schema_differs"] = differ
    classes = _classes_file(urls[0], options) if len(urls) == 1 else None
    if classes is not None:
        summary["class_names"] = classes
    return summary


def _classes_file(url: str, options: dict[str, Any]) -> list[str] | None:
    """The class names that `iolib convert` wrote next to the shards, if any."""
    fs, path = open_filesystem(url, options)
    if any(c in path for c in "*?[") or not fs.isdir(path):
        return None
    name = posixpath.join(path, "_classes.json")
    if not fs.exists(name):
        return None
    return json.loads(fs.cat_file(name))


def image_summary(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """Classes, images per class and bytes of an image folder (one listing)."""
    from iolib.sources import ImageFolderSource

    source = ImageFolderSource(url, options)
    fs, root = open_filesystem(url, options)
    sizes = {p: info["size"] for p, info in fs.find(root, detail=True).items()}
    prefix = root.rstrip("/") + "/"
    per_class = {
        name: {"class": name, "label": i, "images": 0, "bytes": 0}
        for i, name in enumerate(source.classes)
    }
    for path in source.paths:
        # ImageFolderSource has no public labels: the class is the first path component.
        entry = per_class[path[len(prefix) :].split("/", 1)[0]]
        entry["images"] += 1
        entry["bytes"] += sizes.get(path, 0)
    return {
        "format": "images",
        "url": url,
        "classes": len(source.classes),
        "images": len(source),
        "bytes": {"total": sum(e["bytes"] for e in per_class.values())},
        "per_class": list(per_class.values()),
    }


def _size(n: float) -> str:
    """Bytes for people: 1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _table(rows: list[tuple[str, ...]], right: tuple[int, ...] = ()) -> list[str]:
    """Plain aligned columns; columns listed in `right` are right-aligned (numbers)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def format_text(summary: dict[str, Any]) -> str:
    """The summary as a readable report for a terminal."""
    if summary["format"] == "images":
        lines = [
            f"Image folder {summary['url']}",
            f"  classes  {summary['classes']}",
            f"  images   {summary['images']}",
            f"  bytes    {summary['bytes']['total']} ({_size(summary['bytes']['total'])})",
            "",
            "Images per class",
        ]
        rows = [("label", "class", "images", "bytes")] + [
            (str(e["label"]), e["class"], str(e["images"]), _size(e["bytes"]))
            for e in summary["per_class"]
        ]
        return "\n".join(lines + _table(rows, right=(0, 2, 3)))
    groups = summary["row_groups"]
    total = summary["bytes"]["total"]
    lines = [
        f"Parquet {' '.join(summary['urls'][:3])}{' ...' if len(summary['urls']) > 3 else ''}",
        f"  files       {summary['files']}",
        f"  rows        {summary['rows']}",
        f"  row groups  {groups['count']} (rows per group: min {groups['min_rows']}, "
        f"median {groups['median_rows']:g}, max {groups['max_rows']})",
        f"  bytes       {total} ({_size(total)})",
    ]
    if "class_names" in summary:
        lines.append(f"  classes     {len(summary['class_names'])} (from _classes.json)")
    if "schema_differs" in summary:
        lines.append(
            f"  WARNING: schema differs from the first file in {summary['schema_differs']}"
        )
    columns = summary["bytes"]["columns"]
    rows = [("column", "type", "compressed")] + [
        (name, kind, _size(columns.get(name, 0))) for name, kind in summary["schema"].items()
    ]
    lines += ["", "Schema", *_table(rows, right=(2,))]
    files = [("file", "rows", "row groups", "bytes")] + [
        (f["url"], str(f["rows"]), str(f["row_groups"]), _size(f["bytes"]))
        for f in summary["per_file"]
    ]
    shown = files[: _MAX_FILES_SHOWN + 1]
    lines += ["", "Files", *_table(shown, right=(1, 2, 3))]
    if len(files) > len(shown):
        lines.append(f"  ... and {len(files) - len(shown)} more (--json lists every file)")
    return "\n".join(lines)


@click.command("inspect")
@click.argument("urls", metavar="URL...", nargs=-1, required=True)
@storage_options_option
@click.option(
    "--format",
    "kind",
    type=click.Choice(["auto", "parquet", "images"]),
    default="auto",
    show_default=True,
    help="What URL holds; auto: Parquet if it is a .parquet file, a glob or a directory "
    "with Parquet files, else an image folder.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (for machines) instead.")
def inspect(
    urls: tuple[str, ...], storage_options: dict[str, Any], kind: str, as_json: bool
) -> None:
    """Show what URL holds: a Parquet file, directory or glob (files, rows, row groups,
    schema, bytes) or an image folder (classes, images per class, bytes).

    URL is a path or an fsspec URL; several Parquet files may be given (as a shell
    expands a glob). Parquet figures come from the footers only, no data is read.

    Example: iolib inspect 's3://bucket/train/*.parquet' -o anon=true --json
    """
    options = storage_options
    if kind == "auto":
        kind = "parquet" if len(urls) > 1 else detect_format(urls[0], options)
    if kind == "images" and len(urls) > 1:
        raise click.UsageError(f"Give one image folder; found {len(urls)} URLs.")
    if kind == "parquet":
        summary = parquet_summary(list(urls), options)
    else:
        summary = image_summary(urls[0], options)
    click.echo(json.dumps(summary, indent=2) if as_json else format_text(summary))
