"""One batch through a backend: header checks, geometry, decode, bad-sample handling.

Why the order: headers first (cheap, and the windows need the sizes), so bad values
rarely reach DALI, which fails a whole batch and its pipeline on one bad image. When a
batch still fails, each sample is decoded alone to find the culprits; per-sample
outputs are bit-identical to batched ones, so the survivors are unchanged.

Skipped samples leave every column (tensors and lists alike) and the others keep
their order; their global indices go back to the loader, which counts them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from iolib.decode.geometry import CropSpec
from iolib.decode.probe import BadImage, probe
from iolib.decode.spec import Backend, OutputSpec
from iolib.errors import ConfigError, DataError, OnError

_CONTEXT_COLUMNS = ("path",)
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}


@dataclass(frozen=True)
class BatchSettings:
    """What decoding a batch needs, resolved by its ImagePipeline: the column of
    encoded images, the header limit, the bad-sample policy, the crops and the output."""

    column: str
    max_image_pixels: int
    on_error: OnError
    crops: CropSpec
    output: OutputSpec


def decode_batch(
    settings: BatchSettings,
    backend: Backend,
    batch: dict[str, Any],
    indices: np.ndarray,
    *,
    seed: int,
    epoch: int,
) -> tuple[dict[str, Any], list[int]]:
    """The body of ``ImagePipeline.__call__`` (see there)."""
    column, raises = settings.column, settings.on_error == OnError.RAISE
    if column not in batch:
        raise ConfigError(
            f"The batch has no column {column!r} (it has {sorted(batch)}); "
            "set ImagePipeline(image_column=...)."
        )
    blobs = list(batch[column])
    _require_image_bytes(blobs, batch, column)
    indices = np.asarray(indices, dtype=np.int64)
    if len(blobs) != len(indices):
        raise ValueError(f"{len(blobs)} images but {len(indices)} indices in one batch")
    sizes, bad = probe_all(blobs, settings.max_image_pixels)
    if bad and raises:
        raise _data_error(bad, batch, indices, column)
    good = [p for p in range(len(blobs)) if p not in bad]
    crops = settings.crops.draw([sizes[p] for p in good], indices[good], seed=seed, epoch=epoch)
    chosen = [blobs[p] for p in good]
    images, failed = _decode_or_isolate(backend, chosen, *crops, settings.output)
    for pos_in_good, reason in failed.items():
        bad[good[pos_in_good]] = reason
    if failed and raises:
        raise _data_error(bad, batch, indices, column)
    keep = [p for p in range(len(blobs)) if p not in bad]
    out = take_rows(batch, keep, len(blobs), skip=column)
    out[column] = images
    return out, [int(indices[p]) for p in sorted(bad)]


def _require_image_bytes(blobs: list[Any], batch: dict[str, Any], column: str) -> None:
    """A column with no bytes at all (text, numbers) is the wrong column, not bad data:
    on_error='skip' would drop every sample, so name image_column instead."""
    kinds = {type(b).__name__ for b in blobs if b is not None}
    if not kinds or any(isinstance(b, (bytes, bytearray, memoryview, np.ndarray)) for b in blobs):
        return
    binary = [
        k for k, v in batch.items()
        if isinstance(v, (list, tuple)) and v and isinstance(v[0], (bytes, bytearray))
    ]  # fmt: skip
    raise ConfigError(
        f"Column {column!r} holds {', '.join(sorted(kinds))}, not encoded image bytes, so it "
        f"is not the image column. Set ImagePipeline(image_column=...) to the column of image "
        f"bytes (columns of bytes in this batch: {binary})."
    )


def probe_all(blobs: list[Any], max_pixels: int) -> tuple[list[tuple[int, int]], dict[int, str]]:
    """(width, height) per sample ((0, 0) where bad) and the reasons by batch position."""
    sizes: list[tuple[int, int]] = []
    bad: dict[int, str] = {}
    for pos, blob in enumerate(blobs):
        try:
            info = probe(blob, max_pixels)
            sizes.append((info.width, info.height))
        except BadImage as exc:
            sizes.append((0, 0))
            bad[pos] = str(exc)
    return sizes, bad


def _decode_or_isolate(
    backend: Backend,
    blobs: list[Any],
    windows: np.ndarray,
    flips: np.ndarray,
    output: OutputSpec,
) -> tuple[torch.Tensor, dict[int, str]]:
    if not blobs:
        return _empty(output), {}
    try:
        return backend.decode(blobs, windows, flips), {}
    except Exception as batch_exc:
        first_error: BaseException = batch_exc
    parts: list[torch.Tensor] = []
    failed: dict[int, str] = {}
    for i in range(len(blobs)):
        try:
            parts.append(backend.decode([blobs[i]], windows[i : i + 1], flips[i : i + 1]))
        except Exception as exc:
            failed[i] = f"the decoder failed ({type(exc).__name__}: {_first_line(exc)})"
    if len(blobs) > 1 and len(failed) == len(blobs):
        # Every sample failing alone points at the decoder, not the data: don't skip it all.
        raise first_error
    return (torch.cat(parts) if parts else _empty(output)), failed


def take_rows(batch: dict[str, Any], keep: list[int], n: int, skip: str = "") -> dict[str, Any]:
    """A new batch with only rows `keep` (in order) of every column of length `n`."""
    if len(keep) == n:
        return {k: v for k, v in batch.items() if k != skip}
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if key == skip:
            continue
        if isinstance(value, torch.Tensor) and value.ndim > 0 and value.shape[0] == n:
            out[key] = value[torch.as_tensor(keep, dtype=torch.long, device=value.device)]
        elif isinstance(value, np.ndarray) and value.ndim > 0 and value.shape[0] == n:
            out[key] = value[keep]
        elif isinstance(value, (list, tuple)) and len(value) == n:
            out[key] = type(value)(value[i] for i in keep)
        else:
            out[key] = value
    return out


def _data_error(
    bad: dict[int, str], batch: dict[str, Any], indices: np.ndarray, column: str
) -> DataError:
    lines = []
    for pos in sorted(bad)[:5]:
        where = f"sample {int(indices[pos])}"
        for name in _CONTEXT_COLUMNS:
            values = batch.get(name)
            if isinstance(values, (list, tuple)) and len(values) == len(indices):
                where += f" ({name}={values[pos]!r})"
        lines.append(f"{where}: {bad[pos]}")
    more = f"\n  ... and {len(bad) - 5} more" if len(bad) > 5 else ""
    return DataError(
        f"Bad image in column {column!r}:\n  "
        + "\n  ".join(lines)
        + more
        + "\nPass on_error='skip' to ImagePipeline to leave such samples out.",
        samples=[int(indices[p]) for p in sorted(bad)],
        column=column,
        whole_block=False,
    )


def _empty(spec: OutputSpec) -> torch.Tensor:
    s = spec.size
    shape = (0, 3, s, s) if spec.layout == "NCHW" else (0, s, s, 3)
    return torch.empty(shape, dtype=_TORCH_DTYPES[spec.dtype], device=spec.device)


def _first_line(exc: BaseException) -> str:
    """The informative part of an error: DALI's messages put it after "encountered:"."""
    text = str(exc).strip()
    if "encountered:" in text:
        text = text.split("encountered:", 1)[1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "no longer valid" not in ln]
    text = re.sub(r"sample #\d+\s*:?", "the image", " ".join(lines))  # batch-local numbers
    return text[:300] if lines else "no message"
