"""A keyed bijection on [0, n): sample k of a shuffled epoch, computed, not looked up.

Why: a stored permutation costs 8 bytes a sample (8 GB at 10^9 samples) and seconds to
draw before the first batch. A Feistel network over the smallest power of four >= n,
with "cycle walking" (apply it again while the result is >= n), is a bijection on
[0, n) whose every value costs a few vectorised integer operations, so a plan holds a
key, not an array (grain's `index_shuffle` and Mosaic streaming's shuffles make the
same trade).

Each element may carry its own domain size and key: a block shuffle permutes samples
within windows of different sizes in one vectorised call.

Worked example (pinned in tests): ``feistel(np.arange(5), 5, key)`` is a permutation
of 0..4; the same key gives the same permutation on every machine and numpy version
(only integer arithmetic).
"""

from __future__ import annotations

import numpy as np

ROUNDS = 6  # 4 make a pseudo-random permutation (Luby-Rackoff); 2 more mix small domains
_M1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's multipliers: a well-tested mixer
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit moves every output bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def round_keys(*words: int) -> np.ndarray:
    """ROUNDS 64-bit round keys from integer words (seed, epoch, stream...)."""
    seq = np.random.SeedSequence([int(w) for w in words])
    return seq.generate_state(ROUNDS, dtype=np.uint64)


def _half_bits(n: np.ndarray) -> np.ndarray:
    """Bits of each half: the smallest h with 4**h >= n (at least 1)."""
    bits = np.ceil(np.log2(np.maximum(n, 2).astype(np.float64))).astype(np.uint64)
    # log2 of large integers in float64 can be off by one: correct both ways.
    bits = np.where((np.uint64(1) << bits) < n, bits + np.uint64(1), bits)
    return np.maximum((bits + np.uint64(1)) // np.uint64(2), np.uint64(1))


def _encrypt(x: np.ndarray, half: np.ndarray, keys: np.ndarray, tweak: np.ndarray) -> np.ndarray:
    mask = (np.uint64(1) << half) - np.uint64(1)
    left, right = x >> half, x & mask
    for r in range(ROUNDS):
        f = _mix(right ^ keys[r] ^ tweak * _GOLDEN) & mask
        left, right = right, left ^ f
    return (left << half) | right


def feistel(
    x: np.ndarray, n: int | np.ndarray, keys: np.ndarray, tweak: int | np.ndarray = 0
) -> np.ndarray:
    """The image of each `x` (0 <= x < n) under the bijection of [0, n) keyed by `keys`
    (from `round_keys`) and `tweak` (one independent bijection per tweak value: a
    window number). `n` and `tweak` may be arrays, one per element of `x`."""
    x = np.asarray(x, dtype=np.int64)
    shape = x.shape
    flat = x.reshape(-1).astype(np.uint64)
    sizes = np.broadcast_to(np.asarray(n, dtype=np.int64), shape).reshape(-1).astype(np.uint64)
    tweaks = np.broadcast_to(np.asarray(tweak, dtype=np.int64), shape).reshape(-1)
    tweaks = tweaks.astype(np.uint64)
    if flat.size and (np.any(flat >= sizes)):
        raise IndexError("feistel: an input lies outside its domain [0, n)")
    half = _half_bits(sizes)
    with np.errstate(over="ignore"):
        out = _encrypt(flat, half, keys, tweaks)
        # Cycle walking: the domain is at most 4n, so each step lands inside with
        # probability >= 1/4; few elements need more than a handful of steps.
        outside = np.flatnonzero(out >= sizes)
        while outside.size:
            out[outside] = _encrypt(out[outside], half[outside], keys, tweaks[outside])
            outside = outside[out[outside] >= sizes[outside]]
    return out.astype(np.int64).reshape(shape)
