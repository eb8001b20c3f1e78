"""DALI backend: encoded bytes plus crop windows and flips in, tensors out.

Why ``external_source`` for everything: the windows and flips are drawn by iolib from
``sample_rng(seed, epoch, index)`` and fed as per-sample inputs, so DALI's own random
state is never used and the output is a pure function of the bytes and the draws, the
same for any worker count, batch split or resume.

The graph, per sample: ``decoders.image_slice`` decodes only the window (region-of-
interest decoding; ``device="mixed"`` on a GPU, ``"cpu"`` otherwise) -> ``resize`` to
``size x size`` (bilinear, antialiased) -> ``crop_mirror_normalize`` (flip, normalize,
layout, dtype), or ``flip`` alone for uint8 NHWC.

One pipeline per backend (so per process), built lazily (about 10 ms), run by one
loader thread at a time, and dropped when a run fails (DALI marks it invalid). Why not
one per loader thread: each pipeline brings a pool of `threads` decode threads and its
own per-run buffers, so W loader threads ran W x cores decode threads on the cores and
kept W working sets (~35 MB each at 224 px, batch 64) that the C heap holds between
batches; DALI's own reader runs one. While one thread's batch decodes, the others read
and collate theirs. On the CPU the output tensor is DALI's own buffer, handed over
without a copy (see ``_EXEC_CPU``).
"""

from __future__ import annotations

import atexit
import gc
import threading
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from iolib.base.forks import reset_after_fork
from iolib.base.shutdown import stop_all
from iolib.decode.native_threads import cpu_seconds, started_threads
from iolib.decode.probe import as_buffer
from iolib.decode.spec import OutputSpec
from iolib.storage.counters import count_helper_cpu

# One iteration at a time (prefetch_queue_depth=1): run() returns when the batch is
# done, so the encoded bytes fed without a copy (no_copy=True) stay valid, and the
# loader's prefetch depth, not a DALI queue, bounds the batches in flight.
# On the CPU, the dynamic executor (DALI >= 1.44) hands each output buffer over: torch
# views it through DLPack and keeps it alive, and DALI takes another buffer for the
# next run while that one is held (freed ones are reused). That saves a 38 MB copy per
# float32 batch of 64 at 224 px, ~15% of the decode stage on 2 cores (docs/images.md).
# On a GPU the synchronous executor and a device-side clone stay (not yet measured there).
_EXEC_CPU = {"prefetch_queue_depth": 1, "exec_dynamic": True}
_EXEC_GPU = {"prefetch_queue_depth": 1, "exec_async": False, "exec_pipelined": False}


def normalizes_after(spec: OutputSpec) -> bool:
    """Whether a float32 batch on the CPU is normalized by torch after the pipeline,
    which then outputs uint8. Why: DALI keeps each output buffer it handed over for
    reuse, so each pipeline held as many 38.5 MB float32 batches as were ever out at
    once (~230 MB for 2 workers at depth 4); uint8 buffers are a quarter, and released
    as soon as the float32 batch is made. The pixels are the same bits: DALI computes
    ``(x - mean) * (1 / std)`` in float32, as `_normalize` does (checked for all 256
    values of each channel, tests/test_decode.py)."""
    return not spec.on_gpu and spec.dtype == "float32"


def _normalize(pixels: torch.Tensor, spec: OutputSpec) -> torch.Tensor:
    """uint8 `pixels` (in the spec's layout) to float32, ``(x - 255 mean) * (1 / (255
    std))`` per channel, into a tensor torch owns."""
    shape = (3, 1, 1) if spec.layout == "NCHW" else (3,)
    mean = torch.tensor([255.0 * m for m in spec.mean], dtype=torch.float32).view(shape)
    std = torch.tensor([255.0 * s for s in spec.std], dtype=torch.float32).view(shape)
    out = torch.empty(pixels.shape, dtype=torch.float32)
    return out.copy_(pixels).sub_(mean).mul_(1.0 / std)


_exit_hook = threading.Lock()
_exit_hook_registered = False


def _release_at_exit() -> None:
    """Stop the loaders' workers and free their pipelines before DALI's own exit hook
    runs. That hook shuts down the pipelines alive at exit and asserts none is left: a
    worker thread still decoding (persistent workers read the next epoch ahead) built or
    held one meanwhile, and the AssertionError's traceback printed at exit."""
    stop_all()  # the engine's workers, registered by the engine itself
    gc.collect()  # pipelines in reference cycles go before DALI looks


def _register_exit_hook() -> None:
    """Once DALI is imported: atexit runs hooks last-registered first, so this one,
    registered after DALI's, runs before it."""
    global _exit_hook_registered
    with _exit_hook:
        if not _exit_hook_registered:
            atexit.register(_release_at_exit)
            _exit_hook_registered = True


def _build(spec: OutputSpec, batch_size: int, device_id: int | None) -> Any:
    from nvidia.dali import fn, pipeline_def, types

    _register_exit_hook()
    on_gpu = device_id is not None
    if normalizes_after(spec):
        spec = replace(spec, dtype="uint8")
    mean = [255.0 * m for m in spec.mean] if spec.normalize else [0.0, 0.0, 0.0]
    std = [255.0 * s for s in spec.std] if spec.normalize else [1.0, 1.0, 1.0]
    dtype = {"float32": types.FLOAT, "float16": types.FLOAT16, "uint8": types.UINT8}

    @pipeline_def
    def graph() -> Any:
        enc = fn.external_source(name="enc", batch=True, dtype=types.UINT8, no_copy=True)
        anchor = fn.external_source(name="anchor", batch=True, dtype=types.INT32)
        shape = fn.external_source(name="shape", batch=True, dtype=types.INT32)
        flip = fn.external_source(name="flip", batch=True, dtype=types.INT32)
        img = fn.decoders.image_slice(
            enc,
            anchor,
            shape,
            device="mixed" if on_gpu else "cpu",
            axis_names="WH",
            normalized_anchor=False,
            normalized_shape=False,
            output_type=types.RGB,
            # Geometry was drawn from the header size; EXIF rotation would change it.
            adjust_orientation=False,
            # The GPU decoder upsamples chroma like libjpeg-turbo (and Pillow) do.
            jpeg_fancy_upsampling=True,
        )
        img = fn.resize(
            img, size=[spec.size, spec.size], interp_type=types.INTERP_LINEAR, antialias=True
        )
        if not spec.normalize and spec.layout == "NHWC":
            # Nothing to normalize or transpose: a flip alone, the same bits as
            # crop_mirror_normalize's, which took ~2.5x the CPU of this step.
            return fn.flip(img, horizontal=flip)
        return fn.crop_mirror_normalize(
            img,
            mirror=flip,
            mean=mean,
            std=std,
            dtype=dtype[spec.dtype],
            output_layout="CHW" if spec.layout == "NCHW" else "HWC",
        )

    with started_threads("[DALI]") as pool:
        pipe = graph(
            batch_size=batch_size,
            num_threads=spec.threads,
            device_id=device_id,
            seed=0,
            **(_EXEC_GPU if on_gpu else _EXEC_CPU),
        )
        pipe.build()
    return pipe, pool


_FORKED_AWAY: list[Any] = []  # pipelines a forked process inherited (see _after_fork)


class DaliBackend:
    """One DALI pipeline, run by one calling thread at a time, rebuilt for a larger batch
    or after an error."""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()  # held for a run: a pipeline is not thread-safe
        self._pipe: Any = None
        self._threads: Any = None
        self._capacity = 0
        self._device_id: int | None = None
        if spec.on_gpu:
            device = torch.device(spec.device)
            index = device.index
            self._device_id = index if index is not None else torch.cuda.current_device()
        reset_after_fork(self)

    def _after_fork(self) -> None:
        """A forked worker has none of its parent's threads: not the one that held the lock
        for a run at the fork (the lock would stay held), nor the pipeline's decode pool.
        The pipeline is built anew; the parent's is kept, never run nor destroyed here
        (its destructor would wait for threads this process does not have)."""
        self._lock = threading.Lock()
        if self._pipe is not None:
            _FORKED_AWAY.append(self._pipe)
        self._pipe, self._threads, self._capacity = None, None, 0

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"])  # type: ignore[misc]

    def _pipeline(self, n: int) -> Any:
        """The pipeline, built for at least `n` samples; the caller holds the lock."""
        if self._pipe is None or self._capacity < n:
            self._pipe = None  # the old one goes before the new one is built
            self._pipe, self._threads = _build(self.spec, n, self._device_id)
            self._capacity = n
        return self._pipe

    def decode(self, blobs: list[Any], windows: np.ndarray, flips: np.ndarray) -> torch.Tensor:
        """Run one batch through the pipeline (one caller at a time); drop the pipeline
        on failure. Images DALI decodes otherwise than Pillow, or not at all, go to Pillow."""
        windows = np.asarray(windows, dtype=np.int32).reshape(-1, 4)
        foreign = [i for i, blob in enumerate(blobs) if pillow_only(as_buffer(blob))]
        if foreign:
            return self._decode_mixed(blobs, windows, flips, foreign)
        # Per-sample arguments go in as one dense array each (a batch of N samples):
        # three numpy arrays per batch instead of 3 x N small ones.
        inputs = {
            "enc": [np.frombuffer(as_buffer(b), dtype=np.uint8) for b in blobs],
            "anchor": np.ascontiguousarray(windows[:, :2]),
            "shape": np.ascontiguousarray(windows[:, 2:]),
            "flip": np.asarray(flips, dtype=np.int32).reshape(-1),
        }
        with self._lock:
            pipe = self._pipeline(len(blobs))
            pool = self._threads.ids  # read once: names are read from /proc
            pool_cpu = cpu_seconds(pool)
            try:
                (out,) = pipe.run(**inputs)
                pixels = self._to_torch(out)
            except Exception:
                self._pipe = None  # DALI marks a pipeline invalid after an error
                raise
            finally:
                # DALI decodes on its own thread pool, for this batch alone while the
                # lock is held: count that CPU as this batch's.
                count_helper_cpu(cpu_seconds(pool) - pool_cpu)
        # A uint8 batch becomes float32 outside the lock, beside the next one's decode.
        return _normalize(pixels, self.spec) if normalizes_after(self.spec) else pixels

    def _decode_mixed(
        self, blobs: list[Any], windows: np.ndarray, flips: np.ndarray, foreign: list[int]
    ) -> torch.Tensor:
        from iolib.decode.pil import PilBackend

        flips = np.asarray(flips).reshape(-1)
        native = [i for i in range(len(blobs)) if i not in set(foreign)]
        by_pillow = PilBackend(self.spec).decode(
            [blobs[i] for i in foreign], windows[foreign], flips[foreign]
        )
        if not native:
            return by_pillow
        by_dali = self.decode([blobs[i] for i in native], windows[native], flips[native])
        out = torch.empty(
            (len(blobs), *by_dali.shape[1:]), dtype=by_dali.dtype, device=by_dali.device
        )
        out[native], out[foreign] = by_dali, by_pillow.to(by_dali.device)
        return out

    def _to_torch(self, out: Any) -> torch.Tensor:
        if not self.spec.on_gpu:
            # Zero copy: the tensor owns DALI's output buffer (see _EXEC_CPU); a uint8
            # one goes back to DALI once torch has made the float32 batch from it.
            return torch.from_dlpack(out.as_tensor())
        # DLPack hands torch a view of DALI's output buffer (no host copy). DALI reuses
        # that buffer on its next run, so clone on the GPU and wait for the
        # clone before returning: the batch may sit in the loader's queue for a while.
        with torch.cuda.device(self._device_id):
            view = torch.from_dlpack(out.as_tensor())
            result = view.clone()
            torch.cuda.current_stream().synchronize()
        return result


def pillow_only(buffer: memoryview) -> bool:
    """Images the DALI backend hands to Pillow: GIFs (DALI's decoders refuse them) and
    16-bit PNGs (DALI rounds v / 257 where Pillow's 16-bit RGB truncates v / 256), so
    both backends give the same pixels for every format either can read."""
    head = bytes(buffer[:26])
    if head.startswith((b"GIF87a", b"GIF89a")):
        return True
    return head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR" and head[24] == 16
