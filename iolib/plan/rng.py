"""Counter-based randomness: (seed, epoch, sample index) -> numpy Generator.

Why counter-based: a sample's random draws must not depend on which worker handles
it, in what order, or how many samples that worker saw before. Keying a Philox
generator by the sample's identity makes its stream a pure function of
(seed, epoch, index), so batches are the same for any worker count or prefetch depth,
and after a resume.

Example::

    >>> from iolib.plan.rng import sample_rng
    >>> a = sample_rng(seed=7, epoch=0, index=42).random()
    >>> b = sample_rng(seed=7, epoch=0, index=42).random()
    >>> a == b
    True

A transform receives such a generator: ``transform(sample, rng)``. Never use the
global ``random``, ``numpy.random`` or ``torch`` state in a transform run by thread
workers: those are shared and their draws depend on timing.
"""

from __future__ import annotations

import numpy as np

# Stream tags keep the epoch order and the per-sample streams independent even when
# an index happens to equal an epoch number.
_ORDER_STREAM = 0x4F52444552  # "ORDER"
_SAMPLE_STREAM = 0x53414D504C  # "SAMPL"


def _check(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative integer. Found: {value!r}.")
    return int(value)


def _generator(*words: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(list(words))))


def order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator that draws epoch `epoch`'s sample order (same on every rank)."""
    return _generator(_ORDER_STREAM, _check("seed", seed), _check("epoch", epoch))


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator for one sample's augmentations: a pure function of its identity."""
    return _generator(
        _SAMPLE_STREAM, _check("seed", seed), _check("epoch", epoch), _check("index", index)
    )


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit integer seed for one sample, for libraries that want an int
    (torch.manual_seed, random.seed, DALI inputs)."""
    return int(sample_rng(seed, epoch, index).integers(0, 2**63 - 1))
