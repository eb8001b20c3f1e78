"""Exceptions raised by a Dataset or a worker_init_fn reach the training loop with their
own type (``except KeyError:`` catches them), and the iterator goes on afterwards; and
``get_worker_info()`` describes the worker inside ``__getitem__``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info


class SampleCorrupt(Exception):
    """A user-defined exception class (module level: picklable)."""


class Raising(Dataset):
    """Sample i is i, except sample `bad`, which raises `error(f"sample {bad}")`."""

    def __init__(self, n: int, bad: int, error: type[Exception]) -> None:
        self.n, self.bad, self.error = n, bad, error

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            raise self.error(f"sample {index}")
        return index


def outcomes(loader, error: type[Exception]) -> list:
    """Each batch's ids, or ('raised', message-contains-sample) where `error` was caught."""
    seen = []
    iterator = iter(loader)
    for _ in range(len(loader) + 1):  # one more than the batches: must end with StopIteration
        try:
            batch = next(iterator)
        except StopIteration:
            return seen
        except error as exc:  # the loop's own `except KeyError:` etc.
            seen.append(("raised", "sample 3" in str(exc)))
            continue
        seen.append(batch.tolist())
    raise AssertionError(f"the iterator did not stop after {len(loader)} batches: {seen}")


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("error", [KeyError, ValueError, SampleCorrupt])
def test_dataset_exception_keeps_its_type_and_iteration_continues(
    Loader, error, num_workers
) -> None:
    dataset = Raising(10, bad=3, error=error)
    got = outcomes(Loader(dataset, batch_size=2, num_workers=num_workers), error)
    expected = outcomes(
        torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=num_workers), error
    )
    assert expected == [[0, 1], ("raised", True), [4, 5], [6, 7], [8, 9]]
    assert got == expected


def failing_init(worker_id: int) -> None:
    raise RuntimeError(f"worker_init_fn failed in worker {worker_id}: code 42")


def test_worker_init_fn_exception_surfaces_with_its_message(Loader) -> None:
    loader = Loader(
        Raising(8, bad=-1, error=KeyError),
        batch_size=2,
        num_workers=2,
        worker_init_fn=failing_init,
    )
    errors, iterator = [], iter(loader)
    for _ in range(len(loader) + 1):  # drained: torch's workers then stop at once
        try:
            next(iterator)
        except StopIteration:
            break
        except Exception as exc:  # what follows the first error is not compared
            errors.append(exc)
    assert errors, "the failing worker_init_fn must surface"
    assert isinstance(errors[0], RuntimeError)
    assert "code 42" in str(errors[0])


class WorkerInfoDataset(Dataset):
    """Sample i reports what get_worker_info() says in the process that reads it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tag = "the user's dataset"
        self.seeded_by_worker = None  # set by record_worker_seed in each worker's copy

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict:
        info = get_worker_info()
        if info is None:
            return {"index": index, "in_worker": False}
        return {
            "index": index,
            "in_worker": True,
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "seed_is_torch_initial_seed": self.seeded_by_worker,
            "dataset_is_a_copy": isinstance(info.dataset, WorkerInfoDataset)
            and info.dataset.tag == "the user's dataset",
        }


def test_get_worker_info_is_none_in_the_main_process(Loader) -> None:
    assert get_worker_info() is None
    samples = [s for batch in Loader(WorkerInfoDataset(4), batch_size=2) for s in _unbatch(batch)]
    assert samples == [{"index": i, "in_worker": False} for i in range(4)]
    assert get_worker_info() is None


def record_worker_seed(worker_id: int) -> None:
    """torch seeds each worker with get_worker_info().seed before worker_init_fn. (iolib
    then seeds global generators per sample in process workers, for determinism across
    worker counts, so __getitem__ sees a per-sample seed: docs/determinism.md.)"""
    info = get_worker_info()
    info.dataset.seeded_by_worker = info.seed == torch.initial_seed()


def test_get_worker_info_inside_workers(Loader) -> None:
    loader = Loader(
        WorkerInfoDataset(16),
        batch_size=2,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
        worker_init_fn=record_worker_seed,
    )
    samples = [s for batch in loader for s in _unbatch(batch)]
    assert sorted(s["index"] for s in samples) == list(range(16))
    assert all(s["in_worker"] for s in samples), "get_worker_info() was None in a worker"
    assert {s["id"] for s in samples} == {0, 1}
    assert {s["num_workers"] for s in samples} == {2}
    assert all(s["seed_is_torch_initial_seed"] for s in samples), (
        "in worker_init_fn, torch.initial_seed() must equal get_worker_info().seed (torch "
        "seeds each worker with it first)"
    )
    assert all(s["dataset_is_a_copy"] for s in samples), "info.dataset is not the dataset"
    seeds = {s["id"]: s["seed"] for s in samples}
    assert seeds[1] - seeds[0] == 1  # torch: base_seed + worker id
    assert get_worker_info() is None


def _unbatch(batch: dict) -> list[dict]:
    """default_collate turned a list of dicts into a dict of tensors; undo it."""
    size = len(batch["index"])
    return [
        {k: (v[i].item() if torch.is_tensor(v) else v[i]) for k, v in batch.items()}
        for i in range(size)
    ]
