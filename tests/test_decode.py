"""ImagePipeline: geometry, DALI-CPU vs Pillow, determinism, fallback, bad input.

Real DALI pipelines (CPU) on real JPEG/PNG bytes made here with Pillow; no mocks.
"""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from iolib.decode import geometry as geo
from iolib.decode.images import ImagePipeline
from iolib.errors import ConfigError, DataError
from tests.image_samples import bad_blob, encode, make_batch, make_image

dali = pytest.importorskip("nvidia.dali", reason="DALI is not installed")

N = 64
SIZE = 48
# DALI-CPU vs Pillow on the same windows, measured (6 seeds x 64 images here, and
# sizes 17/64/224 on 96x128 and 500x375 JPEGs): decoding is bit-identical (both use
# libjpeg-turbo; DALI's region-of-interest decode equals a full decode then crop); the
# bilinear antialiased resizes differ by rounding only: max 1 level, mean 0.08-0.20.
# (Without the edge padding in pil.py, window borders differed by up to 16 levels.)
UINT8_MAX_DIFF = 1
UINT8_MEAN_DIFF = 0.25


@pytest.fixture(scope="module")
def blobs() -> list[bytes]:
    out = []
    for i in range(N):
        fmt = "PNG" if i % 8 == 5 else "JPEG"
        out.append(encode(make_image(i), fmt, mode="L" if i % 16 == 3 else None))
    return out


def _run(pipe: ImagePipeline, blobs: list[bytes], indices, seed=0, epoch=0):
    return pipe(make_batch(blobs), np.asarray(indices, dtype=np.int64), seed=seed, epoch=epoch)


def _dali(**kw) -> ImagePipeline:
    return ImagePipeline(size=SIZE, backend="dali", threads=1, device="cpu", **kw)


def _pil(**kw) -> ImagePipeline:
    return ImagePipeline(size=SIZE, backend="pil", device="cpu", **kw)


# --- geometry --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4000), st.integers(1, 4000), st.integers(0, 2**32), st.floats(0.01, 1.0))
def test_random_window_inside_image(width, height, seed, low):
    rng = np.random.default_rng(seed)
    x, y, w, h = geo.random_resized_crop(rng, width, height, scale=(low, 1.0))
    assert x >= 0 and y >= 0 and w >= 1 and h >= 1
    assert x + w <= width and y + h <= height


def test_random_window_falls_back_to_ratio_clamped_center():
    # A 1000x10 strip cannot hold a 3/4..4/3 window of >= 90% of its area: center crop.
    rng = np.random.default_rng(0)
    assert geo.random_resized_crop(rng, 1000, 10, scale=(0.9, 1.0)) == (493, 0, 13, 10)


def test_center_crop_matches_resize_then_crop():
    # Resize shorter side 96 -> 256, center crop 224: keeps 96 * 224 / 256 = 84 pixels.
    assert geo.center_crop(128, 96, 224) == geo.Window(22, 6, 84, 84)
    assert geo.center_crop(1, 1, 224) == geo.Window(0, 0, 1, 1)


def test_crops_draw_window_then_flip_from_sample_rng():
    from iolib.plan.rng import sample_rng

    pipe = _pil()
    windows, flips = pipe.draw_crops([(128, 96)] * 3, np.array([5, 6, 7]), seed=3, epoch=1)
    for row, index in enumerate([5, 6, 7]):
        rng = sample_rng(3, 1, index)
        assert tuple(windows[row]) == geo.random_resized_crop(rng, 128, 96)
        assert flips[row] == geo.draw_flip(rng)
    # Flips are drawn per sample: over 64 samples both ways occur (a constant fails).
    _, many = pipe.draw_crops([(128, 96)] * 64, np.arange(64), seed=3, epoch=1)
    assert many.dtype == bool and 0 < int(many.sum()) < 64, many


def test_jpeg_header_fast_path_agrees_with_pillow(blobs):
    from iolib.decode.probe import probe

    progressive = io.BytesIO()
    Image.fromarray(make_image(3)).save(progressive, "JPEG", progressive=True)
    for blob in [*blobs, progressive.getvalue()]:
        with Image.open(io.BytesIO(blob)) as img:
            expected = (img.format, *img.size)
        assert tuple(probe(blob, 10**9)) == expected


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"\xff", b"\xd9", b"\xda", b"\x00", b"\xff\xd9", b"\xff\xda"])))
def test_truncation_check_is_no_scan_after_the_last_eoi(parts):
    """The fast check gives the verdict of its definition: the last SOS lies after the
    last EOI (both found by a full backward scan)."""
    from iolib.decode.probe import BadImage, _check_complete

    data = b"".join(parts)
    truncated = data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda")
    try:
        _check_complete(data, "JPEG")
        flagged = False
    except BadImage:
        flagged = True
    assert flagged == truncated


# --- configuration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 0}, "`size` must be a positive integer. Found: 0."),
        ({"layout": "CHW"}, "`layout` must be one of ('NCHW', 'NHWC'). Found: 'CHW'."),
        ({"backend": "opencv"}, "`backend` must be one of"),
        ({"on_error": "ignore"}, "`on_error` must be one of ('raise', 'skip')"),
        ({"mean": (0.5, 0.5)}, "`mean` must be 3 numbers"),
        ({"std": (0.2, 0.0, 0.2)}, "`std` must be positive"),
        ({"scale": (0.5, 0.1)}, "`scale` must satisfy 0 < low <= high"),
        ({"device": "tpu"}, "`device` must be 'cpu', 'cuda' or 'cuda:N'"),
        ({"dtype": "int8"}, "`dtype` must be one of"),
    ],
)
def test_config_errors_name_value_and_rule(kwargs, message):
    with pytest.raises(ConfigError) as info:
        ImagePipeline(**kwargs)
    assert message in str(info.value)


def test_pipeline_is_picklable_after_use(blobs):
    pipe = _dali()
    first, _ = _run(pipe, blobs[:8], range(8))
    clone = pickle.loads(pickle.dumps(pipe))
    assert clone == pipe and clone.columns == ("image",)
    again, _ = _run(clone, blobs[:8], range(8))
    assert torch.equal(first["image"], again["image"])


# --- DALI-CPU vs Pillow ----------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False])
def test_dali_matches_pillow_within_tolerance(blobs, train):
    idx = np.arange(100, 100 + N)
    a, _ = _run(_dali(train=train, layout="NHWC"), blobs, idx, seed=7)
    b, _ = _run(_pil(train=train, layout="NHWC"), blobs, idx, seed=7)
    assert a["image"].shape == b["image"].shape == (N, SIZE, SIZE, 3)
    assert a["image"].dtype == b["image"].dtype == torch.uint8
    diff = (a["image"].int() - b["image"].int()).abs()
    assert int(diff.max()) <= UINT8_MAX_DIFF
    assert float(diff.float().mean()) <= UINT8_MEAN_DIFF


def test_dali_matches_pillow_normalized_nchw(blobs):
    idx = np.arange(N)
    a, _ = _run(_dali(), blobs, idx, seed=1)
    b, _ = _run(_pil(), blobs, idx, seed=1)
    assert a["image"].shape == b["image"].shape == (N, 3, SIZE, SIZE)
    assert a["image"].dtype == torch.float32
    # A uint8 step is 1 / (255 * std) after normalization; std >= 0.224.
    step = 1.0 / (255 * 0.224)
    diff = (a["image"] - b["image"]).abs()
    assert float(diff.max()) <= UINT8_MAX_DIFF * step + 1e-4
    assert float(diff.mean()) <= UINT8_MEAN_DIFF * step


def test_flip_mirrors_the_same_window(blobs):
    # The flipped output of a sample equals the unflipped one mirrored, on both backends.
    from iolib.decode.dali import DaliBackend
    from iolib.decode.pil import PilBackend

    spec = _dali(layout="NHWC").output_spec()
    windows = np.array([[10, 5, 60, 50]] * 2, dtype=np.int32)
    flips = np.array([False, True])
    for backend in (DaliBackend(spec), PilBackend(spec)):
        out = backend.decode([blobs[1], blobs[1]], windows, flips)
        assert torch.equal(out[0].flip(1), out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU clocks")
def test_dali_pool_cpu_is_charged_to_the_calling_thread(blobs):
    # DALI decodes on its own threads: the tuner must see that CPU, or it reads the
    # decode as storage waiting and adds workers that only fight over the cores.
    import time

    from iolib.storage import helper_cpu_s

    pipe = ImagePipeline(size=224, backend="dali", threads=2, device="cpu")
    rng = np.random.default_rng(0)
    big = [encode(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8), "JPEG") for _ in range(16)]
    _run(pipe, big, np.arange(16))  # builds the pipeline
    helper, own, process = helper_cpu_s(), time.thread_time(), time.process_time()
    for _ in range(3):
        _run(pipe, big, np.arange(16))
    charged = helper_cpu_s() - helper
    used = time.process_time() - process
    assert charged > 0.3 * (used - (time.thread_time() - own))
    assert charged <= used + 0.01


# --- determinism (DALI-CPU, bit for bit) -----------------------------------------------


def test_dali_deterministic_across_calls_instances_and_splits(blobs):
    idx = np.arange(1000, 1000 + N)
    whole, _ = _run(_dali(), blobs, idx, seed=5, epoch=2)
    again, _ = _run(_dali(), blobs, idx, seed=5, epoch=2)
    assert torch.equal(whole["image"], again["image"])
    pipe = _dali()
    for cuts in ([16, 32, 48], [7, 32, 33], [1, 2, 63]):
        parts = []
        for lo, hi in zip([0, *cuts], [*cuts, N], strict=True):
            out, _ = _run(pipe, blobs[lo:hi], idx[lo:hi], seed=5, epoch=2)
            parts.append(out["image"])
        assert torch.equal(torch.cat(parts), whole["image"]), cuts


def test_dali_deterministic_across_threads(blobs):
    idx = np.arange(N)
    pipe = _dali()
    serial, _ = _run(pipe, blobs, idx, seed=9)
    chunks = [(lo, lo + 16) for lo in range(0, N, 16)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(lambda c: _run(pipe, blobs[c[0] : c[1]], idx[c[0] : c[1]], 9), chunks))
    assert torch.equal(torch.cat([o["image"] for o, _ in outs]), serial["image"])


def test_dali_uint8_nhwc_flip_gives_crop_mirror_normalizes_bits(blobs):
    """uint8 NHWC is flipped by fn.flip; NCHW still goes through crop_mirror_normalize
    (a transpose): the same pixels, bit for bit, flipped or not."""
    idx = np.arange(100, 100 + N)
    nhwc, _ = _run(_dali(layout="NHWC", dtype="uint8"), blobs, idx, seed=3)
    nchw, _ = _run(_dali(layout="NCHW", dtype="uint8"), blobs, idx, seed=3)
    assert torch.equal(nhwc["image"], nchw["image"].permute(0, 2, 3, 1))


def test_dali_threads_share_one_pipeline_and_its_decode_threads(blobs):
    """Loader threads take turns on one pipeline: one pool of `threads` decode threads
    per process, not one per loader thread (each kept its own working set)."""
    import os

    def dali_threads() -> int:
        names = []
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read())
        return sum(name.startswith("[DALI][TP") for name in names)

    idx = np.arange(N)
    pipe = ImagePipeline(size=SIZE, backend="dali", threads=2, device="cpu")
    before = dali_threads()
    chunks = [(lo, lo + 8) for lo in range(0, N, 8)]

    def run(chunk: tuple[int, int]) -> int:
        _run(pipe, blobs[chunk[0] : chunk[1]], idx[chunk[0] : chunk[1]])
        return dali_threads()  # while every loader thread, and what it holds, is alive

    with ThreadPoolExecutor(max_workers=4) as pool:
        seen = max(pool.map(run, chunks))
    if sys.platform.startswith("linux"):
        assert seen - before == 2


def test_dali_cpu_batches_outlive_later_runs_and_their_pipeline(blobs):
    """CPU outputs are DALI's buffers handed over without a copy: a batch still held
    must not change when the pipeline runs again, is rebuilt (larger batch) or is gone."""
    idx = np.arange(N)
    expected = [_run(_dali(), blobs[lo : lo + 8], idx[lo : lo + 8])[0]["image"] for lo in (0, 8)]
    pipe = _dali()
    held = [_run(pipe, blobs[lo : lo + 8], idx[lo : lo + 8])[0]["image"] for lo in (0, 8)]
    for lo in range(16, N, 8):  # later runs of the same pipeline
        _run(pipe, blobs[lo : lo + 8], idx[lo : lo + 8])
    _run(pipe, blobs, idx)  # a larger batch: this thread's pipeline is rebuilt
    del pipe  # and the backend holding the pipelines dropped with it
    import gc

    gc.collect()
    _run(_dali(), blobs, idx + 1)  # new allocations that could reuse freed memory
    for got, want in zip(held, expected, strict=True):
        assert torch.equal(got, want)


def test_augmentation_depends_on_seed_and_epoch_only(blobs):
    idx = np.arange(16)
    base, _ = _run(_dali(), blobs[:16], idx, seed=0, epoch=0)
    assert not torch.equal(
        base["image"], _run(_dali(), blobs[:16], idx, seed=0, epoch=1)[0]["image"]
    )
    assert not torch.equal(
        base["image"], _run(_dali(), blobs[:16], idx, seed=1, epoch=0)[0]["image"]
    )
    evals = [_run(_dali(train=False), blobs[:16], idx, seed=s)[0]["image"] for s in (0, 1)]
    assert torch.equal(evals[0], evals[1])


# --- fallback --------------------------------------------------------------------------


def test_fallback_to_pillow_when_dali_disabled(blobs, monkeypatch, caplog):
    import iolib.decode.images as images

    monkeypatch.setenv("IOLIB_DISABLE_DALI", "1")
    monkeypatch.setattr(images, "_notice_logged", False)
    with caplog.at_level(logging.WARNING, logger="iolib.images"):
        first = ImagePipeline(size=SIZE, device="cpu")
        assert first.resolved_backend() == "pil"
        assert ImagePipeline(size=SIZE, device="cpu").resolved_backend() == "pil"
        out, _ = _run(first, blobs[:4], range(4))
    notices = [r for r in caplog.records if "DALI is not available" in r.getMessage()]
    assert len(notices) == 1 and "nvidia-dali-cuda1" in notices[0].getMessage()
    assert torch.equal(out["image"], _run(_pil(), blobs[:4], range(4))[0]["image"])
    with pytest.raises(ConfigError, match=r"pip install nvidia-dali-cuda1[23]0"):
        ImagePipeline(backend="dali").resolved_backend()


def test_auto_prefers_dali_when_installed(monkeypatch):
    monkeypatch.delenv("IOLIB_DISABLE_DALI", raising=False)
    assert ImagePipeline().resolved_backend() == "dali"


# --- bad input -------------------------------------------------------------------------

LIMIT = 200 * 200  # max_image_pixels in these tests; the good images have 12,288


BAD_KINDS = ["truncated", "not-an-image", "zero-bytes", "too-large", "corrupt"]
REASONS = {
    "truncated": "truncated",
    "not-an-image": "not a recognized image format",
    "zero-bytes": "empty (zero bytes)",
    "too-large": "over max_image_pixels=40000",
    "corrupt": "the decoder failed",
}


@pytest.mark.parametrize("backend", ["dali", "pil"])
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_input_raises_naming_the_sample(blobs, backend, kind):
    pipe = ImagePipeline(
        size=SIZE, backend=backend, device="cpu", threads=1, max_image_pixels=LIMIT
    )
    images = list(blobs[:6])
    images[4] = bad_blob(kind, blobs[4])
    with pytest.raises(DataError) as info:
        _run(pipe, images, np.arange(500, 506))
    text = str(info.value)
    assert "sample 504 (path='img/4.jpg')" in text and REASONS[kind] in text
    assert "on_error='skip'" in text
    assert info.value.samples == [504]


@pytest.mark.parametrize("backend", ["dali", "pil"])
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_input_skipped_from_every_column(blobs, backend, kind):
    kw = {"size": SIZE, "backend": backend, "device": "cpu", "threads": 1}
    pipe = ImagePipeline(on_error="skip", max_image_pixels=LIMIT, **kw)
    images = list(blobs[:8])
    images[2] = bad_blob(kind, blobs[2])
    images[5] = bad_blob("zero-bytes", blobs[5])
    idx = np.arange(300, 308)
    out, skipped = pipe(make_batch(images), idx, seed=4, epoch=0)
    assert skipped == [302, 305]
    keep = [0, 1, 3, 4, 6, 7]
    assert out["label"].tolist() == keep
    assert out["path"] == [f"img/{i}.jpg" for i in keep]
    assert out["weight"].tolist() == keep
    # The survivors are exactly what a clean batch of them gives: same order, same draws.
    clean, none = pipe(make_batch([blobs[i] for i in keep]), idx[keep], seed=4, epoch=0)
    assert none == [] and torch.equal(out["image"], clean["image"])


def test_all_samples_skipped_gives_empty_tensor():
    pipe = _dali(on_error="skip", layout="NHWC")
    out, skipped = pipe(make_batch([b"", b"junk"]), np.array([3, 9]), seed=0, epoch=0)
    assert skipped == [3, 9]
    assert out["image"].shape == (0, SIZE, SIZE, 3) and out["label"].numel() == 0


def test_missing_image_column_is_a_config_error(blobs):
    with pytest.raises(ConfigError, match="image_column"):
        _dali(image_column="jpeg")(make_batch(blobs[:2]), np.arange(2), seed=0, epoch=0)


def test_uint8_and_float16_outputs(blobs):
    out, _ = _run(_dali(layout="NHWC"), blobs[:4], range(4))
    assert out["image"].dtype == torch.uint8 and out["image"].shape == (4, SIZE, SIZE, 3)
    out, _ = _run(_dali(dtype="float16"), blobs[:4], range(4))
    assert out["image"].dtype == torch.float16 and out["image"].shape == (4, 3, SIZE, SIZE)


# --- formats Pillow and DALI read differently ------------------------------------------


def _png16(values: np.ndarray) -> bytes:
    """A 16-bit PNG (grey if `values` is 2-D, else RGB), written by hand: Pillow cannot
    write 16-bit RGB."""
    import struct
    import zlib

    height, width = values.shape[:2]
    color = 0 if values.ndim == 2 else 2
    rows = values.reshape(height, -1).astype(">u2")
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 16, color, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _odd_formats() -> dict[str, bytes]:
    rng = np.random.default_rng(4)
    out = {
        "png16-grey": _png16(rng.integers(0, 65536, (40, 52))),
        "png16-rgb": _png16(rng.integers(0, 65536, (40, 52, 3))),
    }
    for name, mode, fmt in (("cmyk-jpeg", "CMYK", "JPEG"), ("gif", "P", "GIF")):
        pixels = rng.integers(0, 255, (40, 52, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).convert(mode)
        buffer = io.BytesIO()
        image.save(buffer, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        out[name] = buffer.getvalue()
    return out


@pytest.mark.parametrize("kind", ["png16-grey", "png16-rgb", "cmyk-jpeg", "gif"])
def test_backends_agree_on_16_bit_cmyk_and_gif(kind):
    blob = _odd_formats()[kind]
    batches = [
        _run(make(train=False, layout="NHWC"), [blob] * 2, [0, 1])[0]["image"]
        for make in (_dali, _pil)
    ]
    assert batches[0].shape == batches[1].shape == (2, SIZE, SIZE, 3)
    diff = (batches[0].int() - batches[1].int()).abs()
    assert int(diff.max()) <= UINT8_MAX_DIFF, f"{kind}: backends differ by {int(diff.max())}"
    assert 60 < float(batches[1].float().mean()) < 195, "16-bit values must not saturate"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_torch_normalizes_dali_pixels_to_dalis_own_bits(layout):
    """float32 batches on the CPU are normalized by torch after a uint8 pipeline (see
    iolib.decode.dali.normalizes_after): every uint8 value of every channel must give
    the bits DALI's crop_mirror_normalize gives, so the change is invisible."""
    from nvidia.dali import fn, pipeline_def, types

    from iolib.decode.dali import _normalize

    spec = _dali(layout=layout).output_spec()
    values = np.arange(256, dtype=np.uint8)
    image = np.stack([values, values[::-1], np.roll(values, 7)], axis=-1)[None]  # [1,256,3]

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def graph():
        x = fn.external_source(source=lambda: [image], batch=True, layout="HWC")
        return fn.crop_mirror_normalize(
            x, mean=[255.0 * m for m in spec.mean], std=[255.0 * s for s in spec.std],
            dtype=types.FLOAT, output_layout="CHW" if layout == "NCHW" else "HWC",
        )  # fmt: skip

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    want = torch.from_numpy(np.array(out.as_tensor()))  # [1, ...]: a batch of one
    pixels = torch.from_numpy(image)[None]  # [N, H, W, C]
    pixels = pixels.permute(0, 3, 1, 2) if layout == "NCHW" else pixels
    got = _normalize(pixels, spec)
    assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_dali_cpu_float_batches_are_owned_by_torch(blobs):
    """A float32 batch no longer lives in DALI's reused output buffers (each pipeline
    kept as many as were ever out at once): dropping it frees it."""
    import weakref

    out, _ = _run(_dali(), blobs, np.arange(N))
    image = out["image"]
    assert image.dtype == torch.float32 and image.is_contiguous()
    assert image.untyped_storage().nbytes() == image.numel() * 4  # its own, not a view
    ref = weakref.ref(image)
    del out, image
    assert ref() is None


def test_a_forked_worker_decodes_while_a_parent_thread_holds_the_pipeline(blobs):
    """A worker forked while a parent thread ran the process's one DALI pipeline (its
    lock held) and another built a backend (`_RESOLVING` held) decodes with a pipeline
    of its own, the same pixels: it never waits for a thread it does not have."""
    import multiprocessing as mp

    from iolib.decode import images

    idx = np.arange(8)
    resolved = _dali(layout="NHWC")
    parent, _ = _run(resolved, blobs[:8], idx)  # the parent's pipeline is built
    backend = resolved._resolved()[1]
    fork = mp.get_context("fork")
    results = fork.Queue()

    def child() -> None:
        for pipe in (resolved, _dali(layout="NHWC")):  # inherited, then built here
            out, _ = _run(pipe, blobs[:8], idx)
            results.put(out["image"].numpy().tobytes())

    with backend._lock, images._RESOLVING:  # as a parent thread holds them at the fork
        proc = fork.Process(target=child, daemon=True)
        proc.start()
    try:
        got = [results.get(timeout=60) for _ in range(2)]
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join(10)
    assert got == [parent["image"].numpy().tobytes()] * 2
