"""Exact, cheap snapshots of the global generators' states (torch, numpy, random).

Why not their own get/set functions: a map-style Dataset read inline is watched batch by
batch (did a sample draw?) and the caller's state is given back after it. numpy's
`get_state`/`set_state` cost ~40-75 µs each and `random.getstate` ~5-30 µs, about 0.2 ms a
batch in all, which a Dataset of cheap samples pays five times over torch's whole cost.
Here the states are read and written as the bytes they are held in (numpy's MT19937
key and position with its legacy Gaussian cache; `random`'s Mersenne Twister words
and index): ~1 µs each. The layout is found, and checked, on private generators when
this module loads, reading no byte past an object's own size: where it does not match
(another numpy or Python), or with ``IOLIB_RNG_SNAPSHOT=public`` in the environment, the
public functions are used instead.

Safety: only objects this module holds a reference to are read or written (they cannot be
freed or move), always under the GIL (no `ctypes.memmove`, which releases it) and, for
numpy, under the generator's own lock, as `set_state` does; a numpy generator whose bit
generator was replaced is read through the public functions.
"""

from __future__ import annotations

import ctypes
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

_MT_WORDS = 624


class _Memory:
    """Spans of `owner`'s memory, read and written whole, under the GIL. The reference to
    `owner` keeps the spans alive: they must lie within it."""

    def __init__(self, owner: Any, spans: list[tuple[int, int]]) -> None:
        self._owner = owner
        self._views = [
            memoryview((ctypes.c_char * size).from_address(address)).cast("B")
            for address, size in spans
        ]

    def get(self) -> tuple[bytes, ...]:
        return tuple(map(bytes, self._views))  # no Python frame per span: read per batch

    def put(self, saved: tuple[bytes, ...]) -> None:
        for view, data in zip(self._views, saved, strict=True):
            view[:] = data


def _find(obj: Any, pattern: bytes) -> int | None:
    """The offset of `pattern` within `obj`'s own memory (its type's basic size), if once."""
    head = ctypes.string_at(id(obj), type(obj).__basicsize__)
    at = head.find(pattern)
    return at if at >= 0 and head.find(pattern, at + 1) < 0 else None


def _numpy_layout() -> int | None:
    """Where a RandomState holds its cached Gaussian (int has_gauss, 4 bytes of padding,
    double gauss), found on a private generator by a marker value; None if not found."""
    probe = np.random.RandomState(12345)
    key, pos = probe.get_state()[1:3]
    probe.set_state(("MT19937", key, pos, 1, 1234.5678125))
    gauss = _find(probe, np.float64(1234.5678125).tobytes())
    if gauss is None or gauss < 8 or ctypes.c_int.from_address(id(probe) + gauss - 8).value != 1:
        return None
    if gauss + 8 > type(probe).__basicsize__:
        return None
    return gauss - 8


def _numpy_memory(state: np.random.RandomState, aug: int) -> _Memory | None:
    """numpy's legacy generator as bytes: the MT19937 words and position, and the cached
    Gaussian at offset `aug` of the RandomState."""
    bitgen = state._bit_generator
    if type(bitgen) is not np.random.MT19937:
        return None
    return _Memory(
        (state, bitgen), [(bitgen.ctypes.state_address, 4 * _MT_WORDS + 4), (id(state) + aug, 16)]
    )


def _random_layout() -> int | None:
    """Where a random.Random holds its index (then its 624 words), found on a private
    generator by its words; None if not found."""
    probe = random.Random(6789)
    words = probe.getstate()[1]
    found = _find(probe, np.asarray(words[:_MT_WORDS], dtype=np.uint32).tobytes())
    if found is None or found < 4:
        return None
    if ctypes.c_int.from_address(id(probe) + found - 4).value != words[-1]:
        return None
    return found - 4


def _restores(memory: _Memory | None, get: Callable[[], Any], draw: Callable[[], Any]) -> bool:
    """On a private generator: the bytes change with a draw, and putting them back makes
    the public state what it was."""
    if memory is None:
        return False
    before, public = memory.get(), get()
    draw()
    moved = memory.get() != before
    memory.put(before)
    return moved and _same_public(get(), public)


def _same_public(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and len(a) == 5:  # numpy's legacy state
        return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]
    return a == b


class GlobalGenerator:
    """One global generator: `get` a state, `put` it back, `seed` it from a 63-bit int;
    states compare with ==."""

    def __init__(self, get: Any, put: Any, seed: Any) -> None:
        self.get, self.put, self.seed = get, put, seed


def _public_only() -> bool:
    return os.environ.get("IOLIB_RNG_SNAPSHOT", "").lower() == "public"


def _torch() -> GlobalGenerator:
    generator = torch.default_generator

    def get() -> bytes:
        return generator.get_state().numpy().tobytes()

    def put(state: bytes) -> None:
        generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))

    return GlobalGenerator(get, put, generator.manual_seed)


def _numpy_public_get() -> tuple[Any, ...]:
    """numpy's public state with its key as bytes, so that states compare with ==."""
    name, key, pos, has_gauss, gauss = np.random.get_state()
    return (name, key.tobytes(), pos, has_gauss, gauss)


def _numpy_public_put(state: tuple[Any, ...]) -> None:
    name, key, pos, has_gauss, gauss = state
    np.random.set_state((name, np.frombuffer(key, dtype=np.uint32), pos, has_gauss, gauss))


def _numpy() -> GlobalGenerator:
    seed = lambda value: np.random.seed(value & 0xFFFFFFFF)  # noqa: E731
    public = GlobalGenerator(_numpy_public_get, _numpy_public_put, seed)
    if _public_only():
        return public
    generator = np.random.mtrand._rand
    memory = None
    try:
        aug = _numpy_layout()
        probe = np.random.RandomState(7)
        if aug is not None and _restores(
            _numpy_memory(probe, aug), probe.get_state, lambda: probe.standard_normal(3)
        ):
            memory = _numpy_memory(generator, aug)
    except Exception:  # another numpy: its layout is not this one
        memory = None
    if memory is None:
        return public
    bitgen = generator._bit_generator
    lock = bitgen.lock  # the lock the RandomState draws under

    # A bit generator replaced since (`_bit_generator` is writable) is read and written
    # through the public functions; the old one, still referenced, is never written.
    def get() -> Any:
        if generator._bit_generator is not bitgen:
            return _numpy_public_get()
        with lock:
            return memory.get()

    def put(state: Any) -> None:
        if len(state) == 5:
            _numpy_public_put(state)
        elif generator._bit_generator is bitgen:
            with lock:
                memory.put(state)

    return GlobalGenerator(get, put, seed)


def _random() -> GlobalGenerator:
    generator = random._inst  # type: ignore[attr-defined]
    memory = None
    if not _public_only():
        try:
            at = _random_layout()
            probe = random.Random(11)
            if at is not None and _restores(
                _Memory(probe, [(id(probe) + at, 4 + 4 * _MT_WORDS)]), probe.getstate, probe.random
            ):
                memory = _Memory(generator, [(id(generator) + at, 4 + 4 * _MT_WORDS)])
        except Exception:  # another Python: its layout is not this one
            memory = None
    if memory is None:
        return GlobalGenerator(random.getstate, random.setstate, random.seed)
    words = memory

    def get() -> tuple[Any, ...]:
        return (*words.get(), generator.gauss_next)

    def put(state: tuple[Any, ...]) -> None:
        words.put(state[:-1])
        generator.gauss_next = state[-1]

    return GlobalGenerator(get, put, random.seed)


GENERATORS = {"torch": _torch(), "numpy": _numpy(), "random": _random()}
