"""nvJPEG backend through ``torchvision.io.decode_jpeg(device="cuda")``.

Why: users with torchvision built for CUDA but without DALI still get GPU decoding,
with the same windows and flips as every other backend (drawn by iolib, not by
torchvision's transforms). JPEGs decode on the GPU in one batched call; other formats
(PNG) decode on the CPU with ``decode_image`` and are moved over. Crop, bilinear
antialiased resize (rounded back to uint8, as DALI and Pillow do), flip and
normalization run as torch ops on the GPU.

torchvision is imported on first use; it is not a dependency of iolib.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from iolib.decode.pil import to_output
from iolib.decode.probe import as_buffer
from iolib.decode.spec import OutputSpec

_JPEG_MAGIC = b"\xff\xd8\xff"


def _torchvision_io() -> Any:
    try:
        import torchvision.io as tvio
    except ImportError as exc:
        raise ImportError(
            "backend='nvjpeg' needs torchvision built with CUDA: "
            "pip install torchvision (matching your torch build)"
        ) from exc
    return tvio


class NvjpegBackend:
    """Batched nvJPEG decode on one CUDA device; thread-safe (no per-thread state)."""

    def __init__(self, spec: OutputSpec) -> None:
        if not spec.on_gpu:
            raise ValueError("backend='nvjpeg' decodes on a GPU: set device='cuda'")
        self.spec = spec

    def decode(self, blobs: list[Any], windows: np.ndarray, flips: np.ndarray) -> torch.Tensor:
        """Decode all images on the GPU, then crop/resize/flip each and normalize the batch."""
        tvio = _torchvision_io()
        device = torch.device(self.spec.device)
        datas = [torch.tensor(np.frombuffer(as_buffer(b), dtype=np.uint8)) for b in blobs]
        images: list[torch.Tensor | None] = [None] * len(datas)
        jpeg = [i for i, d in enumerate(datas) if bytes(d[:3].tolist()) == _JPEG_MAGIC]
        if jpeg:
            decoded = tvio.decode_jpeg(
                [datas[i] for i in jpeg], mode=tvio.ImageReadMode.RGB, device=device
            )
            for i, img in zip(jpeg, decoded, strict=True):
                images[i] = img
        for i, img in enumerate(images):
            if img is None:
                images[i] = tvio.decode_image(datas[i], mode=tvio.ImageReadMode.RGB).to(device)
        size = self.spec.size
        out = torch.empty((len(blobs), size, size, 3), dtype=torch.uint8, device=device)
        for i, img in enumerate(images):
            assert img is not None
            out[i] = _crop_resize(img, windows[i], bool(flips[i]), size)
        return to_output(out, self.spec)


def _crop_resize(img: torch.Tensor, window: np.ndarray, flip: bool, size: int) -> torch.Tensor:
    """CHW uint8 -> HWC uint8 ``size x size`` of the window, optionally mirrored."""
    x, y, w, h = (int(v) for v in window)
    crop = img[:, y : y + h, x : x + w].unsqueeze(0).to(torch.float32)
    resized = torch.nn.functional.interpolate(
        crop, size=(size, size), mode="bilinear", align_corners=False, antialias=True
    )
    out = resized.round_().clamp_(0, 255).to(torch.uint8)[0]
    if flip:
        out = out.flip(-1)
    return out.permute(1, 2, 0)
