"""What must stop before another library's exit hook runs (DALI asserts that no pipeline
is alive at exit): the engine registers its workers here, and a decoder's exit hook runs
them, so decoders never import the engine."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

_STOPPERS: list[Callable[[], None]] = []


def register_stopper(stop: Callable[[], None]) -> None:
    """Run `stop` when `stop_all` is called (once per registration)."""
    _STOPPERS.append(stop)


def stop_all() -> None:
    """Run every registered stopper; one failing does not keep the others from running."""
    for stop in list(_STOPPERS):
        with contextlib.suppress(Exception):
            stop()
