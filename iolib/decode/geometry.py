"""Crop windows and flips, drawn once and shared by every decode backend.

Why a module of its own: DALI, Pillow and nvJPEG must crop the *same* pixels of the
same image for a given (seed, epoch, index), otherwise changing the backend (or the
machine) would change the training data. So the geometry is pure numpy, drawn here
from the sample's generator, and the backends only execute it.

A window is ``(x, y, w, h)`` in pixels of the source image (x = left column, y = top
row), the order DALI's ``axis_names="WH"`` slice arguments take. Every backend crops
the window, then resizes it to ``size x size``.

Example::

    >>> import numpy as np
    >>> from iolib.decode.geometry import random_resized_crop, center_crop
    >>> rng = np.random.Generator(np.random.Philox(0))
    >>> x, y, w, h = random_resized_crop(rng, width=128, height=96)
    >>> 0 <= x and x + w <= 128 and 0 <= y and y + h <= 96
    True
    >>> center_crop(width=128, height=96, size=224)
    Window(x=22, y=6, w=84, h=84)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from iolib.plan.rng import sample_rng

# torchvision's RandomResizedCrop defaults, and the classic ImageNet eval crop
# (resize the shorter side to 256, center crop 224: 224 / 256 = 0.875).
DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3.0 / 4.0, 4.0 / 3.0)
EVAL_CROP_FRACTION = 0.875
_TRIES = 10


class Window(NamedTuple):
    """A crop window in source-image pixels: left, top, width, height."""

    x: int
    y: int
    w: int
    h: int


def random_resized_crop(
    rng: np.random.Generator,
    width: int,
    height: int,
    scale: tuple[float, float] = DEFAULT_SCALE,
    ratio: tuple[float, float] = DEFAULT_RATIO,
) -> Window:
    """torchvision's RandomResizedCrop window: up to 10 tries at a random area fraction
    in `scale` and a log-uniform aspect ratio in `ratio`, else a center crop clamped to
    the ratio range. Draws come from `rng` only, so the window is a pure function of it."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(_TRIES):
        target_area = area * float(rng.uniform(scale[0], scale[1]))
        aspect = math.exp(float(rng.uniform(log_lo, log_hi)))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            y = int(rng.integers(0, height - h + 1))
            x = int(rng.integers(0, width - w + 1))
            return Window(x, y, w, h)
    return _ratio_clamped_center(width, height, ratio)


def _ratio_clamped_center(width: int, height: int, ratio: tuple[float, float]) -> Window:
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    w, h = max(1, min(w, width)), max(1, min(h, height))
    return Window((width - w) // 2, (height - h) // 2, w, h)


def center_crop(
    width: int, height: int, size: int, crop_fraction: float = EVAL_CROP_FRACTION
) -> Window:
    """The eval window: what "resize the shorter side to round(size / crop_fraction),
    then center-crop size x size" keeps, expressed in source pixels, so that every
    backend resizes once (one resampling, not two)."""
    resize_to = round(size / crop_fraction)
    side = max(1, min(width, height, round(min(width, height) * size / resize_to)))
    return Window((width - side) // 2, (height - side) // 2, side, side)


def draw_flip(rng: np.random.Generator) -> bool:
    """A horizontal flip with probability 1/2, drawn after the window."""
    return bool(rng.random() < 0.5)


@dataclass(frozen=True)
class CropSpec:
    """Which window and flip each sample of a batch gets: in training, a
    RandomResizedCrop window (`scale`, `ratio`) then a flip, drawn from the sample's own
    generator; in evaluation, the center crop of ``size / crop_fraction`` and no flip."""

    size: int
    train: bool = True
    scale: tuple[float, float] = DEFAULT_SCALE
    ratio: tuple[float, float] = DEFAULT_RATIO
    crop_fraction: float = EVAL_CROP_FRACTION

    def draw(
        self, sizes: list[tuple[int, int]], indices: np.ndarray, *, seed: int, epoch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Windows ``int32 [N, 4]`` (x, y, w, h) and flips ``bool [N]`` for images of the
        given (width, height), sample i drawing from ``sample_rng(seed, epoch, indices[i])``."""
        n = len(sizes)
        windows = np.zeros((n, 4), dtype=np.int32)
        flips = np.zeros(n, dtype=bool)
        for i, (width, height) in enumerate(sizes):
            if not self.train:
                windows[i] = center_crop(width, height, self.size, self.crop_fraction)
                continue
            rng = sample_rng(seed, epoch, int(indices[i]))
            windows[i] = random_resized_crop(rng, width, height, self.scale, self.ratio)
            flips[i] = draw_flip(rng)
        return windows, flips
