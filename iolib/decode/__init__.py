"""Decoders: what the loader asks of one, and image decode backends behind one interface.

``Decoder`` (protocol.py) is what ``DataLoader(decode=...)`` takes: ``ImagePipeline``,
or any function ``decode(batch, indices, *, seed, epoch)``. The rest of this package is
the image decoding behind ``iolib.decode.images.ImagePipeline``: DALI (default), Pillow, nvJPEG.

Why several: DALI decodes on the GPU (``device="mixed"``) or on the CPU and is the
default wherever it is installed; Pillow is the fallback where DALI cannot be
installed (macOS, a user without the extra); torchvision's nvJPEG serves users with
torchvision+CUDA but no DALI. All of them execute crop windows and flips drawn by
``iolib.decode.geometry`` from ``iolib.sample_rng``, so they crop the same pixels.

Module map:
  protocol.py  Decoder: what the fetcher, the stage loaders and the loader may ask of a decoder
  spec.py      OutputSpec and Backend: what a backend is asked for and must do
  batch.py     one batch through a backend: header checks, crops, bad-sample handling
  geometry.py  crop windows (RandomResizedCrop, eval center crop) and flips: pure numpy
  probe.py     header read (size, format) and early rejection of bad values
  dali.py      a DALI pipeline fed by ``external_source``, one per process
  pil.py       Pillow + numpy
  nvjpeg.py    ``torchvision.io.decode_jpeg(device="cuda")``

The public entry point is ``iolib.decode.images.ImagePipeline``; nothing here is imported
eagerly (DALI, torchvision and torch load on first use).
"""

from __future__ import annotations

import os

from iolib.decode.protocol import Decoder, FunctionDecoder
from iolib.decode.spec import Backend, OutputSpec

__all__ = [
    "BACKENDS",
    "Backend",
    "Decoder",
    "FunctionDecoder",
    "OutputSpec",
    "dali_available",
    "dali_package",
    "make_backend",
]

BACKENDS = ("dali", "nvjpeg", "pil")
DISABLE_DALI_ENV = "IOLIB_DISABLE_DALI"


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
