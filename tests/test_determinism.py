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
from torch.utils.data import Dataset

from iolib import DataLoader
from iolib.sources import ImageFolderSource, ParquetSource
from iolib.testing import (
    assert_batches_equal,
    assert_checkpoint_roundtrip,
    assert_same_batches_across_workers,
    epoch_batches,
)


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
    torch.manual_seed(123)
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
