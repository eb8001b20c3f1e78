"""Drop-in compatibility with torch.utils.data.DataLoader's arguments."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, Dataset, DistributedSampler, SequentialSampler

from iolib import DataLoader
from iolib.errors import ConfigError

SCRIPT = Path(__file__).parent / "scripts" / "train_classifier.py"


class Squares(Dataset):
    def __len__(self) -> int:
        return 30

    def __getitem__(self, index: int):
        return torch.tensor(index), torch.tensor(index * index)


def test_training_script_runs_with_only_the_import_line_changed(tmp_path) -> None:
    source = SCRIPT.read_text()
    swapped = source.replace(
        "from torch.utils.data import DataLoader, Dataset",
        "from iolib import DataLoader\nfrom torch.utils.data import Dataset",
    )
    assert swapped != source
    (tmp_path / "train_iolib.py").write_text(swapped)
    results = {}
    for name, path in (("torch", SCRIPT), ("iolib", tmp_path / "train_iolib.py")):
        run = subprocess.run(
            [sys.executable, str(path)], capture_output=True, text=True, timeout=300, check=True
        )
        results[name] = re.findall(r"epoch (\d) batches (\d+) accuracy ([\d.]+)", run.stdout)
    assert len(results["iolib"]) == 3
    assert [r[:2] for r in results["iolib"]] == [r[:2] for r in results["torch"]]
    assert float(results["iolib"][-1][2]) > 0.7, "the model must train on iolib's batches"


def test_default_collate_matches_torch() -> None:
    ours = list(DataLoader(Squares(), batch_size=7))
    theirs = list(torch.utils.data.DataLoader(Squares(), batch_size=7))
    assert len(ours) == len(theirs) == 5
    for (a, b), (c, d) in zip(ours, theirs, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)


def test_sampler_and_batch_sampler_are_honoured() -> None:
    sampler = list(reversed(range(30)))
    got = [x.tolist() for x, _ in DataLoader(Squares(), batch_size=10, sampler=sampler)]
    assert got[0] == list(range(29, 19, -1))
    batches = BatchSampler(SequentialSampler(range(30)), batch_size=4, drop_last=True)
    got = [x.tolist() for x, _ in DataLoader(Squares(), batch_sampler=batches)]
    assert len(got) == 7 and got[1] == [4, 5, 6, 7]


def test_distributed_sampler_epoch_is_the_scripts() -> None:
    """The script tells its sampler the epoch (as with torch); the loader never does, so a
    run resumed at epoch 5 reads epoch 5's order, not the loader's own epoch count."""

    def epoch_ids(loader_class, rank: int, epoch: int) -> list[int]:
        sampler = DistributedSampler(Squares(), num_replicas=2, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(epoch)
        loader = loader_class(Squares(), batch_size=5, sampler=sampler)
        return [i for x, _ in loader for i in x.tolist()]

    ours = [epoch_ids(DataLoader, r, e) for r in (0, 1) for e in (0, 5)]
    theirs = [epoch_ids(torch.utils.data.DataLoader, r, e) for r in (0, 1) for e in (0, 5)]
    assert ours == theirs
    assert sorted(ours[0] + ours[2]) == list(range(30))
    assert ours[0] != ours[1]


def test_generator_seeds_the_order() -> None:
    def ids(seed: int) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return next(
            x.tolist() for x, _ in DataLoader(Squares(), batch_size=30, shuffle=True, generator=g)
        )

    assert ids(1) == ids(1) != ids(2)


def test_worker_init_fn_runs_in_every_worker() -> None:
    seen = []
    list(
        DataLoader(
            Squares(), batch_size=3, num_workers=3, worker_mode="thread", worker_init_fn=seen.append
        )
    )
    assert sorted(seen) == [0, 1, 2]


def test_pin_memory_without_cuda_warns_and_still_loads() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: pinning works")
    with pytest.warns(UserWarning, match="no CUDA"):
        batches = list(DataLoader(Squares(), batch_size=10, pin_memory=True))
    assert len(batches) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": None, "drop_last": True}, "mutually exclusive with drop_last"),
        ({"shuffle": True, "sampler": [1, 2]}, "mutually exclusive with shuffle"),
        ({"batch_sampler": [[0]], "batch_size": 4}, "mutually exclusive"),
        ({"num_workers": -1}, "num_workers"),
        ({"timeout": -1}, "timeout"),
        ({"shuffle": "sometimes"}, "shuffle"),
        ({"worker_mode": "fiber"}, "worker_mode"),
        ({"sampler": [0, 1], "rank": 0, "world_size": 2}, "cannot also shard"),
        ({"rank": 1}, "both `rank` and `world_size`"),
    ],
)
def test_unsupported_or_bad_arguments_say_why(kwargs, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        DataLoader(Squares(), **kwargs)


def test_rank_from_torchrun_environment(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = DataLoader(Squares(), batch_size=2)
    assert (loader.rank, loader.world_size) == (1, 3)
    assert next(x.tolist() for x, _ in loader) == [2, 3]


# -- differences kept by design warn once where a script relies on them (issue 33, #21) --
def test_in_order_false_warns_once_that_batches_stay_in_order() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(Squares(), batch_size=4, num_workers=2, in_order=False)
        batches = [b[0].tolist() for b in loader]
        DataLoader(Squares(), batch_size=4, in_order=False)  # no workers: no order to keep
        DataLoader(Squares(), batch_size=4, num_workers=2)
    messages = [str(w.message) for w in caught if "in_order" in str(w.message)]
    assert len(messages) == 1 and "in_order=False is ignored" in messages[0]
    assert batches == [list(range(i, min(i + 4, 30))) for i in range(0, 30, 4)]


class SeedsFromTorch(Dataset):
    """Draws from torch's global generator and reads torch.initial_seed(): under torch it
    is the worker's seed; iolib seeds torch per sample here, so it is the sample's."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int):
        return torch.rand(()) + torch.initial_seed() % 1000


@pytest.mark.parametrize("workers", [0, 2])
def test_initial_seed_under_per_sample_seeding_warns_once(workers: int) -> None:
    import warnings

    loader = DataLoader(SeedsFromTorch(), batch_size=8, num_workers=workers, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            list(loader)
    messages = [str(w.message) for w in caught if "initial_seed" in str(w.message)]
    assert len(messages) == 1, messages
    assert "get_worker_info().seed" in messages[0]


def test_a_dataset_that_draws_nothing_is_not_warned_about_initial_seed() -> None:
    import warnings

    class Reads(Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, index: int):
            return torch.tensor(torch.initial_seed() % 1000 + index)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(DataLoader(Reads(), batch_size=8, seed=0))
    assert not [w for w in caught if "initial_seed" in str(w.message)]
