"""The compiled loops of packed windows (iolib/text/loops.c), against a Python
statement of what they do, on random segments and pieces; and bad arguments refused
with an error, never read or written out of bounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from iolib.text import loops

IGNORE = -100
EOS = 50_257
DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64]


def stream_of(tokens, sources, starts, eos):
    """A segment's stream, spelled out: document j's tokens, tokens[sources[j]:] up to
    starts[j + 1] - 1, then eos (several buffers of tokens read as one)."""
    if isinstance(tokens, (tuple, list)):
        tokens = np.concatenate([np.asarray(t).ravel().astype(np.int64) for t in tokens] or [[]])
    out = []
    for j in range(starts.size - 1):
        size = int(starts[j + 1] - starts[j]) - 1
        out += [int(t) for t in tokens[int(sources[j]) : int(sources[j]) + size]] + [eos]
    return out


def _reference(tokens, sources, starts, doc_rows, pieces, rows, length, want_docs, eos=EOS):
    """Each piece (row, column, a, b): stream tokens a .. b - 1 from `column` on, the
    token after each one its label (ignore after a document's eos and past the piece),
    positions from 0 at the piece's start and after each document's end."""
    out = np.full((4 if want_docs else 3, rows, length), 7, dtype=np.int64)
    ends = set((starts[1:] - 1).tolist())
    tokens = stream_of(tokens, sources, starts, eos)
    for row, column, a, b in pieces.tolist():
        position = 0
        for t in range(a, b):
            c = column + t - a
            if c >= length:
                break
            doc = int(np.searchsorted(starts, t, side="right") - 1)
            out[0, row, c] = tokens[t]
            out[1, row, c] = IGNORE if t in ends or t + 1 >= b else tokens[t + 1]
            out[2, row, c] = position
            if want_docs:
                out[3, row, c] = doc_rows[doc]
            position = 0 if t in ends else position + 1
    return out


@st.composite
def documents(draw, dtype):
    """(tokens, sources, starts): 1-12 documents (1-9 stream tokens each, eos included)
    whose tokens lie in `tokens` in another order, with gaps between them; `tokens` one
    array, or a tuple of them split between documents (a row group's record batches)."""
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    info = np.iinfo(dtype)
    order = draw(st.permutations(range(len(sizes))))
    gaps = draw(st.lists(st.integers(0, 2), min_size=len(sizes) + 1, max_size=len(sizes) + 1))
    sources, at, cuts = np.zeros(len(sizes), dtype=np.int64), gaps[0], [0]
    for k, j in enumerate(order):
        sources[j], at = at, at + sizes[j] - 1 + gaps[k + 1]
        if draw(st.integers(0, 3)) == 0:
            cuts.append(at)  # a new buffer from here
    values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=at, max_size=at))
    tokens = np.array(values, dtype=dtype)
    if len(cuts) > 1 or draw(st.booleans()):
        return tuple(np.split(tokens, cuts[1:])), sources, starts
    return tokens, sources, starts


@st.composite
def segments(draw):
    tokens, sources, starts = draw(documents(draw(st.sampled_from(DTYPES))))
    doc_rows = np.arange(starts.size - 1, dtype=np.int64) * 10 + 3
    rows, length = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    size = int(starts[-1])
    pieces = []
    for row in range(rows):
        a = draw(st.integers(0, size - 1))
        b = draw(st.integers(a, size))
        # A piece after column 0 follows a segment's end: it begins a document.
        column = draw(st.integers(0, length)) if a in set(starts.tolist()) else 0
        pieces.append((row, column, a, b))
    pieces = np.array(pieces, dtype=np.int64)
    return tokens, sources, starts, doc_rows, pieces, rows, length


@settings(max_examples=300, deadline=None)
@given(segments(), st.booleans())
def test_cut_pieces_matches_the_reference(segment, want_docs) -> None:
    tokens, sources, starts, doc_rows, pieces, rows, length = segment
    want = _reference(tokens, sources, starts, doc_rows, pieces, rows, length, want_docs)
    got = np.full_like(want, 7)
    loops.cut_pieces(tokens, sources, starts, doc_rows, pieces, EOS, IGNORE, got, rows, length,
                     want_docs)  # fmt: skip
    np.testing.assert_array_equal(got, want)


def _args(**changes):
    """A valid call: documents of 3 and 5 tokens (4 and 6 with eos), the second's first
    in `tokens`; one piece across both."""
    tokens = np.arange(8, dtype=np.int32)
    starts = np.array([0, 4, 10], dtype=np.int64)
    args = {"tokens": tokens, "sources": np.array([5, 0], dtype=np.int64), "starts": starts,
            "doc_rows": np.array([5, 6], dtype=np.int64),
            "pieces": np.array([[0, 0, 0, 5]], dtype=np.int64), "eos": EOS, "ignore": IGNORE,
            "out": np.zeros((3, 1, 4), dtype=np.int64), "rows": 1, "length": 4,
            "want_docs": False}  # fmt: skip
    args.update(changes)
    return list(args.values())


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"pieces": np.array([[0, 0, 6, 11]], dtype=np.int64)}, IndexError),  # past the stream
        ({"sources": np.array([5, 4], dtype=np.int64)}, IndexError),  # tokens past `tokens`
        ({"sources": np.array([6, 0], dtype=np.int64)}, IndexError),  # the first's too
        ({"sources": np.array([-1, 0], dtype=np.int64)}, IndexError),  # before `tokens`
        ({"sources": np.array([5], dtype=np.int64)}, IndexError),  # a document without one
        ({"tokens": (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int64))}, TypeError),
        ({"tokens": (np.arange(6, dtype=np.int32), np.arange(2, dtype=np.int32))}, IndexError),
        ({"pieces": np.array([[1, 0, 0, 5]], dtype=np.int64)}, IndexError),  # no such row
        ({"pieces": np.array([[0, 5, 0, 5]], dtype=np.int64)}, IndexError),  # past the columns
        ({"pieces": np.array([[0, 0, 5, 4]], dtype=np.int64)}, IndexError),  # b before a
        ({"doc_rows": np.array([5], dtype=np.int64)}, IndexError),  # a document without a row
        ({"out": np.zeros((3, 1, 3), dtype=np.int64)}, ValueError),  # smaller than asked
        ({"want_docs": True}, ValueError),  # no plane for the documents
        ({"starts": np.array([0, 4, 10], dtype=np.int32)}, TypeError),  # not int64
        ({"starts": np.array([0, 6, 4], dtype=np.int64)}, ValueError),  # not rising
        ({"tokens": np.zeros(10, dtype=np.float64)}, TypeError),  # not integers
        ({"out": np.zeros((3, 1, 4), dtype=np.int64)[:, :, ::2]}, ValueError),  # not contiguous
        ({"starts": np.zeros(0, dtype=np.int64)}, ValueError),  # not even the length
    ],
)
def test_cut_pieces_refuses_what_it_would_read_or_write_out_of_bounds(changes, error) -> None:
    with pytest.raises(error):
        loops.cut_pieces(*_args(**changes))


def test_an_empty_starts_is_named_as_such() -> None:
    with pytest.raises(ValueError, match="starts is empty"):
        loops.cut_pieces(*_args(starts=np.zeros(0, dtype=np.int64)))


# The family grid: every argument of both loops x every dtype x both byte orders. Each
# argument's row runs in a child process, so a crash (the segfault of an object buffer
# read as int64, the SIGFPE of a zero item size) fails that row, not the suite.
ROOT = Path(__file__).resolve().parent.parent
GRID_DTYPES = [
    "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f4", "f8", "c16", "?", "O", "S8",
    "V0", "M8[s]",
]  # fmt: skip
CUT_ARGS = ["tokens", "sources", "starts", "doc_rows", "pieces", "out"]
# cut_windows: tokens, sources, starts and doc_rows are those of the segment the second
# window ends in.
WINDOW_ARGS = ["firsts", "cum", "positions", "tokens", "sources", "starts", "doc_rows", "out"]
TOKEN_KINDS = {"i1", "u1", "i2", "u2", "i4", "u4", "i8"}  # what tokens/values may be


def _dtype(code: str, swapped: bool) -> np.dtype:
    dtype = np.dtype([]) if code == "V0" else np.dtype(code)
    return dtype.newbyteorder("S") if swapped else dtype


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.itemsize == 0:
        return np.zeros(array.shape, dtype=dtype)
    if dtype.kind == "O":
        return array.astype(object)
    if dtype.kind in "SV":
        return array.astype(np.int64).view(np.uint8).copy().view(dtype) if dtype.itemsize == 8 \
            else np.zeros(array.shape, dtype=dtype)  # fmt: skip
    return array.astype(dtype)


def _grid_case(function: str, argument: str, code: str, swapped: bool) -> str:
    """One call with one argument in another dtype: 'ok' (and equal to the int64 call's
    result), or the error's type and message."""
    dtype = _dtype(code, swapped)
    if function == "windows":
        return _grid_windows_case(argument, dtype)
    args = _args(want_docs=True, out=np.zeros((4, 1, 4), dtype=np.int64))
    position = {"tokens": 0, "sources": 1, "starts": 2, "doc_rows": 3, "pieces": 4, "out": 7}
    position, call, out_at = position[argument], loops.cut_pieces, 7
    want = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    call(*want)
    try:
        args[position] = _cast(args[position], dtype)
    except (TypeError, ValueError) as exc:
        return f"unbuildable {type(exc).__name__}"
    try:
        call(*args)
    except Exception as exc:  # any refusal is recorded; the test says which are right
        return f"{type(exc).__name__}: {exc}"
    try:
        right = np.array_equal(np.asarray(args[out_at]).astype(np.int64), want[out_at])
    except Exception:  # what was written cannot even be read back
        right = False
    return "ok" if right else "ok but wrong"


def _grid_windows_case(argument: str, dtype: np.dtype) -> str:
    """`_grid_case` for cut_windows, whose segments' buffers sit in a tuple each."""

    def call(changed: dict) -> np.ndarray:
        a = {"firsts": np.array([0, 4]), "cum": np.array([0, 5, 10]),
             "positions": np.array([0, 1]), "tokens": np.arange(5, 8, dtype=np.int64),
             "sources": np.array([1, 0]), "starts": np.array([0, 3, 5]),
             "doc_rows": np.array([3, 4]), "out": np.zeros((4, 2, 4), dtype=np.int64)}  # fmt: skip
        a.update(changed)
        first = (np.arange(3, dtype=np.int64), np.array([0, 1]), np.array([0, 2, 5]),
                 np.array([1, 2]), 0)  # fmt: skip
        second = (a["tokens"], a["sources"], a["starts"], a["doc_rows"], 0)
        loops.cut_windows(a["firsts"], a["cum"], a["positions"], [first, second], EOS, IGNORE,
                          a["out"], 2, 4, True)  # fmt: skip
        return a["out"]

    want = call({})
    names = {"tokens": np.arange(5, 8), "sources": np.array([1, 0]),
             "starts": np.array([0, 3, 5]), "doc_rows": np.array([3, 4]),
             "firsts": np.array([0, 4]),
             "cum": np.array([0, 5, 10]), "positions": np.array([0, 1]),
             "out": np.zeros((4, 2, 4))}  # fmt: skip
    try:
        changed = _cast(names[argument], dtype)
    except (TypeError, ValueError) as exc:
        return f"unbuildable {type(exc).__name__}"
    try:
        got = call({argument: changed})
    except Exception as exc:  # any refusal is recorded; the test says which are right
        return f"{type(exc).__name__}: {exc}"
    try:
        right = np.array_equal(np.asarray(got).astype(np.int64), want)
    except Exception:  # what was written cannot even be read back
        right = False
    return "ok" if right else "ok but wrong"


def _grid_child() -> None:
    for function, names in (("cut", CUT_ARGS), ("windows", WINDOW_ARGS)):
        for argument in names:
            for code in GRID_DTYPES:
                for swapped in (False, True):
                    case = [function, argument, code, swapped]
                    print(json.dumps(case), flush=True)  # the case, should it crash
                    print(json.dumps([*case, _grid_case(*case)]), flush=True)


def _accepted(function: str, argument: str, code: str, swapped: bool) -> bool:
    native = not swapped or np.dtype(code).itemsize <= 1
    if argument == "tokens":
        return native and code in TOKEN_KINDS
    return native and code == "i8"


@pytest.fixture(scope="module")
def grid() -> tuple[dict, str]:
    """The whole grid, run once in a child process: its outcomes, and how it ended."""
    child = subprocess.run(
        [sys.executable, "-c", "from tests.test_text_loops import _grid_child; _grid_child()"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [json.loads(line) for line in child.stdout.splitlines()]
    outcomes = {tuple(line[:2]): [] for line in lines}
    for line in lines:
        if len(line) == 5:
            outcomes[tuple(line[:2])].append(line[2:])
    ended = f"exit {child.returncode} after {lines[-1:]}: {child.stderr[-1500:]}"
    return outcomes, ended


@pytest.mark.parametrize(
    ("function", "argument"),
    [("cut", a) for a in CUT_ARGS] + [("windows", a) for a in WINDOW_ARGS],
)
def test_every_argument_dtype_and_byte_order_is_read_right_or_refused(grid, function, argument):
    outcomes, ended = grid
    rows = outcomes.get((function, argument), [])
    assert len(rows) == 2 * len(GRID_DTYPES), f"the child crashed: {ended}"
    for code, swapped, outcome in rows:
        case = f"{argument} {code} {'swapped' if swapped else 'native'}: {outcome}"
        if outcome.startswith("unbuildable"):  # NumPy cannot make it: nothing to pass
            continue
        if _accepted(function, argument, code, swapped):
            assert outcome == "ok", case
        else:
            assert outcome.split(":")[0] in ("TypeError", "ValueError", "BufferError"), case
            assert f"{argument}:" in outcome, case


# The fuzz: arbitrary arrays (dtypes, byte orders, shapes, values) for every argument.
# The loops raise an error or agree with the Python statement above; never crash.
ANY_DTYPE = (
    hnp.integer_dtypes(endianness="?")
    | hnp.unsigned_integer_dtypes(endianness="?")
    | hnp.floating_dtypes(endianness="?")
    | hnp.boolean_dtypes()
    | st.just(np.dtype(object))
)


@st.composite
def any_array(draw, dtype=ANY_DTYPE, elements=None):
    dtype = draw(dtype)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6))
    if dtype.kind == "O":
        return np.array(draw(st.lists(st.integers(-5, 50), min_size=2, max_size=8)), dtype=object)
    kw = {}
    if elements is not None and dtype.kind in "iu":  # small values: some calls get through
        kw = {"elements": elements if dtype.kind == "i" else elements.map(abs)}
    return draw(hnp.arrays(dtype, shape, **kw))


SMALL = st.integers(-3, 40)
SOMETIMES = st.integers(0, 3).map(lambda x: x == 0)  # replace an argument 1 time in 4


def _maybe(draw, value, other):
    """`value`, or 1 time in 4 an arbitrary array: most calls keep most arguments right,
    so the checks of one argument are reached with the others valid."""
    return draw(other) if draw(SOMETIMES) else value


@settings(max_examples=400, deadline=None)
@given(st.data(), segments(), st.booleans(), st.integers(-(2**63), 2**63 - 1))
def test_cut_pieces_fuzz_raises_or_agrees_with_the_statement(data, segment, want_docs, ignore):
    tokens, sources, starts, doc_rows, pieces, rows, length = segment
    draw = data.draw
    tokens = _maybe(draw, tokens, any_array())
    sources = _maybe(draw, sources, any_array(elements=SMALL))
    starts = _maybe(draw, starts, any_array(elements=SMALL))
    doc_rows = _maybe(draw, doc_rows, any_array(elements=SMALL))
    pieces = _maybe(draw, pieces, any_array(elements=SMALL))
    rows, length = _maybe(draw, rows, st.integers(-2, 5)), _maybe(draw, length, st.integers(-1, 12))
    out_dtype = _maybe(draw, np.int64, st.sampled_from([np.int32, object, np.float64, ">i8"]))
    out = np.full((4 if want_docs else 3, max(rows, 0), max(length, 0)), 7, dtype=out_dtype)
    try:
        loops.cut_pieces(tokens, sources, starts, doc_rows, pieces, EOS, ignore, out, rows, length,
                         want_docs)  # fmt: skip
    except (TypeError, ValueError, IndexError, BufferError, OverflowError) as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    global IGNORE
    saved, IGNORE = IGNORE, ignore
    try:
        tokens = tokens if isinstance(tokens, tuple) else tokens.ravel()
        want = _reference(tokens, sources.ravel(), starts.ravel(), doc_rows.ravel(),
                          pieces.ravel()[: pieces.size // 4 * 4].reshape(-1, 4), rows, length,
                          want_docs)  # fmt: skip
    finally:
        IGNORE = saved
    np.testing.assert_array_equal(out, want)


# Another thread writing `pieces`, `starts` and `sources` while the loops run without the
# GIL: the
# loops read their own copies, so the process lives (before: a segfault). Each bad value
# is put back at once, so that calls pass their checks and run while it is there.
_RACE = r"""
import sys
import threading
import numpy as np
from iolib.text import loops

sys.setswitchinterval(1e-6)
tokens = np.arange(200_000, dtype=np.int32)
good_starts = np.arange(0, 200_001, 50, dtype=np.int64)
starts = good_starts.copy()
good_sources = np.arange(starts.size - 1, dtype=np.int64)[::-1] * 49
sources = good_sources.copy()
doc_rows = np.arange(starts.size - 1, dtype=np.int64)
good = np.array([[r, 0, 50 * r, 50 * r + 64] for r in range(2000)], dtype=np.int64)
pieces = good.copy()
out = np.zeros((4, 2000, 64), dtype=np.int64)
stop = threading.Event()
evil = np.array([2**62, -(2**62), 2**40, -1], dtype=np.int64)

def mutate():
    i = 0
    while not stop.is_set():
        k, j = i % 2000, (i * 7) % starts.size
        pieces[k] = evil
        pieces[k] = good[k]
        starts[j] = -(2**40)
        starts[j] = good_starts[j]
        sources[j % sources.size] = evil[i % 4]
        sources[j % sources.size] = good_sources[j % sources.size]
        i += 1

thread = threading.Thread(target=mutate)
thread.start()
errors = 0
for _ in range(2000):
    try:
        loops.cut_pieces(tokens, sources, starts, doc_rows, pieces, 7, -100, out, 2000, 64, True)
    except (IndexError, ValueError):
        errors += 1
stop.set()
thread.join()
print("survived", errors)
"""


def test_a_thread_writing_the_arguments_during_calls_cannot_crash_the_process() -> None:
    child = subprocess.run([sys.executable, "-c", _RACE], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert "survived" in child.stdout
