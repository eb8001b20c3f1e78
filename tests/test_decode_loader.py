"""ImagePipeline inside iolib.DataLoader: bit-identical batches for any worker count and
prefetch depth, and after a resume; skipped samples leave every column.

Skipped where ``iolib.loader`` is absent (this module was written against its contract).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("nvidia.dali", reason="DALI is not installed")
loader_mod = pytest.importorskip("iolib.loader", reason="iolib.loader not present")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from iolib.decode.images import ImagePipeline  # noqa: E402
from iolib.sources import ParquetSource  # noqa: E402
from tests.image_samples import bad_blob, encode, make_image  # noqa: E402

ROWS = 40


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> str:
    blobs = [encode(make_image(i), "JPEG") for i in range(ROWS)]
    blobs[13] = bad_blob("truncated", blobs[13])
    table = pa.table(
        {
            "image": pa.array(blobs, pa.binary()),
            "label": pa.array(range(ROWS), pa.int64()),
            "path": pa.array([f"img/{i}.jpg" for i in range(ROWS)]),
        }
    )
    path = tmp_path_factory.mktemp("shards") / "part-000.parquet"
    pq.write_table(table, path, row_group_size=10)
    return str(path)


def _loader(shard: str, **kw):
    decode = ImagePipeline(size=32, device="cpu", threads=1, on_error="skip")
    kw.setdefault("num_workers", 0)
    return loader_mod.DataLoader(
        ParquetSource(shard), batch_size=8, shuffle=True, seed=3, decode=decode, **kw
    )


def _collect(loader, limit: int | None = None) -> list[dict]:
    out = []
    for batch in loader:
        out.append(batch)
        if limit is not None and len(out) == limit:
            break
    return out


def _assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x["image"], y["image"])
        assert torch.equal(x["label"], y["label"]) and x["path"] == y["path"]


def test_same_batches_for_any_workers_and_depth(shard):
    base = _collect(_loader(shard))
    assert 13 not in torch.cat([b["label"] for b in base]).tolist()  # skipped everywhere
    assert sum(len(b["label"]) for b in base) == ROWS - 1
    for b in base:
        assert [f"img/{i}.jpg" for i in b["label"].tolist()] == b["path"]
    _assert_same(base, _collect(_loader(shard, num_workers=2)))
    _assert_same(base, _collect(_loader(shard, num_workers=2, prefetch_factor=1)))


def test_resume_gives_the_same_remaining_batches(shard):
    base = _collect(_loader(shard))
    first = _loader(shard, num_workers=2)
    _collect(first, limit=2)
    state = first.state_dict()
    resumed = _loader(shard, num_workers=1)
    resumed.load_state_dict(state)
    _assert_same(base[2:], _collect(resumed))


def test_epochs_draw_new_crops(shard):
    loader = _loader(shard)
    one = _collect(loader)
    loader.set_epoch(1)
    two = _collect(loader)
    assert not torch.equal(one[0]["image"], two[0]["image"])


def test_exit_after_an_epoch_with_persistent_dali_workers_is_clean(shard):
    """DALI's exit hook asserts that no pipeline is alive; persistent workers reading the
    next epoch ahead held one. iolib's hook (iolib.base.shutdown) stops them first."""
    import subprocess
    import sys

    script = f"""
from iolib import DataLoader
from iolib.decode.images import ImagePipeline
from iolib.sources import ParquetSource
decode = ImagePipeline(size=32, device="cpu", threads=1, on_error="skip", backend="dali")
loader = DataLoader(ParquetSource({shard!r}), batch_size=8, shuffle=True, seed=3,
                    decode=decode, num_workers=2, persistent_workers=True)
print(sum(len(b["label"]) for b in loader))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROWS - 1)
    assert "Traceback" not in done.stderr and "AssertionError" not in done.stderr, done.stderr
