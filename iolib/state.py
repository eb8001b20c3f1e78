"""The loader's state: a cursor, not a cache.

Epoch, global samples consumed, and what must match for the cursor to mean the same
thing (dataset fingerprint, seed, batch size, shuffle). The world size is recorded but
may change on restore (elastic resume): the cursor counts global samples.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from iolib.errors import StateError

STATE_VERSION = 1
# Keys whose values must match between the saved state and the loader restoring it.
_MUST_MATCH = (
    "dataset",
    "num_samples",
    "seed",
    "batch_size",
    "drop_last",
    "shuffle",
    "shuffle_window",
)


@dataclass(frozen=True)
class LoaderState:
    epoch: int
    position: int  # global samples consumed in `epoch` (batches, with a batch_sampler)
    seed: int
    batch_size: int | None
    drop_last: bool
    shuffle: str
    shuffle_window: int
    dataset: str  # the source's fingerprint
    num_samples: int
    world_size: int  # informational: restoring at another world size is allowed
    version: int = STATE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_state(state: dict[str, Any], current: LoaderState) -> LoaderState:
    """Validate a saved state against the loader's configuration; name every difference."""
    if not isinstance(state, dict):
        raise StateError(f"A loader state must be a dict from state_dict(). Found: {type(state)}.")
    expected = set(current.to_dict())
    missing = sorted(expected - set(state))
    if missing:
        raise StateError(
            f"The state lacks key(s) {missing}: it was not made by iolib's "
            "DataLoader.state_dict() (or by an incompatible version)."
        )
    if state["version"] != STATE_VERSION:
        raise StateError(
            f"State version {state['version']} is not supported (this iolib writes "
            f"{STATE_VERSION})."
        )
    differ = [
        f"{key}: state has {state[key]!r}, loader has {getattr(current, key)!r}"
        for key in _MUST_MATCH
        if state[key] != getattr(current, key)
    ]
    if differ:
        raise StateError(
            "The state does not fit this loader; "
            + "; ".join(differ)
            + ". Build the loader with the dataset and arguments the state was saved with, "
            "or start without load_state_dict()."
        )
    restored = LoaderState(**{k: state[k] for k in expected})
    limit = restored.num_samples
    if not 0 <= restored.position <= limit or restored.epoch < 0:
        raise StateError(
            f"The state's cursor (epoch {restored.epoch}, position {restored.position}) lies "
            f"outside the dataset (0..{limit})."
        )
    return restored
