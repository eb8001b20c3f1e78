"""Resume states say what the order was (issue 45 items 8, 17, 19): the shuffle mode a
source runs (not the one asked for), the lanes the plan resolved, and an unshuffled
loader gives the same batches on every pass."""

from __future__ import annotations

import json

import pytest

from iolib import DataLoader
from iolib.errors import StateError
from iolib.loader.testing import assert_batches_equal, epoch_batches, to_numpy_tree
from iolib.text import PackedTokens, TokenBudgetBatches
from tests.token_data import doc_lengths, write_documents

EOS, SEQ = 0, 16


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("order")
    return write_documents(root / "c", doc_lengths(400, seed=3, low=0, high=60), shards=3,
                           row_group_size=16)  # fmt: skip


def _packed(url: str, streamed: bool = True, lanes: int | str = "auto") -> PackedTokens:
    window = 10_000 if streamed else 10**8  # chunks of ~3 of 25 row groups, or the whole
    return PackedTokens(url, column="tokens", seq_len=SEQ, eos_id=EOS, lanes=lanes,
                        shuffle_window=window, cache_bytes=2 * window)  # fmt: skip


def _stopped(loader: DataLoader, after: int = 3) -> dict:
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(after):
        next(it)
    return json.loads(json.dumps(loader.state_dict()))


def test_a_streamed_shuffle_records_its_windowed_order(corpus) -> None:
    """shuffle=True over a streamed corpus runs a windowed (block) shuffle: the state says
    so, a shuffle="global" loader (a full shuffle: other batches) refuses it naming the
    key, and shuffle="block", which runs the same order, resumes it exactly."""
    state = _stopped(DataLoader(_packed(corpus), batch_size=4, shuffle=True, seed=5))
    assert (state["shuffle"], state["shuffle_window"]) == ("block", 1)
    spelled_out = DataLoader(_packed(corpus), batch_size=4, shuffle="global", seed=5)
    with pytest.raises(StateError, match=r"shuffle: state has 'block', loader has 'global'"):
        spelled_out.load_state_dict(state)
    full = epoch_batches(DataLoader(_packed(corpus), batch_size=4, shuffle=True, seed=5), 1)
    block = DataLoader(_packed(corpus), batch_size=4, shuffle="block", seed=5)
    block.load_state_dict(state)
    assert_batches_equal(full[3:], [to_numpy_tree(b) for b in block], "block resumed")


def test_a_corpus_that_fits_the_window_records_a_global_shuffle(corpus) -> None:
    state = _stopped(DataLoader(_packed(corpus, False), batch_size=4, shuffle=True, seed=5))
    assert state["shuffle"] == "global"
    DataLoader(_packed(corpus, False), batch_size=4, shuffle="global", seed=5).load_state_dict(
        state
    )


def test_another_world_size_with_auto_lanes_is_refused_naming_the_lanes(corpus) -> None:
    saved = DataLoader(_packed(corpus), batch_size=2, shuffle=True, seed=5, rank=0, world_size=2)
    state = _stopped(saved)
    wider = DataLoader(_packed(corpus), batch_size=2, shuffle=True, seed=5, rank=0, world_size=4)
    with pytest.raises(StateError) as refused:
        wider.load_state_dict(state)
    message = str(refused.value)
    assert "lanes (state 2, loader 4): pass lanes=2 to resume at another world size" in message
    assert "content changed" not in message
    # As the message says: lanes=2 resumes at world size 4.
    fixed = DataLoader(_packed(corpus, lanes=2), batch_size=2, shuffle=True, seed=5, rank=0,
                       world_size=4)  # fmt: skip
    fixed.load_state_dict(state)
    assert next(iter(fixed))["input_ids"].shape == (2, SEQ)


@pytest.mark.parametrize("streamed", [True, False])
def test_an_unshuffled_loader_gives_the_same_windows_every_pass(corpus, streamed) -> None:
    """A fresh iterator per evaluation (each pass a new epoch) or set_epoch: with
    shuffle=False the same batches each time, as torch's unshuffled loader gives."""
    loader = DataLoader(_packed(corpus, streamed), batch_size=4, shuffle=False, seed=5)
    passes = [[to_numpy_tree(b) for b in loader] for _ in range(3)]
    assert loader.epoch >= 2  # each pass is another epoch
    for later in passes[1:]:
        assert_batches_equal(passes[0], later, "another pass")
    assert_batches_equal(passes[0], epoch_batches(loader, 7), "set_epoch(7)")


def test_unshuffled_budget_batches_are_the_same_every_pass(corpus) -> None:
    source = TokenBudgetBatches(corpus, column="tokens", max_tokens=200)
    loader = DataLoader(source, batch_size=1, shuffle=False, seed=5)
    first, second = [[to_numpy_tree(b) for b in loader] for _ in range(2)]
    assert_batches_equal(first, second, "another pass")
    shuffled = DataLoader(source, batch_size=1, shuffle=True, seed=5)
    one, two = epoch_batches(shuffled, 0), epoch_batches(shuffled, 1)
    assert any(a["id"].tolist() != b["id"].tolist() for a, b in zip(one, two, strict=False))
