"""Two of torch's own test file's cases: an IterDataPipe takes `shuffle`, and a worker
that cannot be pickled under spawn warns with torch's words before the error."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.conformance.conftest import Numbers


def test_an_iterdatapipe_takes_shuffle(Loader) -> None:
    pipe = IterableWrapper(range(20)).shuffle()
    in_order = list(Loader(pipe, batch_size=None, shuffle=False))
    shuffled = list(Loader(pipe, batch_size=None, shuffle=True))
    assert in_order == list(range(20))
    assert sorted(shuffled) == list(range(20)) and shuffled != in_order


def test_an_unpicklable_worker_init_fn_under_spawn_warns_then_raises(Loader) -> None:
    loader = Loader(
        Numbers(4),
        batch_size=2,
        num_workers=1,
        multiprocessing_context="spawn",
        worker_init_fn=lambda worker_id: torch.manual_seed(worker_id),
    )
    with (
        pytest.warns(UserWarning, match="Got pickle error when attempting to start a worker"),
        pytest.raises(Exception),  # noqa: B017 - pickle's own error, whatever its type
    ):
        next(iter(loader))
