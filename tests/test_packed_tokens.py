"""PackedTokens: every token once per epoch, in order; windows a pure function of (seed,
epoch, seq_len, data) whatever the workers, depth, resume point or world size."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from iolib import DataLoader
from iolib.errors import ConfigError, DataError
from iolib.loader.testing import (
    assert_checkpoint_roundtrip,
    assert_same_batches_across_workers,
    epoch_batches,
)
from iolib.text import PackedTokens, cu_seqlens
from tests.token_data import doc_lengths, write_documents

EOS, SEQ = 0, 16
LENGTHS = doc_lengths(80, low=0, high=50)  # empty documents, and longer than SEQ
NULLS = (5, 41)


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_documents(tmp_path / "c", LENGTHS, nulls=NULLS, row_group_size=16)


def _packed(url: str, **kw) -> PackedTokens:
    return PackedTokens(url, column="tokens", seq_len=SEQ, eos_id=EOS, document_ids=True, **kw)


def _check_epoch(windows: np.ndarray, documents: np.ndarray) -> None:
    """`windows` [n, SEQ] in window order: each document's tokens appear once, in order,
    each followed by eos; only the stream's last partial window is missing."""
    stream = windows.reshape(-1)
    present = [d for d in range(len(LENGTHS)) if LENGTHS[d] and d not in NULLS]
    seen: dict[int, list[int]] = {}
    for token, doc in zip(stream.tolist(), documents.reshape(-1).tolist(), strict=True):
        if token != EOS:
            assert token // 1000 == doc
            seen.setdefault(doc, []).append(token % 1000 - 1)
    total = sum(int(LENGTHS[d]) + 1 for d in present)
    assert total - SEQ < stream.size <= total
    complete = [d for d in seen if len(seen[d]) == LENGTHS[d]]
    for d, positions in seen.items():
        assert positions == list(range(len(positions))), f"document {d} out of order"
    assert len(complete) >= len(present) - 1  # at most the last document is cut short
    assert set(seen) <= set(present)
    assert len(seen) == len(present) or len(seen) == len(present) - 1


def test_every_token_appears_once_per_epoch_in_order(corpus) -> None:
    windows = {}
    for shuffle in (False, True):
        loader = DataLoader(_packed(corpus), batch_size=4, shuffle=shuffle, seed=2)
        for epoch in (0, 1):
            batches = epoch_batches(loader, epoch)
            ids = np.concatenate([b["input_ids"] for b in batches])
            docs = np.concatenate([b["document_ids"] for b in batches])
            assert ids.shape[1] == SEQ and ids.dtype == np.int64
            if not shuffle:
                _check_epoch(ids, docs)  # in stream order
            windows[shuffle, epoch] = ids
    # Shuffled, another document order (so other windows) each epoch; unshuffled, the
    # same windows in the same order every pass, as torch's unshuffled loader gives.
    assert sorted(map(tuple, windows[True, 0].tolist())) != sorted(
        map(tuple, windows[True, 1].tolist())
    )
    assert np.array_equal(windows[False, 0], windows[False, 1])


def test_shuffled_windows_cover_the_same_stream(corpus) -> None:
    plain = np.concatenate([b["input_ids"] for b in epoch_batches(
        DataLoader(_packed(corpus), batch_size=5, seed=3), 0)])  # fmt: skip
    shuffled = np.concatenate([b["input_ids"] for b in epoch_batches(
        DataLoader(_packed(corpus), batch_size=5, shuffle=True, seed=3), 0)])  # fmt: skip
    assert not np.array_equal(plain, shuffled)
    assert sorted(map(tuple, plain.tolist())) == sorted(map(tuple, shuffled.tolist()))


def test_labels_positions_and_boundaries(corpus) -> None:
    batch = next(iter(DataLoader(_packed(corpus), batch_size=8, shuffle=True, seed=1)))
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    docs = batch["document_ids"]
    eos = ids == EOS
    assert (labels[eos] == -100).all() and not (labels[~eos] == -100).any()
    same = (docs[:, 1:] == docs[:, :-1]) & ~eos[:, :-1]
    assert torch.equal(labels[:, :-1][same], ids[:, 1:][same])  # the next token
    starts = (pos == 0).numpy()
    assert starts[:, 0].all()
    assert np.array_equal(starts[:, 1:], (docs[:, 1:] != docs[:, :-1]).numpy())
    both = ~eos[:, 1:] & ~eos[:, :-1] & (docs[:, 1:] == docs[:, :-1])
    assert (pos[:, 1:] - pos[:, :-1])[both].eq(1).all()  # a piece counts up...
    assert (ids[:, 1:] - ids[:, :-1])[both].eq(1).all()  # ...as its tokens go in order
    bounds = cu_seqlens(pos)
    assert bounds[0] == 0 and bounds[-1] == ids.numel() and bounds.dtype == torch.int32
    assert (bounds.diff() > 0).all() and len(bounds) - 1 == int((pos == 0).sum())


def test_same_windows_for_any_workers_depth_resume_and_seed_hook(corpus) -> None:
    def make(**kw):
        return DataLoader(_packed(corpus), batch_size=3, shuffle=True, seed=7, **kw)

    settings = ({"num_workers": 0}, {"num_workers": 2, "prefetch": 4})
    assert_same_batches_across_workers(make, settings, epochs=(0, 1))
    assert_checkpoint_roundtrip(make, stop_after=[1, 5], epoch=1, num_workers=2)
    other = epoch_batches(DataLoader(_packed(corpus), batch_size=3, shuffle=True, seed=8))
    assert not np.array_equal(other[0]["input_ids"], epoch_batches(make())[0]["input_ids"])


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_split_the_same_windows(corpus, world_size) -> None:
    def rows(rank: int, size: int) -> list[tuple[int, ...]]:
        # The same lanes at every world size: then the ranks split one order.
        loader = DataLoader(_packed(corpus, lanes=world_size), batch_size=2, shuffle=True,
                            seed=4, rank=rank, world_size=size, drop_last=True)  # fmt: skip
        return [tuple(r) for b in epoch_batches(loader, 1) for r in b["input_ids"].tolist()]

    whole = rows(0, 1)
    ranks = [rows(r, world_size) for r in range(world_size)]
    assert len({len(r) for r in ranks}) == 1  # equal batch counts on every rank
    merged = [row for step in zip(*[np.array_split(r, len(r) // 2) for r in ranks], strict=True)
              for part in step for row in map(tuple, part.tolist())]  # fmt: skip
    assert merged == whole[: len(merged)]


def test_bad_input_fails_clearly(tmp_path, corpus) -> None:
    with pytest.raises(ConfigError, match="seq_len"):
        PackedTokens(corpus, column="tokens", seq_len=0, eos_id=0)
    with pytest.raises(ConfigError, match=r"eos_id.*int32"):
        len(PackedTokens(corpus, column="tokens", seq_len=4, eos_id=2**40))
    with pytest.raises(DataError, match=r"has column\(s\) \[.nope.\]"):
        len(PackedTokens(corpus, column="nope", seq_len=4, eos_id=0))
    words = tmp_path / "w.parquet"
    pq.write_table(pa.table({"tokens": [["a", "b"], ["c"]]}), words)
    with pytest.raises(DataError, match=r"w\.parquet.*list<element: string>.*integer token ids"):
        len(PackedTokens(str(words), column="tokens", seq_len=4, eos_id=0))
    bad = write_documents(tmp_path / "b", LENGTHS[:20] + 1, null_items=True)
    with pytest.raises(DataError, match=r"part-1\.parquet.*row group 0.*null items"):
        len(PackedTokens(bad, column="tokens", seq_len=4, eos_id=0))


def test_a_read_of_no_windows_is_an_empty_batch(corpus) -> None:
    source = _packed(corpus)
    table = source.read(np.array([], dtype=np.int64))
    assert table.num_rows == 0
    assert table.column_names == ["input_ids", "labels", "position_ids", "document_ids"]
    source.close()


def test_stages_get_their_keys(corpus) -> None:
    loader = DataLoader(_packed(corpus), batch_size=4, shuffle=True, seed=0)
    # Each stage reads epoch 0 (a new iter() after a partial pass would start epoch 1).
    loader.set_epoch(0)
    first = next(iter(loader.for_stage(0, 2, inputs=["input_ids", "position_ids"])))[0]
    loader.set_epoch(0)
    last = next(iter(loader.for_stage(1, 2, labels=["labels"])))[0]
    loader.set_epoch(0)
    whole = next(iter(loader))
    assert set(first) == {"input_ids", "position_ids"} and set(last) == {"labels"}
    assert torch.equal(first["input_ids"], whole["input_ids"])
    assert torch.equal(last["labels"], whole["labels"])


def test_resume_with_another_world_size_loses_and_repeats_nothing(corpus) -> None:
    def make(rank: int = 0, size: int = 1) -> DataLoader:
        # lanes fixed at the first run's world size: the resume at another one is exact.
        return DataLoader(_packed(corpus, lanes=2), batch_size=2, shuffle=True, seed=6,
                          rank=rank, world_size=size, drop_last=True)  # fmt: skip

    def rows(batches) -> list[tuple[int, ...]]:
        return [tuple(r) for b in batches for r in b["input_ids"].tolist()]

    whole = rows(epoch_batches(make(), 0))
    loaders = [make(r, 2) for r in range(2)]
    iterators = [iter(loader) for loader in loaders]
    head = [next(it) for _ in range(3) for it in iterators]  # 3 steps on 2 ranks
    resumed = make()  # one rank now
    resumed.load_state_dict(json.loads(json.dumps(loaders[0].state_dict())))
    done = rows(head) + rows(resumed)
    assert done == whole[: len(done)] and len(whole) - len(done) < 2 * 2


def test_a_segment_of_a_sliced_or_chunked_column_holds_its_own_documents() -> None:
    """A row group's documents come from the list offsets as they are: a column that is a
    slice of a larger array, or in several chunks, gives the documents it shows."""
    from iolib.text.packed import Segment

    kind = pa.list_(pa.int32())
    whole = pa.array([[1, 2], [3], [4, 5, 6], None, [7], [8, 9]], type=kind)
    shown = pa.chunked_array([pa.array([[3], [4, 5, 6], [7]], type=kind)])
    for column in (
        pa.chunked_array([whole.slice(1, 2), whole.slice(4, 1)]),
        pa.chunked_array([pa.concat_arrays([whole.slice(1, 2), whole.slice(4, 1)]).slice(0)]),
        pa.chunked_array([whole.slice(1, 4)]),  # a null row: no document, no eos
    ):
        segment, expected = Segment.build(column, 10, None), Segment.build(shown, 10, None)
        assert segment.stream(0).tolist() == expected.stream(0).tolist() == [3, 0, 4, 5, 6, 0, 7, 0]
        assert segment.starts.tolist() == expected.starts.tolist()
    assert Segment.build(pa.chunked_array([whole.slice(2, 1)]), 0, None).rows.tolist() == [0]
