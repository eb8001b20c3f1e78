"""Run the code blocks of README.md and docs/*.md as tests (Sybil).

Each guide is one test module: its Python blocks share one namespace, in order, in a
fresh working directory that holds small data under the names the guides use
(``data/train``, an image folder of mixed sizes; ``data/train-parquet``, its Parquet
shards; none for a guide that makes its own), with moto's S3 server standing in for
``s3://bucket``. A ``bash`` block runs
its ``iolib ...`` commands in-process; any other command must be marked as a fragment
with ``<!-- skip: next "why" -->`` just above the block, and the runnable version
named next to it.
"""

from __future__ import annotations

import doctest
import io
import os
import shlex
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

# The guides' S3 examples read these, as a user's script would read its credentials.
S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "S3_ENDPOINT_URL")
S3_BUCKET = "bucket"
# Guides that make all their data themselves (the quickstart walks it end to end): they
# start in an empty directory.
MAKES_ITS_OWN_DATA = {"quickstart.md"}


def write_mixed_image_folder(root: Path, classes: int = 3, per_class: int = 6) -> Path:
    """JPEGs of several sizes and aspect ratios (and one PNG), as a real folder holds."""
    rng = np.random.default_rng(0)
    sizes = [(48, 40), (64, 64), (40, 72), (96, 56), (33, 47), (80, 80)]
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = sizes[(c + i) % len(sizes)]
            pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            fmt, ext = ("PNG", "png") if (c, i) == (0, 1) else ("JPEG", "jpg")
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format=fmt)
            (folder / f"img_{i:03d}.{ext}").write_bytes(buffer.getvalue())
    return root


def make_workspace(directory: Path, guide: str) -> None:
    """The data every guide reads, under `directory` (the guide's working directory)."""
    from iolib.cli import main

    if guide in MAKES_ITS_OWN_DATA:
        return
    data = directory / "data"
    write_mixed_image_folder(data / "train")
    run_iolib(main, ["convert", str(data / "train"), str(data / "train-parquet"),
                     "--rows-per-group", "6"])  # fmt: skip


def upload_to_s3(options: dict[str, Any], directory: Path) -> None:
    """s3://bucket/imagenet/{train,val}/: the Parquet shards, as the S3 examples expect."""
    import s3fs

    shards = directory / "data" / "train-parquet"
    if not shards.exists():
        return
    fs = s3fs.S3FileSystem(**options)
    if not fs.exists(S3_BUCKET):
        fs.mkdir(S3_BUCKET)
    for split in ("train", "val"):
        fs.put(f"{shards}/", f"{S3_BUCKET}/imagenet/{split}/",
               recursive=True)  # fmt: skip


def run_iolib(main: Any, args: list[str]) -> None:
    try:
        main(args)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise AssertionError(f"`iolib {shlex.join(args)}` exited with {exc.code}") from None


def commands(source: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in source.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        argv = shlex.split(pending + line, comments=True)
        pending = ""
        if argv:
            out.append(argv)
    return out


def evaluate_bash(example: Any) -> None:
    from iolib.cli import main

    for argv in commands(example.parsed):
        if argv[0] != "iolib":
            raise AssertionError(
                f"{example.path}, line {example.line}: `{shlex.join(argv)}` is not an iolib "
                'command; run it here or mark the block <!-- skip: next "why" -->.'
            )
        run_iolib(main, argv[1:])


def sybil_collector() -> Any:
    from sybil import Sybil
    from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    return Sybil(
        parsers=[
            PythonCodeBlockParser(doctest_optionflags=flags),
            CodeBlockParser("bash", evaluate_bash),
            SkipParser(),
        ],
        path=str(Path(__file__).resolve().parent.parent),  # the repository root
        patterns=["README.md", "docs/*.md"],
        fixtures=["docs_workspace"],
    ).pytest()


def s3_environment(options: dict[str, Any]) -> dict[str, str]:
    return dict(zip(S3_ENV, (options["key"], options["secret"], options["endpoint_url"]),
                    strict=True))  # fmt: skip


def chdir(path: Path) -> Any:
    previous = os.getcwd()
    os.chdir(path)
    return previous
