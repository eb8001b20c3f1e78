"""Conformance helpers: the determinism contract as reusable assertions.

Run them over every source and option (tests do); a new source or option passes them
or it breaks the contract. ``make_loader(**overrides)`` must build a fresh loader.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch

LoaderFactory = Callable[..., Any]


def to_numpy_tree(batch: Any) -> Any:
    """A batch as plain numpy/bytes/str values, for exact comparison."""
    if isinstance(batch, torch.Tensor):
        return batch.detach().cpu().numpy()
    if isinstance(batch, dict):
        return {k: to_numpy_tree(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [to_numpy_tree(v) for v in batch]
    return batch


def assert_batches_equal(left: Iterable[Any], right: Iterable[Any], what: str = "") -> None:
    """Equal, bit for bit (dtype, shape, bytes), batch by batch."""
    left, right = list(left), list(right)
    assert len(left) == len(right), f"{what}: {len(left)} batches vs {len(right)}"
    for k, (a, b) in enumerate(zip(left, right, strict=True)):
        _assert_tree_equal(to_numpy_tree(a), to_numpy_tree(b), f"{what} batch {k}")


def _assert_tree_equal(a: Any, b: Any, where: str) -> None:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{where}: array vs {type(b)}"
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        )
        assert a.tobytes() == b.tobytes(), f"{where}: values differ"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            _assert_tree_equal(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: lists differ in length"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_tree_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def epoch_batches(loader: Any, epoch: int = 0) -> list[Any]:
    """All batches of one epoch."""
    loader.set_epoch(epoch)
    return [to_numpy_tree(b) for b in loader]


def assert_same_batches_across_workers(
    make_loader: LoaderFactory,
    settings: Iterable[dict[str, Any]] = (
        {"num_workers": 0},
        {"num_workers": 1, "prefetch": 1},
        {"num_workers": 2, "prefetch": 3},
        {"num_workers": 4, "prefetch": 8},
    ),
    epochs: Iterable[int] = (0, 1),
) -> None:
    """Every worker count and prefetch depth yields the same batches, epoch by epoch."""
    settings = list(settings)
    for epoch in epochs:
        reference = epoch_batches(make_loader(**settings[0]), epoch)
        for setting in settings[1:]:
            got = epoch_batches(make_loader(**setting), epoch)
            assert_batches_equal(reference, got, f"epoch {epoch} with {setting}")


def assert_checkpoint_roundtrip(
    make_loader: LoaderFactory, stop_after: Iterable[int], epoch: int = 0, **resume_kwargs: Any
) -> None:
    """Stopping after k batches, saving state (through JSON) and restoring it in a fresh
    loader (optionally with other settings) yields exactly the uninterrupted remainder."""
    full = epoch_batches(make_loader(), epoch)
    for k in stop_after:
        loader = make_loader()
        loader.set_epoch(epoch)
        iterator = iter(loader)
        head = [to_numpy_tree(next(iterator)) for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))
        del iterator
        resumed = make_loader(**resume_kwargs)
        resumed.load_state_dict(state)
        resumed.set_epoch(epoch)
        tail = [to_numpy_tree(b) for b in resumed]
        assert_batches_equal(full, head + tail, f"resume after {k} batches")
