"""PackedTokens on a corpus larger than its `shuffle_window`: the streamed path keeps every
promise of the in-memory one (each token once, in order; the same windows for any
workers, depth, resume point or world size) with memory bounded by the budget."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from iolib import DataLoader
from iolib.errors import ConfigError
from iolib.loader.testing import (
    assert_checkpoint_roundtrip,
    assert_same_batches_across_workers,
    epoch_batches,
)
from iolib.sources.parquet_fetch import decode_slots
from iolib.text import PackedTokens
from iolib.text.packed import FETCH_THREADS
from iolib.text.tokenindex import beside_url, cache_dir
from tests.token_data import doc_lengths, write_documents

EOS, SEQ, ROWS = 0, 16, 16
LENGTHS = doc_lengths(400, seed=3, low=0, high=60)
BUDGET = 20_000  # bytes: about six of this corpus's 25 row groups, a third of the corpus
WINDOW = BUDGET // 2  # two windows fit the budget
WHOLE = 10**8  # a window and a cache that hold the whole corpus: a full shuffle


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_documents(tmp_path / "c", LENGTHS, shards=3, row_group_size=ROWS)


def _packed(url: str, budget: int = BUDGET, window: int = WINDOW, **kw) -> PackedTokens:
    return PackedTokens(url, column="tokens", seq_len=SEQ, eos_id=EOS, document_ids=True,
                        cache_bytes=budget, shuffle_window=window, **kw)  # fmt: skip


def _loader(url: str, lanes: int | str = "auto", **kw) -> DataLoader:
    kw.setdefault("batch_size", 4)
    return DataLoader(_packed(url, lanes=lanes), shuffle=True, seed=11, **kw)


def _epoch_tokens(batches) -> tuple[np.ndarray, np.ndarray]:
    ids = np.concatenate([b["input_ids"] for b in batches])
    docs = np.concatenate([b["document_ids"] for b in batches])
    return ids, docs


def test_the_corpus_is_larger_than_the_budget_and_the_log_says_so(corpus, caplog) -> None:
    windows = _packed(corpus)
    assert windows.shuffle_window_groups() < len(windows.parquet.blocks())
    with caplog.at_level(logging.INFO, logger="iolib.text.packed"):
        epoch_batches(_loader(corpus))
        epoch_batches(_loader(corpus))  # a new loader of the same source: logged once each
    said = [r for r in caplog.records if "shuffled within" in r.getMessage()]
    assert said and "shuffle_window" in said[0].getMessage()


@pytest.mark.parametrize("epoch", [0, 1])
def test_every_token_once_in_order_when_streamed(corpus, epoch) -> None:
    ids, docs = _epoch_tokens(epoch_batches(_loader(corpus), epoch))
    present = [d for d in range(len(LENGTHS)) if LENGTHS[d]]
    seen: dict[int, list[int]] = {}
    for token, doc in zip(ids.reshape(-1).tolist(), docs.reshape(-1).tolist(), strict=True):
        if token != EOS:
            assert token // 1000 == doc
            seen.setdefault(doc, []).append(token % 1000 - 1)
    # Windows come shuffled: each document's tokens are there once, and in order within
    # each window (a document cut by window boundaries continues in another window).
    assert all(sorted(v) == list(range(len(v))) for v in seen.values()), "a token twice"
    same = (docs[:, 1:] == docs[:, :-1]) & (ids[:, 1:] != EOS) & (ids[:, :-1] != EOS)
    assert ((ids[:, 1:] - ids[:, :-1])[same] == 1).all(), "a document out of order"
    whole = [d for d in seen if len(seen[d]) == LENGTHS[d]]
    assert len(whole) >= len(present) - 1 and set(seen) <= set(present)
    total = sum(int(LENGTHS[d]) + 1 for d in present)
    assert total - SEQ < ids.size <= total  # only the last partial window is missing


def test_a_batch_reads_only_its_chunk(corpus) -> None:
    """The windowed shuffle: a batch's windows come from one chunk of row groups that
    the cache holds (plus the row groups at the chunk's edges; a batch that straddles two
    chunks takes from both), where a full shuffle takes from nearly every row group."""

    starts = _packed(corpus).parquet.row_starts()

    def spread(loader: DataLoader) -> float:
        groups = [np.searchsorted(starts, np.asarray(b["document_ids"]), side="right")
                  for b in epoch_batches(loader)]  # fmt: skip
        return float(np.percentile([np.unique(g).size for g in groups], 75))

    held = _packed(corpus).shuffle_window_groups() + 2
    assert spread(_loader(corpus, batch_size=16)) <= held
    whole = DataLoader(_packed(corpus, WHOLE, WHOLE), batch_size=16, shuffle=True, seed=11)
    assert spread(whole) > held + 2
    # shuffle="global", spelled out, is a full shuffle within the same small budget.
    spelled_out = DataLoader(_packed(corpus), batch_size=16, shuffle="global", seed=11)
    assert spread(spelled_out) > held + 2


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("workers", [0, 2])
def test_each_row_group_is_read_once_an_epoch_when_streamed(corpus, world_size, workers):
    """Chunks are whole row groups, and the window that straddles two is cut from a piece
    of the one read first: a streamed epoch fetches, on each rank, the bytes that an
    epoch held whole in the cache does, no more."""

    def fetched(budget: int, epoch: int, rank: int) -> int:
        where = {"rank": rank, "world_size": world_size, "num_workers": workers}
        window = WINDOW if budget == BUDGET else budget
        loader = DataLoader(_packed(corpus, budget, window), batch_size=4, shuffle=True, seed=11,
                            **where)  # fmt: skip
        epoch_batches(loader, epoch)
        return loader.stats()["bytes_read"]

    for epoch, rank in [(e, r) for e in (0, 1) for r in range(world_size)]:
        assert fetched(BUDGET, epoch, rank) == fetched(WHOLE, epoch, rank)


def _read_threads_seen(url: str, **kw) -> int:
    """Read threads alive at any batch of an epoch held whole: its first batch asks for
    every row group at once."""
    windows = PackedTokens(url, column="tokens", seq_len=SEQ, eos_id=EOS, cache_bytes=10**8,
                           **kw)  # fmt: skip
    seen: set[str] = set()
    for _ in DataLoader(windows, batch_size=16, shuffle=True, seed=11):
        seen |= {t.name for t in threading.enumerate() if t.name.startswith("iolib-tokens")}
    return len(seen)


@pytest.mark.parametrize("form", ["{}", "file://{}"])
def test_local_reads_run_on_as_many_threads_as_decode_at_once(corpus, form) -> None:
    """From local disk (a path or a file:// URL) a read is all decode: reads in flight
    are capped at the decode slots (each more thread's allocator kept what its reads
    freed); from a store behind a wrapper, even one over local files, FETCH_THREADS run at
    once (a store's rate per connection is far below its total)."""
    seen = _read_threads_seen(form.format(corpus))
    assert seen >= 1 and seen <= decode_slots()
    fast = {"throttled": {"latency_ms": 0, "skip_instance_cache": True}}
    remote = _read_threads_seen(f"throttled::file://{corpus}", storage_options=fast)
    assert remote == FETCH_THREADS  # 25 row groups asked for at once


def test_windows_mix_across_the_epoch(corpus) -> None:
    """Shuffled, not sequential: the first batch of two epochs differ, and the epoch's
    windows are not in stream order."""
    first = [epoch_batches(_loader(corpus), e)[0]["input_ids"] for e in (0, 1)]
    assert not np.array_equal(first[0], first[1])
    plain = DataLoader(_packed(corpus), batch_size=4, shuffle=False, seed=11)
    shuffled, ordered = _epoch_tokens(epoch_batches(_loader(corpus)))[0], None
    ordered = _epoch_tokens(epoch_batches(plain))[0]
    assert not np.array_equal(shuffled, ordered)
    assert sorted(map(tuple, shuffled.tolist())) == sorted(map(tuple, ordered.tolist()))


def test_same_windows_for_any_workers_depth_and_resume_when_streamed(corpus) -> None:
    def make(**kw):
        return _loader(corpus, batch_size=3, **kw)

    settings = ({"num_workers": 0}, {"num_workers": 2, "prefetch": 5},
                {"num_workers": 2, "worker_mode": "process"})  # fmt: skip
    assert_same_batches_across_workers(make, settings, epochs=(0, 1))
    assert_checkpoint_roundtrip(make, stop_after=[1, 7, 20], epoch=1, num_workers=2)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_split_the_streamed_windows(corpus, world_size) -> None:
    def rows(rank: int, size: int) -> list[tuple[int, ...]]:
        loader = _loader(corpus, lanes=world_size, batch_size=2, rank=rank, world_size=size,
                         drop_last=True)  # fmt: skip
        return [tuple(r) for b in epoch_batches(loader, 1) for r in b["input_ids"].tolist()]

    whole = rows(0, 1)
    ranks = [rows(r, world_size) for r in range(world_size)]
    assert len({len(r) for r in ranks}) == 1  # equal batch counts on every rank
    merged = [row for step in zip(*[np.array_split(r, len(r) // 2) for r in ranks], strict=True)
              for part in step for row in map(tuple, part.tolist())]  # fmt: skip
    assert merged == whole[: len(merged)]
    resumed = _loader(corpus, lanes=world_size, batch_size=2, drop_last=True)
    stopped = _loader(corpus, lanes=world_size, batch_size=2, rank=1, world_size=world_size,
                      drop_last=True)  # fmt: skip
    stopped.set_epoch(1)
    it = iter(stopped)
    next(it)
    resumed.load_state_dict(json.loads(json.dumps(stopped.state_dict())))
    rest = [tuple(r) for b in resumed for r in b["input_ids"].tolist()]
    assert rest == whole[len(whole) - len(rest) :]


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_reads_its_share_of_the_corpus(corpus, world_size) -> None:
    """lanes="auto" (the world size): rank r's windows come from lane r, a contiguous
    share of the stream, so the ranks' row groups barely overlap and each reads about
    1/world of the bytes; together they still cover every window once."""
    whole = _packed(corpus)
    total = len(whole.parquet.blocks())
    starts = whole.parquet.row_starts()
    read, groups, windows = [], [], []
    for rank in range(world_size):
        loader = _loader(corpus, batch_size=2, rank=rank, world_size=world_size, drop_last=True)
        batches = epoch_batches(loader, 1)
        read.append(loader.stats()["bytes_read"])
        docs = np.concatenate([np.asarray(b["document_ids"]).reshape(-1) for b in batches])
        groups.append(set(np.searchsorted(starts, docs, side="right").tolist()))
        windows += [tuple(r) for b in batches for r in np.asarray(b["input_ids"]).tolist()]
    assert len(windows) == len(set(windows))  # no window twice across ranks
    assert len(windows) >= len(whole) - 2 * world_size  # drop_last's tail only
    for mine in groups:
        assert len(mine) <= total / world_size + 3, (len(mine), total)
    everyone = sum(read)
    assert max(read) <= 1.5 * everyone / world_size, read


def test_a_budget_below_four_row_groups_is_refused_up_front(corpus) -> None:
    with pytest.raises(ConfigError, match=r"cache_bytes.*fewer than 4.*Raise `cache_bytes`"):
        len(_packed(corpus, budget=2_000, window=1))
    with pytest.raises(ConfigError, match="cache_bytes"):
        _packed(corpus, budget=0)


def test_the_index_is_kept_and_a_rewritten_corpus_is_recounted(corpus, tmp_path) -> None:
    before = len(_packed(corpus, budget=10**6, window=10**6))
    kept = list(cache_dir().glob("*.npz"))
    assert len(kept) == 1
    # Rewrite in place with the same files and row counts, documents twice as long.
    write_documents(tmp_path / "c", LENGTHS * 2, shards=3, row_group_size=ROWS)
    assert len(_packed(corpus, budget=10**6, window=10**6)) > 1.8 * before
    assert len(list(cache_dir().glob("*.npz"))) == 2


def test_an_index_beside_the_data_is_used(corpus) -> None:
    from iolib.text.tokenindex import write_beside

    url, index = write_beside(_packed(corpus).parquet, "tokens")
    assert url == beside_url(_packed(corpus).parquet, "tokens")
    assert len(_packed(corpus)) == int(index.stream.sum()) // SEQ
    assert not list(cache_dir().glob("*.npz"))  # read from beside the data, not counted


RSS_SCRIPT = textwrap.dedent(
    """
    import itertools, resource, sys
    import numpy as np, pyarrow as pa, pyarrow.parquet as pq
    from iolib import DataLoader
    from iolib.text import PackedTokens
    url, budget = sys.argv[1], int(sys.argv[2])
    loader = DataLoader(PackedTokens(url, column="t", seq_len=512, eos_id=0,
                                     cache_bytes=budget, shuffle_window=budget // 2),
                        batch_size=8, shuffle=True,
                        num_workers=2, seed=0)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # 2,048 batches of 8 x 512 int32 tokens: 32 MiB read, four times the budget.
    windows = sum(len(b["input_ids"]) for b in itertools.islice(loader, 2048))
    print(windows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
    """
)


def _big_corpus(directory, tokens: int) -> str:
    """Documents of ~700 tokens in row groups of ~0.5 MB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir()
    rng = np.random.default_rng(0)
    lengths = rng.integers(200, 1200, size=tokens // 700)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(1, 50_000, size=int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({"t": column}), directory / "part.parquet", row_group_size=180)
    return str(directory)


@pytest.mark.slow
def test_memory_stays_flat_as_the_corpus_grows_past_the_budget(tmp_path) -> None:
    """Peak RSS while streaming a corpus 2x and 16x the budget (8 MiB): the larger corpus
    costs less than the difference between the two corpora's sizes."""
    budget, peaks = 8 * 2**20, []
    for scale in (2, 16):
        url = _big_corpus(tmp_path / f"x{scale}", scale * budget // 4)
        run = subprocess.run(
            [sys.executable, "-c", RSS_SCRIPT, url, str(budget)],
            capture_output=True, text=True, timeout=600, check=True,
        )  # fmt: skip
        windows, grown_kib = map(int, run.stdout.split())
        assert windows > 0
        peaks.append(grown_kib * 1024)
    assert peaks[1] - peaks[0] < 0.5 * (16 - 2) * budget, peaks


def test_a_parquet_source_larger_than_its_cache_shuffles_in_windows(tmp_path, caplog) -> None:
    """Padded reads: a global shuffle over more data than `shuffle_window` becomes a
    windowed one (said once), reads each row group once an epoch, and still covers every
    row once, the same for any workers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iolib.sources import ParquetSource

    directory = tmp_path / "rows"
    directory.mkdir()
    table = pa.table({"id": np.arange(4000), "x": np.random.default_rng(0).random(4000)})
    pq.write_table(table, directory / "a.parquet", row_group_size=100)

    def make(**kw) -> DataLoader:
        # Windows of 4 of 40 row groups; the cache holds two.
        source = ParquetSource(str(directory), cache_bytes=8 * 1700, shuffle_window=4 * 1700)
        return DataLoader(source, batch_size=50, shuffle=True, seed=1, **kw)

    with caplog.at_level(logging.INFO, logger="iolib.sources.parquet"):
        loader = make(num_workers=2)
        ids = np.concatenate([np.asarray(b["id"]) for b in loader])
    assert sorted(ids.tolist()) == list(range(4000))
    assert not np.array_equal(ids, np.arange(4000))
    assert loader.stats()["row_group_rereads"] == 0
    assert any("shuffled within windows" in r.getMessage() for r in caplog.records)
    assert_same_batches_across_workers(make, ({"num_workers": 0}, {"num_workers": 2}))


def test_a_bad_row_group_says_what_to_do_instead_of_skip(tmp_path) -> None:
    """Item 13 of issue 33: packed windows cannot skip a row group; the error says so and
    names the file and row group."""
    from iolib.errors import DataError

    bad = write_documents(tmp_path / "b", LENGTHS[:40] + 1, null_items=True, row_group_size=ROWS)
    with pytest.raises(DataError, match=r"part-1\.parquet.*row group.*cannot leave a row group"):
        len(_packed(bad))


@pytest.mark.parametrize("kind", ["int16", "uint16", "int32", "uint32", "int64"])
@pytest.mark.parametrize("large", [False, True])
def test_every_integer_type_and_list_layout_streams_the_same_tokens(tmp_path, kind, large):
    """The streamed path over each token type a tokenizer may write, in list and
    large_list: the same windows as int32, values kept exactly (the type's maximum too)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    top = int(np.iinfo(np.dtype(kind)).max)
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 100, size=int(n)).tolist() for n in rng.integers(1, 30, 120)]
    docs[7][0] = top  # the largest id survives the trip
    windows = {}
    for name, type_ in (("ref", pa.int64()), ("t", getattr(pa, kind)())):
        directory = tmp_path / name
        directory.mkdir()
        list_type = pa.large_list(type_) if large and name == "t" else pa.list_(type_)
        table = pa.table({"tokens": pa.array(docs, list_type)})
        pq.write_table(table, directory / "a.parquet", row_group_size=10)
        source = PackedTokens(str(directory), column="tokens", seq_len=8, eos_id=0,
                              cache_bytes=10**6)  # fmt: skip
        loader = DataLoader(source, batch_size=4, shuffle=True, seed=3)
        windows[name] = np.concatenate([np.asarray(b["input_ids"]) for b in loader])
    assert np.array_equal(windows["ref"], windows["t"])
    assert (windows["t"] == top).any()
