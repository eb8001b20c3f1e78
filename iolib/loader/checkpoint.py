"""The loader's state: a cursor, not a cache.

Epoch, global samples consumed, and what must match for the cursor to mean the same
thing (dataset fingerprint, seed, batch size, shuffle). The world size is recorded but
may change on restore (elastic resume): the cursor counts global samples.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

from iolib.errors import StateError

# 2: a state's `shuffle` is the order that ran and its fingerprint holds the lanes; a
# version-1 state is refused as another iolib's, not as another dataset.
STATE_VERSION = 2
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
    # What the fingerprint is made of (name -> short text), to say what differs when the
    # fingerprints do; optional on restore (states from before it lack it).
    dataset_fields: dict[str, str] = field(default_factory=dict)

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
    "dataset_fields": "dict",
}
_OPTIONAL = {"dataset_fields": {}}
# Attributes of a source that never change its stream (tuning, credentials, caching).
_NOT_THE_STREAM = frozenset(
    (
        "seed",
        "retry",
        "readahead",
        "cache_bytes",
        "storage_options",
        "url",
        "urls",
        "lists",
        "seed_globals",
        "restore_globals",
        "getitems",
        "drawn",
        "notes",
    )
)


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def dataset_fields(source: Any, prefix: str = "", depth: int = 0) -> dict[str, str]:
    """What a source's fingerprint is made of, as name -> short text, so a refused resume
    can say which differ (``seq_len: state has 128, loader has 256``). A source may
    supply its own with ``fingerprint_fields()``; otherwise its public settings (numbers,
    strings, short lists), its files (count and digest of paths, then of row counts) and
    those of the sources it wraps."""
    own = getattr(source, "fingerprint_fields", None)
    if callable(own):
        return {f"{prefix}{k}": str(v) for k, v in own().items()}
    fields: dict[str, str] = {}
    files = getattr(source, "files", None) if hasattr(type(source), "files") else None
    if isinstance(files, (list, tuple)) and all(hasattr(f, "path") for f in files):
        fields[f"{prefix}files"] = f"{len(files)} file(s) #{_digest([f.path for f in files])}"
        counts = [",".join(map(str, getattr(f, "row_groups", ()))) for f in files]
        fields[f"{prefix}row_groups"] = f"#{_digest(counts)}"
    for name, value in sorted(vars(source).items()):
        if name.startswith("_") or name in _NOT_THE_STREAM:
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            fields[f"{prefix}{name}"] = repr(value)
        elif isinstance(value, (list, tuple)) and len(value) <= 16:
            if all(isinstance(v, (bool, int, float, str)) for v in value):
                fields[f"{prefix}{name}"] = repr(list(value))
        elif depth < 2 and hasattr(value, "fingerprint") and hasattr(value, "read"):
            fields.update(dataset_fields(value, f"{prefix}{name}.", depth + 1))
    return fields


def _dataset_differences(state: dict[str, Any], current: LoaderState) -> str:
    """'dataset: ...' naming the fields that differ, where both sides recorded them."""
    saved, now = state.get("dataset_fields") or {}, current.dataset_fields
    head = f"dataset: state has {state['dataset']!r}, loader has {current.dataset!r}"
    if not saved or not now:
        return head
    names = sorted(set(saved) | set(now))
    differ = [_field_difference(name, saved.get(name), now.get(name)) for name in names
              if saved.get(name) != now.get(name)]  # fmt: skip
    if not differ:
        return head + " (the same settings and files: their content changed)"
    return f"{head}, which differ in " + ", ".join(differ)


def _field_difference(name: str, saved: str | None, now: str | None) -> str:
    """One field that differs, with what to pass where a setting the plan resolved
    (lanes="auto": the world size) explains it."""
    if name == "lanes" and saved is not None and now is not None and saved.isdigit():
        return (
            f"lanes (state {saved}, loader {now}): pass lanes={saved} to resume at another "
            "world size"
        )
    return f"{name} (state has {saved or 'nothing'}, loader has {now or 'nothing'})"


def _is(value: Any, kind: str) -> bool:
    if kind == "int?" and value is None:
        return True
    if kind.startswith("int"):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "dict":
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
    return isinstance(value, {"bool": bool, "str": str}[kind])


def check_state(state: dict[str, Any], current: LoaderState) -> LoaderState:
    """Validate a saved state against the loader's configuration; name every difference."""
    if not isinstance(state, dict):
        raise StateError(f"A loader state must be a dict from state_dict(). Found: {type(state)}.")
    state = {**_OPTIONAL, **state}
    version = state.get("version")
    if version != STATE_VERSION and version is not None:
        # Before the keys: an older state lacks newer keys, and "lacks keys" hid the cause.
        raise StateError(
            f"The state's version differs: it was written by another iolib (state version "
            f"{version!r}; this iolib reads version {STATE_VERSION}). Resume with the iolib "
            "that saved it, or start the epoch without load_state_dict()."
        )
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
    differ = [
        _dataset_differences(state, current)
        if key == "dataset"
        else f"{key}: state has {state[key]!r}, loader has {getattr(current, key)!r}"
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
