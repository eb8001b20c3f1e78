"""Shared fixtures: small real datasets made at test time (Parquet, JPEG folders)."""

from __future__ import annotations

import atexit
import importlib
import io
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

# Every prefetch="auto" run records itself in the run history: never in the user's cache,
# and (below) in a history of each test's own, so no test warm-starts from another.
os.environ["IOLIB_HISTORY"] = tempfile.mkdtemp(prefix="iolib-history-")
atexit.register(shutil.rmtree, os.environ["IOLIB_HISTORY"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_history(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("IOLIB_HISTORY", str(tmp_path_factory.mktemp("history")))


@pytest.fixture(scope="module")
def one_openmp_thread():
    """scikit-learn's tree fits on one OpenMP thread (the lab's tests). The trees are the
    same on any number of threads; on a busy 2-core machine a team of 2 spin-waits on a
    descheduled member, and a fit that takes 0.3 s took 18 s (one core kept busy)."""
    import sklearn.ensemble  # noqa: F401 - loads its OpenMP runtime, which the limit finds
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="openmp"):
        yield


# IOLIB_REQUIRE=dali,moto,s3fs,aiohttp (.ci/run sets it): a listed dependency that does not
# import fails its tests instead of skipping them, so a broken install cannot leave a run
# green. A name matches any dotted part of the module ("dali" matches "nvidia.dali").
REQUIRED = frozenset(w.strip() for w in os.environ.get("IOLIB_REQUIRE", "").split(",") if w)
_importorskip = pytest.importorskip


def _required(modname: str) -> bool:
    return "all" in REQUIRED or bool(REQUIRED & set(modname.split(".")))


def importorskip_unless_required(modname: str, *args, **kwargs):
    """`pytest.importorskip`, except that a module named in IOLIB_REQUIRE must import."""
    if _required(modname):
        try:
            return importlib.import_module(modname)
        except Exception as exc:  # a broken install: an error, never a skip
            raise pytest.fail.Exception(
                f"{modname} is required here (IOLIB_REQUIRE={os.environ['IOLIB_REQUIRE']!r}) "
                f"but does not import: {type(exc).__name__}: {exc}",
                pytrace=False,
            ) from exc
    return _importorskip(modname, *args, **kwargs)


pytest.importorskip = importorskip_unless_required


def run_cli(capture: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """Run the `iolib` console entry point in this process: (exit code, stdout, stderr)."""
    from iolib.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capture.readouterr()
    return code, captured.out, captured.err


def write_parquet_shards(
    directory: Path, rows: int, *, shards: int = 3, row_group_size: int = 17, seq_len: int = 8
) -> list[str]:
    """Token-style shards: `id` (int64), `label` (int32), `tokens` (fixed-size int32 list)."""
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, shards + 1).astype(int)
    paths = []
    for s in range(shards):
        ids = np.arange(bounds[s], bounds[s + 1], dtype=np.int64)
        tokens = (ids[:, None] * 31 + np.arange(seq_len)).astype(np.int32) % 50_000
        table = pa.table(
            {
                "id": ids,
                "label": (ids % 7).astype(np.int32),
                "tokens": pa.FixedSizeListArray.from_arrays(pa.array(tokens.ravel()), seq_len),
            }
        )
        path = directory / f"part-{s:03d}.parquet"
        pq.write_table(table, path, row_group_size=row_group_size)
        paths.append(str(path))
    return paths


def jpeg_bytes(seed: int, size: tuple[int, int] = (40, 32)) -> bytes:
    """A small JPEG with content that depends on `seed`."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def write_image_folder(root: Path, classes: int = 3, per_class: int = 7) -> Path:
    for c in range(classes):
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            (folder / f"img_{i:03d}.jpg").write_bytes(jpeg_bytes(c * 1000 + i))
    return root


@pytest.fixture
def token_dir(tmp_path: Path) -> Path:
    """100 rows in 3 shards of row groups of 17."""
    write_parquet_shards(tmp_path / "tokens", 100)
    return tmp_path / "tokens"


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    return write_image_folder(tmp_path / "images")
