"""The loader-state validator: each key that must match is checked and named, the
cursor's bounds hold at both ends, and a state from another iolib says its version
differs. Each case fails if its check is dropped from iolib/loader/checkpoint.py."""

from __future__ import annotations

import pytest

from iolib import DataLoader
from iolib.errors import StateError
from iolib.loader.checkpoint import STATE_VERSION

N = 45


class Indices:
    """A map-style dataset whose sample is its index."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def _loader(**kw) -> DataLoader:
    args = dict(batch_size=4, shuffle="block", shuffle_window=2, seed=3, num_workers=0)
    return DataLoader(Indices(kw.pop("n", N)), **{**args, **kw})


def _saved(after: int) -> dict:
    loader = _loader()
    it = iter(loader)
    for _ in range(after):
        next(it)
    return loader.state_dict()


# Each key that must match, with another value of the right type. A key added to
# checkpoint._MUST_MATCH (e.g. a shuffle option) gets a row here.
OTHER_VALUES = {
    "dataset": "0123456789abcdef",
    "num_samples": N + 5,
    "seed": 4,
    "batch_size": 5,
    "drop_last": True,
    "shuffle": "global",
    "shuffle_window": 3,
}


@pytest.mark.parametrize("key", list(OTHER_VALUES))
def test_each_key_that_must_match_is_refused_by_name(key) -> None:
    state = {**_saved(2), key: OTHER_VALUES[key]}
    with pytest.raises(StateError, match=rf"does not fit this loader; {key}: state has"):
        _loader().load_state_dict(state)


def test_every_key_that_must_match_has_a_case() -> None:
    from iolib.loader.checkpoint import _MUST_MATCH

    assert set(_MUST_MATCH) == set(OTHER_VALUES)


def test_a_state_saved_after_the_last_batch_resumes_with_nothing_left() -> None:
    """Saved after the last batch, before the iterator ends: position N, nothing left of
    that epoch (position <= N, not < N); saved after it ends: the next epoch, whole."""
    loader = _loader()
    after_last_step = _saved(len(loader))
    assert after_last_step["position"] == N and after_last_step["epoch"] == 0
    resumed = _loader()
    resumed.load_state_dict(after_last_step)
    assert list(resumed) == []  # nothing repeated
    list(loader)
    ended = loader.state_dict()
    assert (ended["epoch"], ended["position"]) == (1, 0)
    resumed = _loader()
    resumed.load_state_dict(ended)
    fresh = _loader()
    fresh.set_epoch(1)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in fresh]


@pytest.mark.parametrize("position", [-1, N + 1, 10 * N])
def test_a_cursor_outside_the_epoch_is_refused(position) -> None:
    state = {**_saved(2), "position": position}
    with pytest.raises(StateError, match=rf"position {position}\) lies outside .*0\.\.{N}"):
        _loader().load_state_dict(state)


def test_a_negative_epoch_is_refused() -> None:
    with pytest.raises(StateError, match=r"epoch -1, position"):
        _loader().load_state_dict({**_saved(2), "epoch": -1})


@pytest.mark.parametrize("version", [STATE_VERSION - 1, STATE_VERSION + 1, 0])
def test_a_state_of_another_version_says_the_version_differs(version) -> None:
    state = {**_saved(2), "version": version}
    with pytest.raises(StateError, match=rf"version differs.*state version {version}"):
        _loader().load_state_dict(state)


def test_an_older_state_lacking_newer_keys_still_says_the_version_differs() -> None:
    state = _saved(2)
    del state["shuffle_window"], state["dataset_fields"]
    state["version"] = STATE_VERSION - 1
    with pytest.raises(StateError, match="version differs"):
        _loader().load_state_dict(state)


def test_a_state_at_the_bounds_resumes_where_it_says() -> None:
    """Positions 0 and N (both ends) are accepted and deliver the rest of the epoch."""
    whole = [b.tolist() for b in _loader()]
    for after in (0, 3):
        resumed = _loader()
        resumed.load_state_dict(_saved(after))
        assert [b.tolist() for b in resumed] == whole[after:]
