"""A loader's plan belongs to the loader (issue 42; issue 45 item 9): a source states what
the plan needs once, as a value (`Source.layout()`), and is never told a loader's batch
size, world size or lanes, so one source serves several loaders (training and
evaluation) without one rewriting the other's order."""

from __future__ import annotations

import inspect
from collections import Counter

import numpy as np
import pytest

import iolib.sources
import iolib.text
from iolib import DataLoader
from iolib.loader.testing import to_numpy_tree
from iolib.plan import Layout
from iolib.sources.base import Source
from iolib.text import PackedTokens, TokenBudgetBatches
from tests.token_data import doc_lengths, write_documents

EOS, SEQ = 0, 16
LENGTHS = doc_lengths(400, seed=3, low=0, high=60)
PLAN_CALLBACKS = ("bind_plan", "order_mode", "lane_order")


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IOLIB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def corpus(tmp_path) -> str:
    return write_documents(tmp_path / "c", LENGTHS, shards=3, row_group_size=16)


def _packed(url: str) -> PackedTokens:
    # Streamed: chunks of about three of the 25 row groups, lanes "auto".
    return PackedTokens(url, column="tokens", seq_len=SEQ, eos_id=EOS, document_ids=True,
                        shuffle_window=10_000, cache_bytes=20_000)  # fmt: skip


def _tokens(batches) -> Counter:
    ids = np.concatenate([np.asarray(b["input_ids"]).reshape(-1) for b in batches])
    return Counter(ids[ids != EOS].tolist())


def _all_tokens() -> set[int]:
    return {d * 1000 + i + 1 for d, n in enumerate(LENGTHS.tolist()) for i in range(n)}


@pytest.mark.parametrize("eval_seed", [0, 1])  # 0: the training loader's own source object
@pytest.mark.parametrize("epoch", [0, 1])
def test_train_and_eval_loaders_over_one_source_each_read_every_token_once(
    corpus, eval_seed, epoch
) -> None:
    """On each of 2 ranks one PackedTokens serves the training loader (world size 2) and,
    on rank 0, an evaluation loader (world size 1, another batch size) built after it and
    run in the middle of the training epoch. Every token is read once per epoch per loader
    (the last windows of the stream aside)."""
    world, batch = 2, 4
    train_tokens, eval_tokens = Counter(), Counter()
    for rank in range(world):
        source = _packed(corpus)
        train = DataLoader(source, batch_size=batch, shuffle=True, seed=0, rank=rank,
                           world_size=world, drop_last=True)  # fmt: skip
        evaluation = None
        if rank == 0:
            evaluation = DataLoader(source, batch_size=8, shuffle=False, seed=eval_seed)
        train.set_epoch(epoch)
        it = iter(train)
        first = [to_numpy_tree(next(it)) for _ in range(5)]
        if evaluation is not None:  # an evaluation in the middle of the training epoch
            eval_tokens.update(_tokens([to_numpy_tree(b) for b in evaluation]))
        train_tokens.update(_tokens(first + [to_numpy_tree(b) for b in it]))
    everything = _all_tokens()
    for name, seen in (("train", train_tokens), ("eval", eval_tokens)):
        twice = [t for t, n in seen.items() if n > 1]
        assert not twice, f"{name}: {len(twice)} tokens read twice"
        assert set(seen) <= everything
        # drop_last leaves at most a global step of windows, and the stream's last partial
        # window is never cut.
        missing = len(everything) - len(seen)
        assert missing <= (world * batch + 1) * SEQ, f"{name}: {missing} tokens never read"


def test_a_second_loader_leaves_the_first_ones_order_alone(corpus) -> None:
    """The order each loader's plan gives is the one it gives over a source of its own."""
    shared = _packed(corpus)
    first = DataLoader(shared, batch_size=4, shuffle=True, seed=0, rank=1, world_size=2)
    second = DataLoader(shared, batch_size=8, shuffle=True, seed=0)  # world size 1
    alone = DataLoader(_packed(corpus), batch_size=4, shuffle=True, seed=0, rank=1, world_size=2)
    for epoch in (0, 1):
        for loader in (first, second, alone):
            loader.set_epoch(epoch)
        assert list(first.batch_sampler) == list(alone.batch_sampler)
        assert list(second.batch_sampler) != list(first.batch_sampler)


def _source_classes() -> list[type]:
    found = []
    for module in (iolib.sources, iolib.text):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, Source):
                found.append(value)
    return found


def test_source_has_no_plan_callbacks() -> None:
    """The protocol offers `layout()` (a value) and no method the plan calls to bind or
    ask an order; no source in iolib defines one either."""
    for name in PLAN_CALLBACKS:
        assert not hasattr(Source, name), f"Source.{name}"
    classes = _source_classes()
    assert PackedTokens in classes and TokenBudgetBatches in classes
    for cls in classes:
        for name in PLAN_CALLBACKS:
            assert not hasattr(cls, name), f"{cls.__name__}.{name}"
    assert isinstance(Source.layout(_Tiny()), Layout)


def test_building_a_plan_does_not_change_the_source(corpus) -> None:
    source = _packed(corpus)
    len(source)  # read the index: what follows may not write anything the order uses
    before = source.__getstate__()  # the description: what pickles into a worker
    for world, batch in ((2, 4), (1, 8), (4, 2)):
        loader = DataLoader(source, batch_size=batch, shuffle=True, seed=0, rank=0,
                            world_size=world)  # fmt: skip
        list(loader.batch_sampler)
    after = source.__getstate__()
    # Values computed once from the source's own arguments may be added; none replaced
    # (but the flag that says the windowed shuffle once in the log).
    assert {k for k in before if after[k] is not before[k]} <= {"_windowed_said"}
    assert not {"_lanes", "_granule", "_world"} & set(after)


class _Tiny(Source):
    def __len__(self) -> int:
        return 3

    def fingerprint(self) -> str:
        return "tiny"

    def read(self, indices, *, epoch=0):
        return list(indices)


def test_a_dropped_source_lets_go_of_its_reader_at_once(corpus) -> None:
    """The description owns its reader and the reader only points back by a weak proxy:
    dropping the source frees its cache and stops its read threads without waiting for
    the cycle collector."""
    import gc
    import weakref

    source = _packed(corpus)
    assert source.read(np.arange(4)).num_rows == 4  # starts the read threads
    reader = weakref.ref(source._reader)
    gc.disable()
    try:
        del source
        assert reader() is None
    finally:
        gc.enable()
