"""A resume mistake is said, not silent: set_epoch(another epoch) right after
load_state_dict names the cursor it discards, from the script's line."""

from __future__ import annotations

import warnings

import pytest

from iolib import DataLoader


def _state(epoch: int, batches: int) -> dict:
    loader = DataLoader(list(range(200)), batch_size=20, shuffle=True, seed=0)
    loader.set_epoch(epoch)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    return loader.state_dict()


def test_set_epoch_discarding_a_restored_cursor_warns_naming_it() -> None:
    state = _state(1, 4)
    assert (state["epoch"], state["position"]) == (1, 80)
    loader = DataLoader(list(range(200)), batch_size=20, shuffle=True, seed=0)
    loader.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"epoch 1, position 80") as caught:
        loader.set_epoch(0)  # the commonest bug: an epoch loop that starts at 0
    assert caught[0].filename == __file__, caught[0].filename
    assert "set_epoch(1)" in str(caught[0].message)
    assert len(list(loader)) == 10  # epoch 0 from its start, as asked


@pytest.mark.parametrize(("state_at", "then"), [((1, 4), 1), ((1, 10), 2)],
                         ids=["same-epoch", "next-after-a-finished-one"])  # fmt: skip
def test_set_epoch_that_keeps_or_follows_the_cursor_is_quiet(state_at, then) -> None:
    loader = DataLoader(list(range(200)), batch_size=20, shuffle=True, seed=0)
    loader.load_state_dict(_state(*state_at))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.set_epoch(then)
