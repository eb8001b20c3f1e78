"""Training-ready image batches: decode, random-resized crop, flip, normalize, layout.

``ImagePipeline`` is what a training script passes to ``iolib.DataLoader(decode=...)``.
It is a frozen, picklable description; the decoder it drives (a DALI pipeline, one per
process, which loader threads take turns on) is built on first use. Each sample's crop
window and flip come from ``iolib.sample_rng(seed, epoch, index)``, so a batch is
a pure function of its bytes and indices: the same for any worker count, prefetch depth
or resume, and the same crop windows on every backend (pixels may differ by rounding
between backends).

Example::

    from iolib import DataLoader
    from iolib.decode.images import ImagePipeline
    from iolib.sources import ParquetSource

    loader = DataLoader(
        ParquetSource("s3://bucket/imagenet/train/"), batch_size=256, shuffle="block",
        num_workers=4, seed=0, decode=ImagePipeline(size=224, train=True),
    )
    for batch in loader:  # batch["image"]: float32 [256, 3, 224, 224] on the GPU
        ...
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from iolib.base.resources import cpu_count
from iolib.decode import BACKENDS, Backend, OutputSpec, dali_available, dali_package
from iolib.decode import geometry as geo
from iolib.decode.heap import leave_mapping, limit_arenas
from iolib.decode.probe import DEFAULT_MAX_IMAGE_PIXELS
from iolib.errors import ConfigError, OnError, refuse_loader_arguments, require_positive_int

__all__ = ["ImagePipeline"]

if TYPE_CHECKING:
    from iolib.decode.batch import BatchSettings

log = logging.getLogger("iolib.images")
_notice_logged = False
_RESOLVING = threading.Lock()  # one backend per ImagePipeline, however many threads ask


def _unlock_after_fork() -> None:
    """A forked worker starts with `_RESOLVING` free: a parent thread that held it (a
    backend being built) does not exist there to let it go."""
    global _RESOLVING
    _RESOLVING = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_unlock_after_fork)
_LAYOUT_DTYPES = {"NCHW": "float32", "NHWC": "uint8"}
_DTYPES = ("float16", "float32", "uint8")


@dataclass(frozen=True)
class ImagePipeline:
    """Decode encoded images (JPEG, PNG, ...) of one column into a tensor batch: an
    ``iolib.decode.Decoder`` (it consumes `columns`, skips or raises by `on_error`).

    size: output side in pixels (crops are size x size).
    train: random-resized crop + flip (True) or the eval center crop (False).
    mean, std: per-channel normalization on the 0–1 scale (ignored for uint8 output).
    layout: "NCHW" or "NHWC". dtype: "float32"/"float16" (normalized) or "uint8"
        (raw pixels); default float32 for NCHW, uint8 for NHWC.
    backend: "auto" (DALI where installed, else Pillow), "dali", "pil" or "nvjpeg".
    device: "cpu", "cuda" or "cuda:N"; default "cuda" when available.
    on_error: "raise" a DataError naming the sample, or "skip" it (the loader counts it).
    max_image_pixels: images with more pixels (from the header) are bad input.
    scale, ratio: RandomResizedCrop's area-fraction and aspect-ratio ranges.
    crop_fraction: eval crop size / resize size (0.875: 224 of 256).
    threads: decode threads of the DALI pipeline, one per process (loader worker threads
        take turns on it; each worker process has its own); default: all cores.
    """

    size: int = 224
    train: bool = True
    mean: tuple[float, ...] = (0.485, 0.456, 0.406)
    std: tuple[float, ...] = (0.229, 0.224, 0.225)
    layout: str = "NCHW"
    dtype: str | None = None
    backend: str = "auto"
    device: str | None = None
    image_column: str = "image"
    on_error: OnError | str = OnError.RAISE
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    scale: tuple[float, float] = geo.DEFAULT_SCALE
    ratio: tuple[float, float] = geo.DEFAULT_RATIO
    crop_fraction: float = geo.EVAL_CROP_FRACTION
    threads: int | None = None
    _runtime: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __new__(cls, *args: Any, **kwargs: Any) -> ImagePipeline:
        # batch_size= here: say it is DataLoader's
        refuse_loader_arguments(
            cls, kwargs, "DataLoader(source, {name}=..., decode=ImagePipeline(...))"
        )
        return super().__new__(cls)

    def __post_init__(self) -> None:
        require_positive_int("size", self.size)
        require_positive_int("max_image_pixels", self.max_image_pixels)
        if self.threads is not None:
            require_positive_int("threads", self.threads)
        _require_choice("layout", self.layout, tuple(_LAYOUT_DTYPES))
        _require_choice("backend", self.backend, ("auto", *BACKENDS))
        object.__setattr__(self, "on_error", OnError.parse(self.on_error))
        if self.dtype is not None:
            _require_choice("dtype", self.dtype, _DTYPES)
        for name in ("mean", "std"):
            value = getattr(self, name)
            if len(value) != 3 or not all(isinstance(v, (int, float)) for v in value):
                raise ConfigError(f"`{name}` must be 3 numbers (R, G, B). Found: {value!r}.")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        if any(s <= 0 for s in self.std):
            raise ConfigError(f"`std` must be positive. Found: {self.std!r}.")
        for name in ("scale", "ratio"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ConfigError(f"`{name}` must satisfy 0 < low <= high. Found: ({lo}, {hi}).")
        if self.scale[1] > 1:
            raise ConfigError(f"`scale` must be within (0, 1]. Found: {self.scale!r}.")
        if not 0 < self.crop_fraction <= 1:
            raise ConfigError(f"`crop_fraction` must be in (0, 1]. Found: {self.crop_fraction}.")
        if self.device is not None and not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ConfigError(
                f"`device` must be 'cpu', 'cuda' or 'cuda:N'. Found: {self.device!r}."
            )
        if self.device is not None and self.device.startswith("cuda"):
            _require_cuda(self.device)
        limit_arenas()  # before the loader's threads make arenas: see decode/heap.py
        leave_mapping()  # DALI's per-batch buffers reused from the heap: see there

    # Pickling: the description travels; decoders (DALI pipelines) are rebuilt where used.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_runtime"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        limit_arenas()  # a worker process unpickles this before it decodes
        leave_mapping()

    @property
    def columns(self) -> tuple[str, ...]:
        """The batch columns this decoder consumes (a stage without them skips decoding)."""
        return (self.image_column,)

    def output_spec(self) -> OutputSpec:
        """The resolved output: device, dtype and thread count filled in."""
        return OutputSpec(
            size=self.size,
            layout=self.layout,
            dtype=self.dtype or _LAYOUT_DTYPES[self.layout],
            mean=self.mean,
            std=self.std,
            device=self.device or _default_device(),
            threads=self.threads or cpu_count(),
        )

    def resolved_backend(self) -> str:
        """The backend that runs: "auto" becomes "dali" where DALI imports, else "pil"."""
        if self.backend == "auto":
            return "dali" if dali_available() else _fallback_notice(self.output_spec())
        if self.backend == "dali" and not dali_available():
            raise ConfigError(
                f"backend='dali' but NVIDIA DALI is not importable (or {_disable_env()} is set). "
                f"Install it: pip install {dali_package()}; or pass backend='pil'."
            )
        return self.backend

    def crop_spec(self) -> geo.CropSpec:
        """The windows and flips this pipeline draws (see ``draw_crops``)."""
        return geo.CropSpec(self.size, self.train, self.scale, self.ratio, self.crop_fraction)

    def _resolved(self) -> tuple[BatchSettings, Backend]:
        """What decoding a batch needs, built once on first use (threads that race wait
        for it: one backend, so one DALI pipeline, per process): the settings, and the
        backend with its DALI pipeline."""
        resolved = self._runtime.get("resolved")
        if resolved is not None:
            return resolved
        with _RESOLVING:
            return self._runtime.get("resolved") or self._build_resolved()

    def _build_resolved(self) -> tuple[BatchSettings, Backend]:
        from iolib.decode import make_backend
        from iolib.decode.batch import BatchSettings

        spec = self.output_spec()
        backend = make_backend(self.resolved_backend(), spec)
        settings = BatchSettings(
            self.image_column, self.max_image_pixels, self.on_error, self.crop_spec(), spec
        )
        resolved = self._runtime["resolved"] = (settings, backend)
        return resolved

    def prepare(self) -> None:
        """Resolve the backend on a background thread, once (importing DALI takes ~0.3 s):
        the loader calls this before it reads a batch, so the first batch's decoder is
        ready when its bytes arrive instead of being built after them."""
        if "resolved" in self._runtime or "preparing" in self._runtime:
            return
        thread = threading.Thread(target=self._prepare, name="iolib-decode-prepare", daemon=True)
        if self._runtime.setdefault("preparing", thread) is thread:
            thread.start()

    def _prepare(self) -> None:
        with contextlib.suppress(Exception):  # raised again, with its batch, by a decode
            self._resolved()

    def __call__(
        self, batch: dict[str, Any], indices: np.ndarray, *, seed: int, epoch: int
    ) -> tuple[dict[str, Any], list[int]]:
        """Replace the image column of a collated batch by a tensor on the device.

        Returns the new batch and the global indices of skipped samples; skipped rows are
        removed from every column, the others keep their order."""
        from iolib.decode.batch import decode_batch
        from iolib.decode.heap import trim_heap

        settings, backend = self._resolved()
        try:
            return decode_batch(settings, backend, batch, indices, seed=seed, epoch=epoch)
        finally:
            trim_heap()  # decoding's freed buffers back to the OS: see decode/heap.py

    def draw_crops(
        self, sizes: list[tuple[int, int]], indices: np.ndarray, *, seed: int, epoch: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Crop windows ``[N, 4]`` (x, y, w, h) and flips ``[N]`` for images of the given
        (width, height): window first, then flip, from each sample's own generator."""
        return self.crop_spec().draw(sizes, indices, seed=seed, epoch=epoch)


def _require_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"`{name}` must be one of {choices}. Found: {value!r}.")


def _require_cuda(device: str) -> None:
    """Refuse a CUDA device this process cannot use now, not at the first batch."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={device!r} but CUDA is not available here (torch "
            f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'}). Pass "
            "device='cpu', or leave device unset to use the GPU where there is one."
        )
    number = device.partition(":")[2]
    if number and (not number.isdigit() or int(number) >= torch.cuda.device_count()):
        raise ConfigError(
            f"device={device!r} but this process sees {torch.cuda.device_count()} CUDA "
            "device(s), numbered from 0."
        )


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _disable_env() -> str:
    from iolib.decode import DISABLE_DALI_ENV

    return f"{DISABLE_DALI_ENV}=1"


def _fallback_notice(spec: OutputSpec) -> str:
    """Log once per process that Pillow replaces DALI, and what to install on a GPU box."""
    global _notice_logged
    if not _notice_logged:
        _notice_logged = True
        hint = f"pip install {dali_package()} for DALI decoding"
        if spec.on_gpu:
            hint += " on the GPU (or pass backend='nvjpeg' if torchvision has CUDA)"
        log.warning("iolib.images: NVIDIA DALI is not available; decoding with Pillow (%s).", hint)
    return "pil"
