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


# What each key holds: "int" (not bool), "int?" (or None), "bool", "str".
_TYPES = {
    "epoch": "int",
    "position": "int",
    "seed": "int",
    "batch_size": "int?",
    "drop_last": "bool",
    "shuffle": "str",
    "shuffle_window": "int",
    "dataset": "str",
    "num_samples": "int",
    "world_size": "int",
    "version": "int",
}


def _is(value: Any, kind: str) -> bool:
    if kind == "int?" and value is None:
        return True
    if kind.startswith("int"):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {"bool": bool, "str": str}[kind])


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
    wrong = [
        f"{key}={state[key]!r} (expected {kind})"
        for key, kind in _TYPES.items()
        if not _is(state[key], kind)
    ]
    if wrong:
        raise StateError(
            f"The state has values of the wrong type: {', '.join(wrong)}. It was edited or "
            "damaged; use a state from DataLoader.state_dict()."
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
    # A user sampler's cursor counts batches and a stream's has no bound: only iolib's
    # own order bounds the position by the samples.
    limit = restored.num_samples if restored.num_samples else None
    position_ok = restored.position >= 0 and (limit is None or restored.position <= limit)
    if not position_ok or restored.epoch < 0:
        raise StateError(
            f"The state's cursor (epoch {restored.epoch}, position {restored.position}) lies "
            f"outside the dataset (0..{limit})."
        )
    return restored
