"""What a decode backend is asked for (`OutputSpec`) and what it must do (`Backend`).

Why a module of its own: the backends (dali.py, pil.py, nvjpeg.py) and the package
that builds them (``iolib.decode.make_backend``) both need these; here, neither
imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass(frozen=True)
class OutputSpec:
    """What a backend must produce: ``size x size`` crops, in `layout` and `dtype`,
    normalized with `mean`/`std` (given on the 0–1 scale) unless dtype is uint8."""

    size: int
    layout: str  # "NCHW" | "NHWC"
    dtype: str  # "float32" | "float16" | "uint8"
    mean: tuple[float, ...]
    std: tuple[float, ...]
    device: str  # "cpu" | "cuda" | "cuda:N"
    threads: int  # decode threads per pipeline (DALI)

    @property
    def normalize(self) -> bool:
        return self.dtype != "uint8"

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


class Backend(Protocol):
    """Decodes a batch of encoded images given per-sample windows and flips.

    `windows` is ``int32 [N, 4]`` (x, y, w, h), `flips` ``bool [N]``. Returns one tensor
    ``[N, C, H, W]`` or ``[N, H, W, C]`` on the spec's device. Raises on any failure;
    the caller then finds the culprit sample by sample."""

    def decode(self, blobs: list[Any], windows: np.ndarray, flips: np.ndarray) -> torch.Tensor:
        """Decode, crop, resize, flip and normalize one batch."""
