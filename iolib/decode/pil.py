"""Pillow backend: the fallback where DALI is not installed, with DALI's geometry.

Why crop, pad, then resize: DALI decodes exactly the window (``decoders.image_slice``)
and its resize clamps at the window's edges (replicates the border pixels), while
Pillow's filter near a border reads pixels beyond the box or renormalizes truncated
weights. Cropping the window, padding it by edge replication and resizing the inner
box makes Pillow's border arithmetic DALI's: measured, the edge columns then differ
by at most 1 level on noise images instead of up to 16. Bilinear with antialiasing
on both sides (Pillow always antialiases when shrinking).
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np
import torch
from PIL import Image

from iolib.decode import OutputSpec
from iolib.decode.probe import as_buffer

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}


class PilBackend:
    """Decodes with Pillow in the calling thread (the loader's workers parallelize)."""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec

    def decode(self, blobs: list[Any], windows: np.ndarray, flips: np.ndarray) -> torch.Tensor:
        """Decode, crop, resize and flip each image, then normalize the batch at once."""
        size = self.spec.size
        out = np.empty((len(blobs), size, size, 3), dtype=np.uint8)
        for i, blob in enumerate(blobs):
            out[i] = decode_one(blob, windows[i], bool(flips[i]), size)
        return to_output(torch.from_numpy(out), self.spec)


def decode_one(blob: Any, window: np.ndarray, flip: bool, size: int) -> np.ndarray:
    """One image: ``uint8 [size, size, 3]`` RGB of `window` resized, optionally flipped."""
    x, y, w, h = (int(v) for v in window)
    with Image.open(io.BytesIO(as_buffer(blob))) as img:
        rgb = img.convert("RGB")  # loads (decodes) the whole image; raises on bad data
    # The bilinear filter reaches max(1, window / size) source pixels beyond an edge.
    pad = math.ceil(max(w, h) / size) + 1
    window = np.asarray(rgb.crop((x, y, x + w, y + h)))
    padded = Image.fromarray(np.pad(window, ((pad, pad), (pad, pad), (0, 0)), mode="edge"))
    box = (pad, pad, pad + w, pad + h)
    out = padded.resize((size, size), Image.Resampling.BILINEAR, box=box)
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out)


def to_output(nhwc: torch.Tensor, spec: OutputSpec) -> torch.Tensor:
    """uint8 NHWC -> the spec's device, dtype and layout, normalized like DALI's
    ``crop_mirror_normalize``: ``(x - 255 * mean) / (255 * std)`` in float32.

    Moved to the device as uint8 first: a quarter of the bytes of float32."""
    x = nhwc.to(spec.device, non_blocking=False)
    if spec.normalize:
        mean = torch.tensor([255.0 * m for m in spec.mean], device=x.device)
        std = torch.tensor([255.0 * s for s in spec.std], device=x.device)
        x = ((x.to(torch.float32) - mean) / std).to(_TORCH_DTYPES[spec.dtype])
    if spec.layout == "NCHW":
        x = x.permute(0, 3, 1, 2).contiguous()
    return x
