"""iolib.decode.resize against its definition: Pillow's bilinear resize of a window with
DALI's edge rule (tests.image_samples.pillow_window_resize), on real arrays."""

from __future__ import annotations

import numpy as np
import pytest

from iolib.decode.resize import filter_taps, resize_window
from tests.image_samples import make_image, pillow_window_resize


def _windows(rng: np.random.Generator, width: int, height: int, count: int):
    yield 0, 0, width, height  # the whole image
    yield 0, 0, 1, 1  # one pixel
    yield width - 1, 0, 1, height  # one column
    for _ in range(count):
        w, h = int(rng.integers(1, width + 1)), int(rng.integers(1, height + 1))
        yield int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h


@pytest.mark.parametrize("size", [1, 7, 48, 224])
def test_matches_pillow_with_clamped_edges(size):
    rng = np.random.default_rng(size)
    worst, means = 0, []
    for i in range(12):
        rgb = make_image(i)
        for x, y, w, h in _windows(rng, rgb.shape[1], rgb.shape[0], 6):
            want = pillow_window_resize(rgb, (x, y, w, h), size).astype(int)
            out = np.empty((3, size, size), np.uint8)
            got = resize_window(rgb[y : y + h, x : x + w], out).transpose(1, 2, 0).astype(int)
            diff = np.abs(want - got)
            worst, means = max(worst, int(diff.max())), [*means, float(diff.mean())]
    assert worst <= 1  # rounding only; borders included (a truncating kernel: up to 16)
    assert float(np.mean(means)) <= 0.1


def test_noise_upscale_differs_by_rounding_only():
    # Pure noise upscaled ~3x is the hardest case for two 8-bit passes: measured, 4 values
    # in a million differ by 2 (torch's vertical pass rounds its weights differently).
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (80, 80, 3), dtype=np.uint8)
    want = pillow_window_resize(rgb, (0, 0, 80, 80), 224).astype(int)
    got = resize_window(rgb, np.empty((3, 224, 224), np.uint8)).transpose(1, 2, 0).astype(int)
    diff = np.abs(want - got)
    assert int(diff.max()) <= 2 and float((diff > 1).mean()) < 1e-4


def test_edges_are_not_the_truncating_kernels():
    # A bright border: clamping replicates it into the edge outputs, truncation would
    # renormalize over fewer taps. The fix-up must make the first column Pillow+pad's.
    rgb = np.zeros((64, 64, 3), np.uint8)
    rgb[:, 0] = 255
    out = resize_window(rgb, np.empty((3, 20, 20), np.uint8))
    want = pillow_window_resize(rgb, (0, 0, 64, 64), 20)
    assert np.abs(out.transpose(1, 2, 0)[:, 0].astype(int) - want[:, 0].astype(int)).max() <= 1


def test_filter_rows_sum_to_one_and_edges_are_marked():
    for size_in, size_out in [(256, 224), (30, 224), (500, 7), (1, 5)]:
        taps = filter_taps(size_in, size_out)
        assert taps.index.shape == taps.weight.shape and len(taps.index) == size_out
        assert taps.index.min() >= 0 and taps.index.max() < size_in  # clamped
        np.testing.assert_allclose(taps.weight.sum(axis=1), 1.0, rtol=1e-5)
        assert 0 in taps.edge and size_out - 1 in taps.edge  # both ends reach past an edge
        assert len(taps.edge) < size_out or size_in == 1
