"""A keyed bijection on [0, n): sample k of a shuffled epoch, computed, not looked up.

Why: a stored permutation costs 8 bytes a sample (8 GB at 10^9 samples) and seconds to
draw before the first batch. A Feistel network is a bijection whatever its round
function, so a plan holds a key, not an array (grain's `index_shuffle` and Mosaic
streaming's shuffles make the same trade).

The network here works on [0, a*c) with a = ceil(sqrt(n)), c = ceil(n / a): a value is
a pair (L < a, R < c); a round maps it to (R, (L + F(R)) mod a), the pair's ranges
swapping each round, an even number of rounds bringing them back. a*c exceeds n by less
than sqrt(n), so "cycle walking" (applying the network again to a value >= n) is rare,
where a power-of-two domain would walk up to three times in four. Only integer
arithmetic: the same key gives the same permutation on every machine.

Each element may carry its own domain size and tweak: a block shuffle permutes samples
within windows of different sizes in one vectorised call.
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


def _shape(n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a, c) with a = ceil(sqrt(n)) and a * c >= n, per element."""
    a = np.ceil(np.sqrt(n.astype(np.float64))).astype(np.uint64)
    a = np.maximum(a, np.uint64(1))
    a = np.where(a * a < n, a + np.uint64(1), a)  # float rounding on large n
    a = np.where((a - np.uint64(1)) * (a - np.uint64(1)) >= n, a - np.uint64(1), a)
    a = np.maximum(a, np.uint64(1))
    c = (n + a - np.uint64(1)) // a
    return a, np.maximum(c, np.uint64(1))


def _encrypt(x: np.ndarray, a: np.ndarray, c: np.ndarray, keys: np.ndarray, salt: np.ndarray):
    left, right = x // c, x % c  # left < a, right < c
    first, second = a, c
    for r in range(ROUNDS):
        f = _mix(right ^ keys[r] ^ salt)
        left, right = right, (left + f % first) % first
        first, second = second, first
    return left * second + right  # an even number of rounds: (left < a, right < c) again


def _at(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Per-element values at `where`, or the one shared value."""
    return values if values.size == 1 else values[where]


def feistel(
    x: np.ndarray, n: int | np.ndarray, keys: np.ndarray, tweak: int | np.ndarray = 0
) -> np.ndarray:
    """The image of each `x` (0 <= x < n) under the bijection of [0, n) keyed by `keys`
    (from `round_keys`) and `tweak` (one independent bijection per tweak value: a
    window number). `n` and `tweak` may be arrays, one per element of `x`."""
    if np.any(np.asarray(n) < 0):
        raise ValueError(f"feistel: the domain size n must be >= 0. Found: {n!r}.")
    x = np.asarray(x, dtype=np.int64)
    shape = x.shape
    flat = x.reshape(-1).astype(np.uint64)
    sizes = np.broadcast_to(np.asarray(n, dtype=np.int64), shape).reshape(-1).astype(np.uint64)
    tweaks = np.broadcast_to(np.asarray(tweak, dtype=np.int64), shape).reshape(-1)
    if flat.size and np.any(flat >= sizes):
        raise IndexError("feistel: an input lies outside its domain [0, n)")
    if sizes.size and (sizes == sizes[0]).all():  # one domain (the common case): scalars
        sizes = sizes[:1]
        if (tweaks == tweaks[0]).all():
            tweaks = tweaks[:1]
    a, c = _shape(sizes)
    with np.errstate(over="ignore"):
        salt = _mix(tweaks.astype(np.uint64) * _GOLDEN)
        out = _encrypt(flat, a, c, keys, salt)
        outside = np.flatnonzero(out >= sizes)
        while outside.size:  # cycle walking: each step lands inside with p > 1 - 1/sqrt(n)
            out[outside] = _encrypt(out[outside], _at(a, outside), _at(c, outside), keys,
                                    _at(salt, outside))  # fmt: skip
            outside = outside[out[outside] >= _at(sizes, outside)]
    return out.astype(np.int64).reshape(shape)
