"""Pillow backend: the fallback where DALI is not installed, with DALI's geometry.

Pillow decodes; the window is resized by ``iolib.decode.resize`` (torch's SIMD
antialiased bilinear kernel, with DALI's clamp-at-the-window-edge rule for the border
rows and columns), which is 2.6x faster than Pillow's own resize of a padded window
and within one level of it. Each image is written straight into the batch array.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from PIL import Image

from iolib.decode.probe import as_buffer
from iolib.decode.resize import resize_window
from iolib.decode.spec import OutputSpec

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}


class PilBackend:
    """Decodes with Pillow in the calling thread (the loader's workers parallelize)."""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec

    def decode(self, blobs: list[Any], windows: np.ndarray, flips: np.ndarray) -> torch.Tensor:
        """Decode, crop, resize and flip each image into one batch, then normalize it."""
        size = self.spec.size
        out = np.empty((len(blobs), 3, size, size), dtype=np.uint8)
        for i, blob in enumerate(blobs):
            decode_one(blob, windows[i], bool(flips[i]), out[i])
        return to_output(torch.from_numpy(out), self.spec, layout="NCHW")


def decode_one(blob: Any, window: np.ndarray, flip: bool, out: np.ndarray) -> np.ndarray:
    """One image into `out` (``uint8 [3, size, size]``): RGB of `window` resized with
    DALI's edge rule (iolib.decode.resize), optionally flipped."""
    x, y, w, h = (int(v) for v in window)
    with Image.open(io.BytesIO(as_buffer(blob))) as img:
        img.load()  # decodes the whole image; raises on bad data
        pixels = rgb8(img)[y : y + h, x : x + w]
    resize_window(pixels, out)
    if flip:
        out[...] = out[:, :, ::-1]  # numpy copies overlapping operands first
    return out


_WIDE_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def rgb8(img: Image.Image) -> np.ndarray:
    """8-bit RGB as DALI's decoder makes it, where Pillow's own conversion differs:
    16-bit samples are scaled (v / 257, rounded; Pillow saturates them at 255) and CMYK
    becomes (255 - C)(255 - K) / 255, rounded down (Pillow drops K's rounding: up to 2
    levels apart). Other modes go through Pillow's conversion."""
    if img.mode in _WIDE_MODES:
        wide = np.asarray(img).astype(np.float64)
        gray = np.clip(np.rint(wide / 257.0), 0, 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=-1)
    if img.mode == "CMYK":
        cmyk = np.asarray(img).astype(np.uint16)
        white = 255 - cmyk[..., 3:4]
        return ((255 - cmyk[..., :3]) * white // 255).astype(np.uint8)
    return np.asarray(img if img.mode == "RGB" else img.convert("RGB"))


def to_output(batch: torch.Tensor, spec: OutputSpec, layout: str = "NHWC") -> torch.Tensor:
    """uint8 `batch` in `layout` -> the spec's device, dtype and layout, normalized like
    DALI's ``crop_mirror_normalize``: ``(x - 255 * mean) / (255 * std)`` in float32.

    Moved to the device and laid out as uint8 first (a quarter of the bytes of float32),
    then normalized in place: one float32 batch alive at a time, not three."""
    x = batch.to(spec.device, non_blocking=False)
    if layout != spec.layout:
        order = (0, 3, 1, 2) if spec.layout == "NCHW" else (0, 2, 3, 1)
        x = x.permute(*order)
    if spec.normalize:
        shape = (3, 1, 1) if spec.layout == "NCHW" else (3,)
        mean = torch.tensor([255.0 * m for m in spec.mean], device=x.device).view(shape)
        std = torch.tensor([255.0 * s for s in spec.std], device=x.device).view(shape)
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        out.copy_(x).sub_(mean).div_(std)
        return out if spec.dtype == "float32" else out.to(_TORCH_DTYPES[spec.dtype])
    return x.contiguous()
