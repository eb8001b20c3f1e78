"""Synthetic images for the decode tests: made with Pillow at test time, no files."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image


def make_image(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    h, w = (96, 128) if i % 4 else (128, 96)  # some portrait images
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack(
        [(x * (1 + i % 3) + 7 * i) % 256, (y * 3 + i) % 256, ((x + y) * (i % 5 + 1)) % 256], -1
    )
    noise = rng.integers(-25, 25, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def encode(array: np.ndarray, fmt: str, mode: str | None = None) -> bytes:
    img = Image.fromarray(array)
    if mode:
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def make_batch(blobs: list[bytes], start: int = 0) -> dict:
    n = len(blobs)
    return {
        "image": list(blobs),
        "label": torch.arange(start, start + n),
        "path": [f"img/{start + i}.jpg" for i in range(n)],
        "weight": np.arange(start, start + n, dtype=np.float32),
    }


def bad_blob(kind: str, good: bytes) -> bytes:
    if kind == "truncated":
        return good[: len(good) // 2]
    if kind == "not-an-image":
        return b"this is a text file, not an image\n" * 4
    if kind == "zero-bytes":
        return b""
    if kind == "too-large":
        return encode(np.zeros((300, 300, 3), np.uint8), "JPEG")
    if kind == "corrupt":  # the header parses; the Huffman table is bogus (decoder fails)
        at = good.find(b"\xff\xc4")
        broken = bytearray(good)
        broken[at + 5 : at + 21] = b"\xff" * 16
        return bytes(broken)
    raise AssertionError(kind)


def pillow_window_resize(
    rgb: np.ndarray, window: tuple[int, int, int, int], size: int
) -> np.ndarray:
    """The definition the fast resize must meet: Pillow's bilinear resize of `window`
    (x, y, w, h) of ``uint8 [H, W, 3]`` to ``[size, size, 3]``, with DALI's edge rule
    (the window padded by replicating its border, then the inner box resized)."""
    import math

    x, y, w, h = window
    pad = math.ceil(max(w, h) / size) + 1  # the filter reaches max(1, w / size) beyond
    crop = np.pad(rgb[y : y + h, x : x + w], ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    box = (pad, pad, pad + w, pad + h)
    out = Image.fromarray(crop).resize((size, size), Image.Resampling.BILINEAR, box=box)
    return np.asarray(out)
