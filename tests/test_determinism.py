"""The determinism contract, bit for bit, over every source and option."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from iolib import DataLoader
from iolib.loader.testing import (
    assert_batches_equal,
    assert_checkpoint_roundtrip,
    assert_same_batches_across_workers,
    epoch_batches,
)
from iolib.sources import ImageFolderSource, ParquetSource


class NoisyDataset(Dataset):
    """A torch Dataset whose __getitem__ draws from torch's global RNG (as torchvision
    transforms do)."""

    def __len__(self) -> int:
        return 45

    def __getitem__(self, index: int):
        return {"x": torch.tensor([index]), "noise": torch.rand(3)}


def jitter(sample: dict, rng: np.random.Generator) -> dict:
    """An iolib transform: randomness from the per-sample generator only."""
    sample["jitter"] = rng.normal(size=4).astype(np.float32)
    return sample


def parquet_loader(token_dir: Path, shuffle="block", **kwargs):
    options = dict(batch_size=8, shuffle=shuffle, seed=11, shuffle_window=2)
    options.update(kwargs)
    return DataLoader(ParquetSource(str(token_dir)), **options)


@pytest.mark.parametrize("shuffle", [False, "global", "block"])
def test_parquet_same_batches_across_workers_and_depths(token_dir, shuffle) -> None:
    assert_same_batches_across_workers(partial(parquet_loader, token_dir, shuffle))


def test_transform_randomness_same_across_workers(token_dir) -> None:
    assert_same_batches_across_workers(partial(parquet_loader, token_dir, transform=jitter))


def test_image_folder_same_across_workers(image_folder) -> None:
    def make(**kw):
        return DataLoader(ImageFolderSource(str(image_folder)), batch_size=4, shuffle=True, **kw)

    assert_same_batches_across_workers(make, epochs=(0,))


def test_torch_dataset_global_rng_same_inline_and_in_processes() -> None:
    def make(**kw):
        return DataLoader(NoisyDataset(), batch_size=6, shuffle=True, seed=5, **kw)

    settings = ({"num_workers": 0}, {"num_workers": 2, "prefetch": 3})
    assert_same_batches_across_workers(make, settings=settings, epochs=(0,))


def test_torch_dataset_inline_keeps_callers_rng_state() -> None:
    """The samples' draws are given back; what remains taken is what torch's DataLoader
    takes per iter() (its base seed and its RandomSampler's seed), as under torch."""
    torch.manual_seed(123)
    for _ in range(2):
        torch.empty((), dtype=torch.int64).random_()
    expected = torch.rand(2)
    torch.manual_seed(123)
    list(DataLoader(NoisyDataset(), batch_size=9, shuffle=True))
    assert torch.equal(torch.rand(2), expected)


@pytest.mark.parametrize("shuffle", [False, "global", "block"])
def test_resume_at_several_points(token_dir, shuffle) -> None:
    make = partial(parquet_loader, token_dir, shuffle, num_workers=2)
    assert_checkpoint_roundtrip(make, stop_after=(0, 1, 5, 12), epoch=1)


def test_resume_with_other_workers_and_depth(token_dir) -> None:
    make = partial(parquet_loader, token_dir, num_workers=3, prefetch=2)
    assert_checkpoint_roundtrip(make, stop_after=(4,), num_workers=0)


def test_state_after_epoch_end_resumes_next_epoch(token_dir) -> None:
    loader = parquet_loader(token_dir)
    list(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    fresh = parquet_loader(token_dir)
    fresh.load_state_dict(state)
    assert_batches_equal(list(fresh), epoch_batches(parquet_loader(token_dir), 1))


def test_set_epoch_reshuffles_and_is_reproducible(token_dir) -> None:
    a0 = epoch_batches(parquet_loader(token_dir, "global"), 0)
    a1 = epoch_batches(parquet_loader(token_dir, "global"), 1)
    assert [b["id"].tolist() for b in a0] != [b["id"].tolist() for b in a1]
    assert_batches_equal(a1, epoch_batches(parquet_loader(token_dir, "global"), 1))


def test_epochs_auto_advance_after_a_complete_pass(token_dir) -> None:
    loader = parquet_loader(token_dir, "global")
    first, second = list(loader), list(loader)
    assert_batches_equal(second, epoch_batches(parquet_loader(token_dir, "global"), 1))
    assert [b["id"].tolist() for b in first] != [b["id"].tolist() for b in second]


def test_resume_in_a_new_process(token_dir, tmp_path) -> None:
    """state_dict() after k batches, load_state_dict() in a fresh interpreter."""
    script = textwrap.dedent(
        f"""
        import faulthandler, json, sys
        faulthandler.dump_traceback_later(60, exit=True)  # a hang shows where, not a timeout
        from iolib import DataLoader
        from iolib.sources import ParquetSource
        loader = DataLoader(ParquetSource({str(token_dir)!r}), batch_size=8, shuffle="block",
                            seed=11, shuffle_window=2, num_workers=2)
        if sys.argv[1] == "save":
            it = iter(loader)
            for _ in range(5):
                next(it)
            print(json.dumps(loader.state_dict()))
        else:
            loader.load_state_dict(json.loads(sys.argv[2]))
            print(json.dumps([b["id"].tolist() for b in loader]))
        """
    )
    path = tmp_path / "resume.py"
    path.write_text(script)
    run = partial(subprocess.run, capture_output=True, text=True, check=True, timeout=120)
    state = run([sys.executable, str(path), "save"]).stdout.strip()
    rest = json.loads(run([sys.executable, str(path), "load", state]).stdout)
    full = [b["id"].tolist() for b in epoch_batches(parquet_loader(token_dir), 0)]
    assert rest == full[5:]


def test_every_rank_gets_its_slice(token_dir) -> None:
    for world in (1, 2, 3, 8):
        ranks = [
            epoch_batches(parquet_loader(token_dir, rank=r, world_size=world, num_workers=2), 0)
            for r in range(world)
        ]
        assert len({len(batches) for batches in ranks}) == 1
        ids = np.concatenate([b["id"] for batches in ranks for b in batches])
        assert set(ids.tolist()) == set(range(100))
        assert len(ids) - len(set(ids.tolist())) < world  # only tail padding repeats


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_persistent_workers_reading_ahead_give_each_epoch_its_own_batches(
    token_dir, shuffle
) -> None:
    """Persistent workers read the next epoch's first batches while an epoch ends. Every
    pass must still get exactly what a fresh loader gives that epoch: after a plain pass,
    after set_epoch(the next epoch) as torch scripts call it, after a jump to another
    epoch (the read-ahead is discarded) and after load_state_dict."""
    loader = parquet_loader(
        token_dir, shuffle, num_workers=3, prefetch=6, persistent_workers=True, timeout=30
    )
    passes = {0: list(loader)}
    loader.set_epoch(1)
    passes[1] = list(loader)
    passes[2] = list(loader)  # epochs advance after a complete pass
    loader.set_epoch(5)
    passes[5] = list(loader)
    for epoch, got in passes.items():
        want = epoch_batches(parquet_loader(token_dir, shuffle), epoch)
        assert_batches_equal(got, want, f"epoch {epoch}")

    # Restored mid-epoch after a pass that read ahead into the next epoch's start.
    other = parquet_loader(token_dir, shuffle)
    other.set_epoch(7)
    batches = iter(other)
    head = [next(batches), next(batches)]
    state = other.state_dict()
    list(loader)  # epoch 6, reading ahead into epoch 7 from position 0
    loader.load_state_dict(state)
    rest = list(loader)
    assert_batches_equal(head + rest, epoch_batches(parquet_loader(token_dir, shuffle), 7))
    loader.close()


def test_persistent_workers_start_the_next_epoch_before_it_is_asked_for() -> None:
    """The read-ahead itself: with persistent workers, samples of the next epoch are
    requested while the training loop is still between epochs (this fails when the
    workers sit idle until the next iter(), as torch's persistent workers do)."""
    requested: list[int] = []

    class Recording(Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, index: int):
            requested.append(index)
            return torch.tensor([index])

    loader = DataLoader(
        Recording(),
        batch_size=3,
        shuffle=True,
        num_workers=2,
        prefetch=2,
        worker_mode="thread",  # `requested` is shared with the workers
        persistent_workers=True,
    )
    first = list(loader)
    deadline = time.monotonic() + 10
    while len(requested) <= 12 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(requested) > 12, "no sample of epoch 1 was read before iter() asked for it"
    second = list(loader)
    assert_batches_equal(
        second, epoch_batches(DataLoader(Recording(), batch_size=3, shuffle=True), 1)
    )
    assert_batches_equal(
        first, epoch_batches(DataLoader(Recording(), batch_size=3, shuffle=True), 0)
    )
    loader.close()


# -- global generators drawn from only where a sample draws (issue 33, item 20) ---------
class SometimesDraws(Dataset):
    """Sample i draws from torch, numpy and random only when i is in `drawing`."""

    def __init__(self, n: int, drawing: frozenset[int]) -> None:
        self.n, self.drawing = n, drawing

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if index not in self.drawing:
            return torch.tensor([float(index), 0.0, 0.0])
        import random as stdlib_random

        noise = torch.rand(()).item() + np.random.rand() + stdlib_random.random()
        return torch.tensor([float(index), noise, torch.randint(0, 1000, ()).item()])


def _by_index(loader: DataLoader) -> dict[int, list[float]]:
    rows = torch.cat(list(loader)).tolist()
    return {int(row[0]): row for row in rows}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 90),
    drawing=st.frozensets(st.integers(0, 89), max_size=6),
    batch_size=st.sampled_from([1, 7, 16, 40, 90]),
    shuffle=st.booleans(),
)
def test_a_sample_draws_the_same_whatever_batch_holds_it(n, drawing, batch_size, shuffle):
    """A sample's global draws are a pure function of (seed, epoch, index): the same in a
    batch of one (seeded up front) as in a batch read first without seeding."""
    dataset = SometimesDraws(n, drawing)
    expected = _by_index(DataLoader(dataset, batch_size=1, seed=3))
    got = _by_index(DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, seed=3))
    assert got == expected


def test_a_drawing_sample_is_the_same_in_process_workers() -> None:
    dataset = SometimesDraws(120, frozenset({5, 60, 61, 119}))
    inline = _by_index(DataLoader(dataset, batch_size=20, shuffle=True, seed=4))
    workers = DataLoader(dataset, batch_size=20, shuffle=True, seed=4, num_workers=2)
    assert _by_index(workers) == inline
    assert inline[60][1] != 0.0 and inline[59][1] == 0.0


# -- the default seed and the epoch of a new iter() (issue 33, items 17 and 18) ---------
def test_the_default_seed_is_torchs_and_a_resume_keeps_it() -> None:
    dataset = list(range(50))
    torch.manual_seed(5)
    loader = DataLoader(dataset, batch_size=4, shuffle=True)
    assert loader.seed == torch.initial_seed() == 5
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(3)]
    state, rest = loader.state_dict(), [b.tolist() for b in iterator]
    assert state["seed"] == 5 and json.loads(json.dumps(state)) == state

    torch.manual_seed(9)  # the resumed process seeds torch otherwise
    resumed = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
    resumed.load_state_dict(state)
    assert resumed.seed == 5
    assert [b.tolist() for b in resumed] == rest and head


def test_an_explicit_seed_still_refuses_another_states_seed() -> None:
    from iolib.errors import StateError

    torch.manual_seed(5)
    state = DataLoader(list(range(50)), batch_size=4, shuffle=True).state_dict()
    with pytest.raises(StateError, match="seed: state has 5, loader has 6"):
        DataLoader(list(range(50)), batch_size=4, shuffle=True, seed=6).load_state_dict(state)


def _passes(loader: DataLoader, steps: int, epochs: int, set_epoch: bool) -> list:
    taken = []
    for epoch in range(epochs):
        if set_epoch:
            loader.set_epoch(epoch)
        iterator = iter(loader)
        taken.append([next(iterator).tolist() for _ in range(steps)])
    return taken


@pytest.mark.parametrize("workers", [0, 2])
def test_partial_passes_walk_the_epochs_in_order(workers: int) -> None:
    """A new iter() after a partial pass is the next epoch: the same batches as
    set_epoch(e) for e = 0, 1, 2..., so the run stays a pure function of the seed."""
    make = partial(DataLoader, list(range(60)), batch_size=4, shuffle=True, seed=8)
    plain = _passes(make(num_workers=workers, persistent_workers=workers > 0), 3, 4, False)
    assert plain == _passes(make(), 3, 4, True)
    assert len({tuple(map(tuple, p)) for p in plain}) == 4


def test_set_epoch_or_a_loaded_state_decides_what_iter_starts() -> None:
    loader = DataLoader(list(range(60)), batch_size=4, shuffle=True, seed=8)
    first = _passes(loader, 3, 1, False)[0]
    loader.set_epoch(0)  # the same epoch again, from its start: asked for, so replayed
    assert _passes(loader, 3, 1, False)[0] == first
    iterator = iter(loader)  # the previous pass stopped early: epoch 1 now
    assert loader.epoch == 1
    next(iterator)
    state = loader.state_dict()
    again = DataLoader(list(range(60)), batch_size=4, shuffle=True, seed=8)
    again.load_state_dict(state)
    assert next(iter(again)).tolist() == next(iterator).tolist()
    assert again.epoch == 1


def test_an_iter_that_took_nothing_moves_no_epoch() -> None:
    loader = DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=1)
    iter(loader)
    iter(loader)
    assert loader.epoch == 0 and len(list(loader)) == 5 and loader.epoch == 1


# -- a refused resume names what differs (issue 33, item 12) ----------------------------
def test_a_refused_resume_names_the_fields_that_differ(tmp_path) -> None:
    from iolib.errors import StateError
    from iolib.text import PackedTokens
    from tests.token_data import doc_lengths, write_documents

    corpus = write_documents(tmp_path / "a", doc_lengths(60), shards=2)
    other = write_documents(tmp_path / "b", doc_lengths(60, seed=1), shards=3)

    def state_of(url: str, **kw) -> dict:
        tokens = PackedTokens(url, column="tokens", **{"seq_len": 16, "eos_id": 0, **kw})
        return DataLoader(tokens, batch_size=2, seed=0).state_dict()

    saved = state_of(corpus)
    for changes, named in (
        ({"seq_len": 8}, "seq_len (state has 16, loader has 8)"),
        ({"eos_id": 7}, "eos_id (state has 0, loader has 7)"),
        ({"url": other}, "files (state has 2 file(s)"),
    ):
        url = changes.pop("url", corpus)
        tokens = PackedTokens(url, column="tokens", **{"seq_len": 16, "eos_id": 0, **changes})
        with pytest.raises(StateError) as caught:
            DataLoader(tokens, batch_size=2, seed=0).load_state_dict(saved)
        assert named in str(caught.value), str(caught.value)
    # A torch Dataset: its class and length.
    state = DataLoader(NoisyDataset(), batch_size=4, seed=0).state_dict()
    shorter = type("Shorter", (NoisyDataset,), {"__len__": lambda self: 40})
    with pytest.raises(StateError, match=r"len \(state has 45, loader has 40\)"):
        DataLoader(shorter(), batch_size=4, seed=0).load_state_dict(state)
