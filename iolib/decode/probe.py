"""Read an encoded image's header (format, width, height) and reject bad values early.

Why before decoding: the crop window is drawn from the image size, so every backend
needs the size first; and DALI fails a whole batch (and its pipeline) on one bad image,
so catching empty, non-image, truncated and oversized values here keeps that rare.
JPEG headers are parsed here directly (a marker walk, a few microseconds); other
formats go through Pillow's ``Image.open``, which reads only the header.
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

# Pillow's own decompression-bomb threshold (about 89 megapixels): a sane default cap.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485

_JPEG_EOI = b"\xff\xd9"
_JPEG_SOS = b"\xff\xda"
# Start-of-frame markers (baseline, extended, progressive, lossless; not DHT/JPG/DAC).
_SOF_MARKERS = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)


class BadImage(Exception):
    """One encoded value cannot be decoded; the message says why (for DataError)."""


class ImageInfo(NamedTuple):
    format: str
    width: int
    height: int


def as_buffer(value: Any) -> memoryview:
    """A read-only byte view of a bytes-like value or a uint8 numpy array (no copy)."""
    if value is None:
        raise BadImage("the value is missing (None)")
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim != 1:
            raise BadImage(f"expected encoded bytes, found an array {value.dtype}{value.shape}")
        return memoryview(np.ascontiguousarray(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return memoryview(value).cast("B")
    raise BadImage(f"expected encoded image bytes, found {type(value).__name__}")


def probe(value: Any, max_pixels: int) -> ImageInfo:
    """Return the header info of one encoded image, or raise BadImage saying what is wrong."""
    buf = as_buffer(value)
    if buf.nbytes == 0:
        raise BadImage("the value is empty (zero bytes)")
    data = value if isinstance(value, bytes) else bytes(buf)
    size = _jpeg_size(data)
    if size is not None:  # the common case, parsed without Pillow (~10x faster)
        fmt, (width, height) = "JPEG", size
    else:
        fmt, width, height = _pillow_header(buf)
    if width <= 0 or height <= 0:
        raise BadImage(f"the header gives an empty image ({width}x{height})")
    if width * height > max_pixels:
        raise BadImage(
            f"the image is {width}x{height} = {width * height} pixels, over "
            f"max_image_pixels={max_pixels}; raise the limit if this image is expected"
        )
    _check_complete(data, fmt)
    return ImageInfo(fmt, width, height)


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's SOF marker, or None to let Pillow decide.

    Walks the marker segments after SOI up to the first start-of-frame; anything
    unexpected returns None, and Pillow's parser gives the verdict."""
    if not data.startswith(b"\xff\xd8"):
        return None
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker in _SOF_MARKERS:
            if pos + 9 > end or length < 8:
                return None
            height = int.from_bytes(data[pos + 5 : pos + 7], "big")
            width = int.from_bytes(data[pos + 7 : pos + 9], "big")
            return (width, height) if width and height else None
        if marker == 0xDA or length < 2:  # a scan before any frame header: malformed
            return None
        pos += 2 + length
    return None


def _pillow_header(buf: memoryview) -> tuple[str, int, int]:
    try:
        # Pillow may warn (DecompressionBombWarning) past ~89 MP; the check below rejects
        # such images anyway. (catch_warnings is not thread-safe, so it is not used here.)
        with Image.open(io.BytesIO(buf)) as img:
            fmt, (width, height) = img.format or "?", img.size
    except Image.DecompressionBombError as exc:
        raise BadImage(f"the image is too large to open safely ({exc})") from None
    except Image.UnidentifiedImageError:
        head = bytes(buf[:8]).hex(" ")
        raise BadImage(f"not a recognized image format (first bytes: {head})") from None
    except Exception as exc:  # Pillow raises several types for a broken header.
        raise BadImage(f"the image header is broken ({type(exc).__name__}: {exc})") from None
    return fmt, width, height


def _check_complete(data: bytes, fmt: str) -> None:
    """Catch truncated JPEG/PNG files without decoding them.

    A JPEG ends its last scan with an EOI marker; inside entropy-coded data 0xFF is
    always stuffed, so an EOI after the last SOS marker means the scan data is whole.
    (An embedded EXIF thumbnail sits before the main scans and cannot fool this.)
    Searched as "no SOS after the last EOI": the EOI is normally in the last bytes, so
    this reads a few bytes where ``rfind(SOS)`` would scan the whole file (~30 us)."""
    if fmt in ("JPEG", "MPO") and data.find(_JPEG_SOS, data.rfind(_JPEG_EOI) + 1) >= 0:
        raise BadImage("the JPEG is truncated (no end-of-image marker after its last scan)")
    if fmt == "PNG" and data.rfind(b"IEND") < 0:
        raise BadImage("the PNG is truncated (no IEND chunk)")
