"""iolib: deterministic sharded data loading for PyTorch.

``from iolib import DataLoader`` is a drop-in replacement for
``torch.utils.data.DataLoader`` whose batches are a pure function of the dataset, the
seed, the epoch, the batch size and the rank (see docs/determinism.md).

Names load lazily so that ``import iolib`` stays cheap (no torch, pyarrow or DALI work
at import time).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any

__all__ = ["DataLoader", "sample_rng", "sources"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "DataLoader":
        from iolib.loader import DataLoader

        return DataLoader
    if name == "sample_rng":
        from iolib.plan.rng import sample_rng

        return sample_rng
    if name == "sources":
        import iolib.sources as sources

        return sources
    raise AttributeError(f"module 'iolib' has no attribute {name!r}")


# Modules that moved into their layer's package (0.2): the old path still imports the
# same module object, so a script written against the old layout keeps running.
_MOVED = {
    "iolib.images": "iolib.decode.images",  # old path
    "iolib.rng": "iolib.plan.rng",  # old path
    "iolib.distributed": "iolib.loader.distributed",  # old path
    "iolib.stages": "iolib.loader.stages",  # old path
    "iolib.autotune": "iolib.tuning.autotune",  # old path
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module's old path as the module at its new place."""

    def __init__(self) -> None:
        # Each module's own spec by old path, between the two calls below: the import
        # system overwrites it with the alias's. Keyed, since two threads may import two
        # old paths at once (each old path's import lock keeps one of them at a time).
        self._specs: dict[str, Any] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in _MOVED else None

    def create_module(self, spec: Any) -> ModuleType:
        module = importlib.import_module(_MOVED[spec.name])
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._specs.pop(module.__spec__.name)


if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
    sys.meta_path.append(_OldPaths())


def __dir__() -> list[str]:
    """The lazy public names too, so that dir() and completion offer them."""
    helpers = {"Any", "annotations", "importlib", "sys", "ModuleType", "_MOVED", "_OldPaths"}
    return sorted({*globals(), *__all__} - helpers)
