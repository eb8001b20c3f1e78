"""GPU decoding: DALI ``device="mixed"`` and torchvision nvJPEG, on a CUDA machine only.

Skipped as a whole without CUDA. The tolerances against the CPU path are first
guesses (nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's); the GPU check
(benchmarks/gpu_check.py) measures and prints the real differences.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from iolib.decode.images import ImagePipeline
from tests.image_samples import bad_blob, encode, make_batch, make_image

pytestmark = pytest.mark.gpu
SIZE = 64
N = 32
GPU_MEAN_DIFF = 2.0  # uint8 levels, GPU decode vs the CPU path (not yet measured)


@pytest.fixture(scope="module")
def blobs() -> list[bytes]:
    return [encode(make_image(i), "PNG" if i % 8 == 5 else "JPEG") for i in range(N)]


def _pipe(backend: str, device: str = "cuda", **kw) -> ImagePipeline:
    return ImagePipeline(size=SIZE, backend=backend, device=device, threads=2, **kw)


def _run(pipe, blobs, seed=0):
    return pipe(make_batch(blobs), np.arange(len(blobs)), seed=seed, epoch=0)[0]["image"]


def test_dali_mixed_output_on_gpu_close_to_cpu(blobs):
    pytest.importorskip("nvidia.dali")
    gpu = _run(_pipe("dali", layout="NHWC"), blobs)
    cpu = _run(_pipe("dali", device="cpu", layout="NHWC"), blobs)
    assert gpu.is_cuda and gpu.shape == (N, SIZE, SIZE, 3) and gpu.dtype == torch.uint8
    diff = (gpu.cpu().int() - cpu.int()).abs().float()
    print(f"DALI mixed vs cpu: max {diff.max():.0f} mean {diff.mean():.3f}")
    assert float(diff.mean()) <= GPU_MEAN_DIFF


def test_dali_mixed_deterministic_across_calls_and_splits(blobs):
    pytest.importorskip("nvidia.dali")
    pipe = _pipe("dali")
    whole = _run(pipe, blobs, seed=3)
    assert torch.equal(whole, _run(_pipe("dali"), blobs, seed=3))
    idx = np.arange(N)
    parts = [
        pipe(make_batch(blobs[lo:hi]), idx[lo:hi], seed=3, epoch=0)[0]["image"]
        for lo, hi in ((0, 5), (5, 20), (20, N))
    ]
    assert torch.equal(torch.cat(parts), whole)


def test_dali_mixed_skips_bad_input(blobs):
    pytest.importorskip("nvidia.dali")
    images = list(blobs[:6])
    images[1] = bad_blob("corrupt", blobs[1])
    images[3] = bad_blob("truncated", blobs[3])
    out, skipped = _pipe("dali", on_error="skip")(make_batch(images), np.arange(6), seed=0, epoch=0)
    assert skipped == [1, 3] and out["label"].tolist() == [0, 2, 4, 5]
    assert out["image"].shape[0] == 4 and out["image"].is_cuda


def test_nvjpeg_backend_matches_pillow_and_is_deterministic(blobs):
    pytest.importorskip("torchvision")
    nv = _run(_pipe("nvjpeg", layout="NHWC"), blobs)
    assert nv.is_cuda and nv.shape == (N, SIZE, SIZE, 3)
    assert torch.equal(nv, _run(_pipe("nvjpeg", layout="NHWC"), blobs))
    pil = _run(_pipe("pil", device="cpu", layout="NHWC"), blobs)
    diff = (nv.cpu().int() - pil.int()).abs().float()
    print(f"nvJPEG vs Pillow: max {diff.max():.0f} mean {diff.mean():.3f}")
    assert float(diff.mean()) <= GPU_MEAN_DIFF


def test_pillow_backend_delivers_on_gpu(blobs):
    out = _run(_pipe("pil"), blobs[:4])
    assert out.is_cuda and out.dtype == torch.float32 and out.shape == (4, 3, SIZE, SIZE)
