"""iolib: deterministic sharded data loading for PyTorch.

``from iolib import DataLoader`` is a drop-in replacement for
``torch.utils.data.DataLoader`` whose batches are a pure function of the dataset, the
seed, the epoch, the batch size and the rank (see docs/determinism.md).

Names load lazily so that ``import iolib`` stays cheap (no torch, pyarrow or DALI work
at import time).
"""

from __future__ import annotations

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


def __dir__() -> list[str]:
    """The lazy public names too, so that dir() and completion offer them."""
    return sorted({*globals(), *__all__} - {"Any", "annotations"})
