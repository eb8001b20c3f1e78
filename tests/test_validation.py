"""Arguments and states are checked at construction, with torch's accepted forms, and
refused with a ValueError that names the argument, the value and the rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from iolib import DataLoader
from iolib.errors import ConfigError, StateError

DATA = list(range(20))


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"memory_budget": "lots"}, "memory_budget"),  # checked without prefetch="auto" too
        ({"target_utilization": 1.5}, "target_utilization"),
        ({"timeout": "5"}, "timeout"),
        ({"generator": "gen"}, "generator"),
        ({"persistent_workers": "no", "num_workers": 1}, "persistent_workers"),
        ({"pin_memory": "yes"}, "pin_memory"),
        ({"shuffle": "sometimes"}, "shuffle"),
        ({"num_workers": 1.5}, "num_workers"),
        ({"prefetch": 0}, "prefetch"),
        ({"on_error": "ignore"}, "on_error"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, named) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        DataLoader(DATA, **kwargs)
    assert isinstance(info.value, ValueError), "torch raises ValueError for its arguments"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"shuffle": 1},
        {"shuffle": np.bool_(True)},
        {"pin_memory": 0},
        {"persistent_workers": np.bool_(False)},
        {"num_workers": np.int64(0)},
        {"generator": torch.Generator().manual_seed(1)},
    ],
    ids=repr,
)
def test_the_forms_torch_accepts_are_accepted(kwargs) -> None:
    assert sorted(int(i) for b in DataLoader(DATA, batch_size=3, **kwargs) for i in b) == DATA


@pytest.mark.parametrize(
    ("key", "value"),
    [("epoch", "1"), ("position", 2.5), ("drop_last", 0), ("seed", None), ("shuffle", 3)],
)
def test_a_hand_edited_state_of_the_wrong_type_is_refused_naming_the_key(key, value) -> None:
    loader = DataLoader(DATA, batch_size=2)
    state = {**loader.state_dict(), key: value}
    with pytest.raises(StateError, match=rf"{key}=.*expected"):
        loader.load_state_dict(state)
