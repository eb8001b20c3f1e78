"""Image decode backends behind one interface: DALI (default), Pillow, nvJPEG.

Why several: DALI decodes on the GPU (``device="mixed"``) or on the CPU and is the
default wherever it is installed; Pillow is the fallback where DALI cannot be
installed (macOS, a user without the extra); torchvision's nvJPEG serves users with
torchvision+CUDA but no DALI. All of them execute crop windows and flips drawn by
``iolib.decode.geometry`` from ``iolib.rng.sample_rng``, so they crop the same pixels.

Module map:
  geometry.py  crop windows (RandomResizedCrop, eval center crop) and flips: pure numpy
  probe.py     header read (size, format) and early rejection of bad values
  dali.py      DALI pipelines fed by ``external_source``, one per thread
  pil.py       Pillow + numpy
  nvjpeg.py    ``torchvision.io.decode_jpeg(device="cuda")``

The public entry point is ``iolib.images.ImagePipeline``; nothing here is imported
eagerly (DALI, torchvision and torch load on first use).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "BACKENDS",
    "Backend",
    "OutputSpec",
    "dali_available",
    "dali_package",
    "make_backend",
]

BACKENDS = ("dali", "nvjpeg", "pil")
DISABLE_DALI_ENV = "IOLIB_DISABLE_DALI"


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


def dali_available() -> bool:
    """True when DALI imports and is not switched off by ``IOLIB_DISABLE_DALI=1``
    (the switch lets tests and users exercise the fallback without uninstalling)."""
    if os.environ.get(DISABLE_DALI_ENV, "").strip() not in ("", "0"):
        return False
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def dali_package() -> str:
    """The pip package of DALI matching the CUDA major version torch was built with."""
    import torch

    cuda = torch.version.cuda or ""
    return "nvidia-dali-cuda130" if cuda.startswith("13") else "nvidia-dali-cuda120"


def make_backend(name: str, spec: OutputSpec) -> Backend:
    """Build the backend called `name` ("dali", "pil" or "nvjpeg") for `spec`."""
    if name == "dali":
        from iolib.decode.dali import DaliBackend

        return DaliBackend(spec)
    if name == "pil":
        from iolib.decode.pil import PilBackend

        return PilBackend(spec)
    if name == "nvjpeg":
        from iolib.decode.nvjpeg import NvjpegBackend

        return NvjpegBackend(spec)
    raise ValueError(f"unknown decode backend {name!r}; expected one of {BACKENDS}")
