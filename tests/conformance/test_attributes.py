"""Attributes: the values torch's DataLoader exposes after __init__, and the ones it
refuses to change afterwards."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from torch.utils.data import BatchSampler, Sampler, SequentialSampler
from torch.utils.data._utils.collate import default_collate, default_convert

from tests.conformance.conftest import Numbers


def init_fn(worker_id: int) -> None:
    pass


def collate_first(samples):
    return samples[0]


def test_default_attributes(Loader) -> None:
    dataset = Numbers(10)
    loader = Loader(dataset)
    assert loader.dataset is dataset
    assert len(loader.dataset) == 10
    assert loader.batch_size == 1
    assert loader.drop_last is False
    assert loader.num_workers == 0
    assert loader.prefetch_factor is None
    assert loader.generator is None
    assert loader.collate_fn is default_collate
    assert loader.pin_memory is False
    assert loader.timeout == 0
    assert loader.worker_init_fn is None
    assert loader.persistent_workers is False
    assert isinstance(loader.sampler, Sampler)
    assert len(loader.sampler) == 10
    assert list(loader.sampler) == list(range(10))
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.batch_size == 1
    assert loader.batch_sampler.drop_last is False
    assert len(loader.batch_sampler) == len(loader) == 10


def test_shuffled_default_sampler_is_a_permutation_sampler(Loader) -> None:
    loader = Loader(Numbers(12), batch_size=5, shuffle=True, drop_last=True)
    assert isinstance(loader.sampler, Sampler)
    assert len(loader.sampler) == 12
    assert sorted(int(i) for i in loader.sampler) == list(range(12))
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.batch_size == 5
    assert loader.batch_sampler.drop_last is True
    assert len(loader) == 2


def test_worker_attributes(Loader) -> None:
    generator = torch.Generator().manual_seed(3)
    loader = Loader(
        Numbers(10),
        batch_size=4,
        num_workers=2,
        pin_memory=True,
        timeout=5,
        worker_init_fn=init_fn,
        generator=generator,
        persistent_workers=True,
        collate_fn=collate_first,
    )
    assert loader.num_workers == 2
    assert loader.prefetch_factor == 2  # torch's default once workers are used
    assert loader.pin_memory is True
    assert loader.timeout == 5
    assert loader.worker_init_fn is init_fn
    assert loader.generator is generator
    assert loader.persistent_workers is True
    assert loader.collate_fn is collate_first
    assert Loader(Numbers(10), num_workers=2, prefetch_factor=3).prefetch_factor == 3


def test_attributes_with_a_sampler(Loader) -> None:
    sampler = SequentialSampler(range(7))
    loader = Loader(Numbers(10), batch_size=3, sampler=sampler, drop_last=True)
    assert loader.sampler is sampler
    assert isinstance(loader.batch_sampler, BatchSampler)
    assert loader.batch_sampler.sampler is sampler
    assert (loader.batch_size, loader.drop_last) == (3, True)
    assert len(loader) == 2


def test_attributes_with_a_batch_sampler(Loader) -> None:
    batch_sampler = BatchSampler(SequentialSampler(range(10)), batch_size=4, drop_last=False)
    loader = Loader(Numbers(10), batch_sampler=batch_sampler)
    assert loader.batch_sampler is batch_sampler
    assert loader.batch_size is None
    assert loader.drop_last is False
    assert len(loader) == 3


def test_attributes_without_batching(Loader) -> None:
    loader = Loader(Numbers(10), batch_size=None)
    assert loader.batch_size is None
    assert loader.batch_sampler is None
    assert loader.collate_fn is default_convert
    assert isinstance(loader.sampler, Sampler)
    assert len(loader) == 10


@pytest.mark.parametrize(
    ("batch_size", "drop_last"), [(1, False), (3, False), (3, True), (7, True), (25, False)]
)
def test_len_matches_torch(Loader, batch_size, drop_last) -> None:
    loader = Loader(Numbers(20), batch_size=batch_size, drop_last=drop_last)
    expected = len(
        torch.utils.data.DataLoader(Numbers(20), batch_size=batch_size, drop_last=drop_last)
    )
    assert len(loader) == expected


@pytest.mark.parametrize(
    "attribute",
    ["batch_size", "sampler", "batch_sampler", "drop_last", "dataset", "persistent_workers"],
)
def test_assigning_after_init_raises_value_error(Loader, attribute) -> None:
    loader = Loader(Numbers(10), batch_size=2)
    with pytest.raises(ValueError, match="should not be set after"):
        setattr(loader, attribute, {})


def test_other_attributes_stay_assignable(Loader) -> None:
    loader = Loader(Numbers(10), batch_size=2)
    loader.num_workers = 0  # torch allows it: only the six above are frozen
    loader.collate_fn = collate_first
    assert loader.collate_fn is collate_first


def test_subscriptable_for_type_annotations(Loader, tmp_path) -> None:
    assert Loader[int] is not None
    module_path = tmp_path / "annotated_training.py"
    module_path.write_text(
        "from typing import NamedTuple\n"
        "import torch\n"
        f"from {Loader.__module__} import DataLoader\n"
        "\n"
        "class Batch(NamedTuple):\n"
        "    x: torch.Tensor\n"
        "\n"
        "def make_loader(dataset) -> DataLoader[Batch]:\n"
        "    return DataLoader(dataset, batch_size=2)\n"
        "\n"
        "LOADERS: list[DataLoader[int]] = []\n"
    )
    spec = importlib.util.spec_from_file_location("annotated_training", module_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.pop("annotated_training", None)
    spec.loader.exec_module(module)  # evaluates the annotations
    assert len(module.make_loader(Numbers(4))) == 2
