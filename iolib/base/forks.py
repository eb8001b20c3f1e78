"""What a forked worker process must not inherit: a lock that another thread held at
the fork (it stays held: nobody in the child releases it) and a read in flight whose
reader stayed in the parent (whoever waits for it waits forever).

Objects that hold such state register once; every child forked afterwards calls
their `_after_fork()` before it runs anything else. Spawned workers unpickle, which
rebuilds the same state.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    def _after_fork(self) -> None: ...


# By id, not by hash: a filesystem's hash is its token, set only after its __init__.
_LIVE: weakref.WeakValueDictionary[int, ForkAware] = weakref.WeakValueDictionary()


def reset_after_fork(obj: ForkAware) -> None:
    """Call `obj._after_fork()` in each process forked from this one from now on."""
    _LIVE[id(obj)] = obj


def _in_child() -> None:
    for obj in list(_LIVE.values()):
        obj._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
