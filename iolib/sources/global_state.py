"""Exact, cheap snapshots of the global generators' states (torch, numpy, random).

Why not their own get/set functions: a map-style Dataset read inline is watched batch by
batch (did a sample draw?) and the caller's state is given back after it. numpy's
`get_state`/`set_state` cost ~40-75 µs each, `random.getstate` ~5-30 µs and torch's
`get_state` ~2 µs with its conversion to bytes: read before and after every batch, which
a Dataset of cheap samples pays several times over torch's whole cost (~20 µs a batch).
Here the states are read as the bytes they are held in (torch's MT19937 engine with its
two cached normal samples; numpy's MT19937 key and position with its legacy Gaussian
cache; `random`'s Mersenne Twister words and index). A batch checks the whole states
against copies before and after (`sync`, `same`: ~0.4 µs each, comparing in place), so a
draw of any length (624 words bring the position back where it was) or one that only
takes a cached Gaussian is seen. The layouts are found, and checked, on private
generators when this module loads: where one does not match (another torch, numpy or
Python), or with ``IOLIB_RNG_SNAPSHOT=public`` in the environment, the public functions
are used instead.

Safety: only objects this module holds a reference to are read or written (they cannot be
freed or move), reading no byte past an object's own size (a Python object's basic size;
for torch, the members CPUGeneratorImpl.h declares last, located by a marker state),
always under the GIL (bytes, bytearray copies and compares; no `ctypes.memmove`, which
releases it) and, for numpy, under the
generator's own lock, as `set_state` does; a numpy generator whose bit generator was
replaced is read through the public functions. torch's state is written back through
its own `set_state`, which takes the generator's lock.
"""

from __future__ import annotations

import ctypes
import os
import random
import struct
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
        self.views = self._views = [
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

    def __init__(
        self, get: Any, put: Any, seed: Any, views: list[memoryview] | None = None
    ) -> None:
        self.get, self.put, self.seed = get, put, seed
        # Where the state is read as bytes: the spans read (for `watch`), else None.
        self.views = views


def _public_only() -> bool:
    return os.environ.get("IOLIB_RNG_SNAPSHOT", "").lower() == "public"


# torch's CPU generator (ATen/CPUGeneratorImpl.h): `at::mt19937 engine_` (uint64 seed_, int
# left_, bool seeded_, uint32 next_, uint32 state_[624]) then its last members, the cached
# normal samples std::optional<float> and std::optional<double>. Offsets from engine_:
_TORCH_SPAN = 2537  # engine_ (2516, then 4 bytes of padding), optional<float>, optional<double>
_TORCH_FLOAT, _TORCH_DOUBLE = 2520, 2528
_TORCH_PUBLIC = 5056  # get_state()'s size: the legacy struct (words as uint64) and the float


def _torch_public(raw: bytes) -> bytes:
    """The state get_state() gives, from the bytes of engine_ and the two caches."""
    seed, left, seeded, position = struct.unpack_from("<QiBxxxI", raw)
    value, cached = struct.unpack_from("<f?", raw, _TORCH_FLOAT)
    gauss, has_gauss = struct.unpack_from("<d?", raw, _TORCH_DOUBLE)
    out = bytearray(_TORCH_PUBLIC)
    struct.pack_into("<QiiQ", out, 0, seed, left, seeded, position)
    out[24 : 24 + 8 * _MT_WORDS] = np.frombuffer(raw, "<u4", _MT_WORDS, 20).astype("<u8").tobytes()
    struct.pack_into("<d", out, 5024, gauss if has_gauss else 0.0)
    struct.pack_into("<i", out, 5040, has_gauss)
    struct.pack_into("<f?", out, 5048, value if cached else 0.0, cached)
    return bytes(out)


def _torch_canonical(raw: bytes) -> bytes:
    """`raw` without what holds no state (padding, a cache's value while it is empty): two
    states are the same generator state exactly where these are equal."""
    out = bytearray(raw)
    out[13:16], out[2516:2520], out[2525:2528] = bytes(3), bytes(4), bytes(3)
    if not out[_TORCH_FLOAT + 4]:
        out[_TORCH_FLOAT : _TORCH_FLOAT + 4] = bytes(4)
    if not out[_TORCH_DOUBLE + 8]:
        out[_TORCH_DOUBLE : _TORCH_DOUBLE + 8] = bytes(8)
    return bytes(out)


def _impl(generator: torch.Generator) -> int:
    """The address of a generator's GeneratorImpl (see _torch_layout)."""
    return ctypes.c_void_p.from_address(id(generator) + 16).value or 0


def _torch_layout(probe: torch.Generator) -> int | None:
    """Where `probe`'s engine_ lies from its GeneratorImpl, found by its state words, and
    checked field by field against a state set with markers; None where it does not match.
    THPGenerator is {PyObject_HEAD, at::Generator cdata, weakreflist}: `cdata`, one
    pointer to the GeneratorImpl, just before the weak-reference list."""
    kind = type(probe)
    if kind.__basicsize__ != 32 or kind.__weakrefoffset__ != 24 or probe.device.type != "cpu":
        return None
    impl = ctypes.c_void_p.from_address(id(probe) + 16).value
    if not impl or impl % 8:
        return None
    public = bytearray(probe.manual_seed(24680).get_state().numpy().tobytes())
    if len(public) != _TORCH_PUBLIC:
        return None
    struct.pack_into("<ii", public, 8, 600, 1)  # left, seeded
    struct.pack_into("<Q", public, 16, 25)  # next
    struct.pack_into("<d", public, 5024, 1234.5678125)
    struct.pack_into("<i", public, 5040, 1)
    struct.pack_into("<f?", public, 5048, 87.25, True)
    probe.set_state(torch.frombuffer(public, dtype=torch.uint8).clone())
    words = np.frombuffer(bytes(public), "<u8", _MT_WORDS, 24).astype("<u4").tobytes()
    # The object holds at least engine_ and the two caches: the search stays within it.
    head = ctypes.string_at(impl, _TORCH_SPAN + 7)
    at = head.find(words[:64])
    if at < 28 or head.find(words[:64], at + 1) >= 0:
        return None
    engine = at - 20
    if engine % 8:
        return None
    raw = ctypes.string_at(impl + engine, _TORCH_SPAN)
    if raw[20:2516] != words or _torch_public(raw) != bytes(public):
        return None
    return engine


def _torch() -> GlobalGenerator:
    generator = torch.default_generator

    def get() -> bytes:
        return generator.get_state().numpy().tobytes()

    def put(state: bytes) -> None:
        if len(state) == _TORCH_SPAN:
            state = _torch_public(state)
        generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))

    public = GlobalGenerator(get, put, generator.manual_seed)
    if _public_only():
        return public
    memory = None
    try:
        probe = torch.Generator()
        engine = _torch_layout(probe)
        if engine is not None:
            memory = _Memory(generator, [(_impl(generator) + engine, _TORCH_SPAN)])
            if _torch_public(memory.get()[0]) != get():
                memory = None
    except Exception:  # another torch: its layout is not this one
        memory = None
    if memory is None:
        return public
    view = memory.views[0]

    def get_raw() -> bytes:
        return _torch_canonical(bytes(view))

    # Written through set_state, which takes the generator's own lock.
    return GlobalGenerator(get_raw, put, generator.manual_seed, views=[view])


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

    numpy = GlobalGenerator(get, put, seed, views=memory.views)
    numpy.guard = (generator, bitgen, lock)  # type: ignore[attr-defined]
    return numpy


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

    return GlobalGenerator(get, put, random.seed, views=words.views)


GENERATORS = {"torch": _torch(), "numpy": _numpy(), "random": _random()}


def _watch() -> tuple[Callable[[Any], Any], Callable[[Any], bool]]:
    """(sync, same) over every generator, for a batch's before and after (a Dataset of
    cheap samples pays both every batch). `sync(saved)`: copies equal to the generators'
    states, `saved` updated in place (only the states that differ are copied); `same(saved)`:
    do the generators still hold those states? Where each is read as bytes, the copies are
    bytearrays compared with the memory in place (memcmp: no copy, no allocation), under
    numpy's lock; else a list of each one's `get()`."""
    gens = list(GENERATORS.values())

    def slow_sync(saved: Any) -> list[Any]:
        return [g.get() for g in gens]

    def slow_same(saved: list[Any]) -> bool:
        return [g.get() for g in gens] == saved

    views = [view for g in gens if g.views is not None for view in g.views]
    if list(GENERATORS) != ["torch", "numpy", "random"] or len(views) != 4:
        return slow_sync, slow_same
    torch_view, numpy_words, numpy_gauss, random_words = views
    numpy, bitgen, lock = GENERATORS["numpy"].guard  # type: ignore[attr-defined]
    inst = random._inst  # type: ignore[attr-defined]

    # Spelled out (no loop, no `with`): each call costs ~0.4 µs, read twice a batch.
    def sync(saved: Any) -> list[Any]:
        if numpy._bit_generator is not bitgen:
            return slow_sync(saved)
        if saved is None or len(saved) != 5:
            lock.acquire()
            try:
                return [
                    bytearray(torch_view),
                    bytearray(numpy_words),
                    bytearray(numpy_gauss),
                    bytearray(random_words),
                    inst.gauss_next,
                ]
            finally:
                lock.release()
        a, b, c, d, _ = saved
        if a != torch_view:
            a[:] = torch_view
        lock.acquire()
        try:
            if b != numpy_words:
                b[:] = numpy_words
            if c != numpy_gauss:
                c[:] = numpy_gauss
        finally:
            lock.release()
        if d != random_words:
            d[:] = random_words
        saved[4] = inst.gauss_next
        return saved

    def same(saved: list[Any]) -> bool:
        if len(saved) != 5 or numpy._bit_generator is not bitgen:
            return slow_same(saved)
        a, b, c, d, gauss = saved
        lock.acquire()
        try:
            numpy_same = b == numpy_words and c == numpy_gauss
        finally:
            lock.release()
        return numpy_same and a == torch_view and d == random_words and gauss == inst.gauss_next

    return sync, same


sync, same = _watch()


def states(saved: list[Any]) -> dict[str, Any]:
    """What `sync` saved, as each generator's state as its `get()` gives it (copies)."""
    if len(saved) == len(GENERATORS):
        return dict(zip(GENERATORS, saved, strict=True))
    torch_state, words, gauss, random_words, gauss_next = saved
    return {
        "torch": _torch_canonical(bytes(torch_state)),
        "numpy": (bytes(words), bytes(gauss)),
        "random": (bytes(random_words), gauss_next),
    }
