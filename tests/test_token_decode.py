"""A token row group is decoded in record batches and packed as they come (issue 43, "peak
PSS at or below the lowest peer's"): the segment is the one a whole read makes, bit for
bit, and Arrow's peak while reading one stays near the row group's own size (read whole,
pyarrow held 2.1x it: pages, levels and values at once)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iolib.plan import stream_rng
from iolib.sources import ParquetSource
from iolib.text.packed_reader import Segment
from tests.token_data import doc_lengths, write_documents

ROOT = Path(__file__).resolve().parent.parent
EOS = 0


def _same(a: Segment, b: Segment) -> None:
    assert np.array_equal(a.stream(EOS), b.stream(EOS))
    assert {t.dtype for t in a.tokens} == {t.dtype for t in b.tokens}
    for name in ("starts", "rows"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name


@pytest.mark.parametrize("rows_a_batch", [1, 7, 64, 10_000])
@pytest.mark.parametrize("shuffled", [False, True])
def test_a_segment_built_from_record_batches_is_the_whole_reads(
    tmp_path: Path, rows_a_batch: int, shuffled: bool
) -> None:
    """Empty documents, null rows and batches that end mid-group alike: the same tokens,
    document starts and rows as the segment of the row group read whole."""
    lengths = doc_lengths(300, seed=5, low=0, high=50)
    url = write_documents(tmp_path / "c", lengths, shards=1, row_group_size=300,
                          nulls=(3, 4, 150))  # fmt: skip
    path = f"{url}/part-0.parquet"
    whole = pq.ParquetFile(path).read_row_group(0).column("tokens")
    assert whole.num_chunks == 1
    batches = pq.ParquetFile(path).iter_batches(batch_size=rows_a_batch, row_groups=[0])
    chunks = [b.column(b.schema.get_field_index("tokens")) for b in batches]
    if rows_a_batch < 300:
        assert len(chunks) > 1

    def order() -> np.random.Generator | None:
        return stream_rng(3, 1, 0) if shuffled else None

    want = Segment.build(whole, 40, order(), epoch=1)
    as_one = pa.chunked_array(chunks, type=whole.type)  # a ChunkedArray in several chunks
    _same(Segment.build(as_one, 40, order(), epoch=1), want)
    _same(Segment.build(chunks, 40, order(), epoch=1), want)
    assert all(chunk is None for chunk in chunks)  # a list is consumed: each let go once read


def test_an_empty_column_builds_an_empty_segment() -> None:
    kind = pa.list_(pa.int32())
    for array in (pa.chunked_array([], type=kind), [pa.array([], type=kind)]):
        segment = Segment.build(array, 0, None)
        assert segment.stream(EOS).size == 0 and segment.tokens[0].dtype == np.int32
        assert segment.starts.tolist() == [0] and segment.rows.size == 0


def test_a_fetched_row_group_holds_the_whole_reads_values(tmp_path: Path) -> None:
    """`fetch_row_group` (the token readers' read) decodes in record batches: the same
    values in several chunks."""
    lengths = doc_lengths(2000, seed=1, low=0, high=400)
    url = write_documents(tmp_path / "c", lengths, shards=1, row_group_size=2000)
    source = ParquetSource(url, columns=["tokens"])
    fetched = source.fetch_row_group(0).column("tokens")
    whole = pq.ParquetFile(f"{url}/part-0.parquet").read_row_group(0).column("tokens")
    assert fetched.num_chunks >= 1 and fetched.equals(whole)
    source.close()


def test_arrows_peak_while_a_token_row_group_is_read_stays_near_its_size(tmp_path: Path) -> None:
    """One row group of 6 M int32 tokens (24 MB decoded) read by `PackedTokens` in a fresh
    interpreter: Arrow's default pool peaks at most 1.6x
    the row group's decoded bytes, a record batch and a page's buffers besides (2.9x when it
    was decoded whole)."""
    rng = np.random.default_rng(0)
    sizes = np.maximum(1, rng.lognormal(np.log(400), 1.0, 20_000).astype(np.int64))
    sizes = sizes[: int(np.searchsorted(np.cumsum(sizes), 6_000_000))]
    values = rng.integers(1, 50_000, int(sizes.sum()), dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int32))
    tokens = pa.ListArray.from_arrays(offsets, pa.array(values))
    pq.write_table(pa.table({"tokens": tokens}), tmp_path / "t.parquet")
    assert pq.ParquetFile(tmp_path / "t.parquet").num_row_groups == 1
    decoded = values.nbytes + offsets.nbytes
    code = textwrap.dedent(f"""
        import pyarrow as pa
        from iolib import DataLoader
        from iolib.text import PackedTokens
        windows = PackedTokens({str(tmp_path / "t.parquet")!r}, column="tokens", seq_len=512,
                               eos_id=0)
        next(iter(DataLoader(windows, batch_size=4, shuffle=True)))
        print(pa.default_memory_pool().max_memory())
    """)
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env.update(PYTHONPATH=str(ROOT), IOLIB_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=300)  # fmt: skip
    peak = int(done.stdout.split()[-1])
    assert peak <= 1.6 * decoded, f"Arrow peaked at {peak / decoded:.2f}x the row group"
