"""`cut_windows`, a whole batch of packed windows in one call, compiled
(iolib/text/loops.c) and in NumPy (iolib/text/loops_numpy.py): against a Python
statement of the windows on random streams (positions of any size, empty ones, pieces
kept at a chunk's edge, windows across positions and to the stream's end), and bad
arguments refused with the same error by both, never read or written out of bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from iolib.text import loops, loops_numpy
from iolib.text.packed_reader import Segment
from tests.test_text_loops import DTYPES, EOS, documents, stream_of

IGNORE = -100
BOTH = pytest.mark.parametrize("impl", [loops, loops_numpy], ids=["compiled", "numpy"])


def _fill(out, segment, row, column, a, b, length, want_docs) -> None:
    """Piece (row, column, a, b) of a whole segment: stream tokens a .. b - 1 from
    `column` on, each token's label the next one (ignore after a document's end and past
    the piece), its position from 0 at the piece's start and after each document's end."""
    starts, rows = segment.starts, segment.rows
    tokens = stream_of(segment.tokens, segment.sources, starts, EOS)
    ends = set((starts[1:] - 1).tolist())
    position = 0
    for t in range(a, b):
        c = column + t - a
        if c >= length:
            break
        out[0, row, c] = tokens[t]
        out[1, row, c] = IGNORE if t in ends or t + 1 >= b else tokens[t + 1]
        out[2, row, c] = position
        if want_docs:
            out[3, row, c] = rows[int(np.searchsorted(starts, t, side="right") - 1)]
        position = 0 if t in ends else position + 1


def _reference(firsts, cum, whole, rows, length, want_docs) -> np.ndarray:
    """The windows from the positions' whole segments (`whole`: position -> Segment):
    window r the stream's tokens firsts[r] .. +length, cut at the stream's end, a piece
    in each position it touches."""
    out = np.full((4 if want_docs else 3, rows, length), 7, dtype=np.int64)
    end = int(cum[-1])
    for r, lo in enumerate(firsts.tolist()):
        hi, column = min(lo + length + 1, end), 0
        for p in range(cum.size - 1):
            a, b = max(lo, int(cum[p])), min(hi, int(cum[p + 1]))
            if a < b:
                _fill(out, whole[p], r, column, a - cum[p], b - cum[p], length, want_docs)
                column += b - a
    return out


@st.composite
def streams(draw):
    """(firsts, cum, positions, segments given, whole segments, rows, length): a stream
    of 1-5 positions, some empty; some given as a piece (the tokens a chunk's edge keeps),
    so that a window may need tokens the piece lacks."""
    dtype = draw(st.sampled_from(DTYPES))
    whole, given, sizes = {}, {}, []
    for p in range(draw(st.integers(1, 5))):
        if draw(st.integers(0, 4)) == 0:
            sizes.append(0)
            continue  # an empty position: no segment
        tokens, sources, starts = draw(documents(dtype))
        sizes.append(int(starts[-1]))
        tokens = tokens if isinstance(tokens, tuple) else (tokens,)
        segment = Segment(tokens, sources, starts,
                          np.arange(starts.size - 1, dtype=np.int64) * 10 + p)  # fmt: skip
        whole[p] = given[p] = segment
        if draw(st.integers(0, 3)) == 0:  # a piece of it, as an edge keeps
            a = draw(st.integers(0, sizes[-1] - 1))
            given[p] = segment.piece(a, draw(st.integers(a + 1, sizes[-1])))
    cum = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    if cum[-1] == 0:
        event("an empty stream")
        firsts = np.zeros(0, dtype=np.int64)
    else:
        firsts = np.array(draw(st.lists(st.integers(0, int(cum[-1]) - 1), max_size=4)), np.int64)
    rows = firsts.size + draw(st.integers(0, 1))
    length = draw(st.integers(1, 12))
    held = sorted(given)
    segments = [(s.tokens, s.sources, s.starts, s.rows, s.offset)
                for s in map(given.__getitem__, held)]  # fmt: skip
    return firsts, cum, np.array(held, dtype=np.int64), segments, whole, rows, length


def _pieces_fit(firsts, cum, segments, positions, length) -> bool:
    """Whether every window's tokens in each position lie in the segment given for it."""
    at = dict(zip(positions.tolist(), segments, strict=True))
    for lo in firsts.tolist():
        hi = min(lo + length + 1, int(cum[-1]))
        for p in range(cum.size - 1):
            a, b = max(lo, int(cum[p])), min(hi, int(cum[p + 1]))
            if a < b:
                _, _, starts, _, offset = at[p]
                if a - cum[p] < offset or b - cum[p] > offset + starts[-1]:
                    return False
    return True


@settings(max_examples=300, deadline=None)
@given(streams(), st.booleans())
def test_cut_windows_matches_the_statement_of_the_windows(stream, want_docs) -> None:
    firsts, cum, positions, segments, whole, rows, length = stream
    fits = _pieces_fit(firsts, cum, segments, positions, length)
    event("fits" if fits else "a window outside a piece")
    want = _reference(firsts, cum, whole, rows, length, want_docs)
    for impl in (loops, loops_numpy):
        got = np.full_like(want, 7)
        if not fits:
            with pytest.raises(IndexError):
                impl.cut_windows(firsts, cum, positions, segments, EOS, IGNORE, got, rows, length,
                                 want_docs)  # fmt: skip
            continue
        impl.cut_windows(firsts, cum, positions, segments, EOS, IGNORE, got, rows, length,
                         want_docs)  # fmt: skip
        np.testing.assert_array_equal(got, want, err_msg=impl.__name__)


def _args(**changes) -> list:
    """A valid call: two positions of 5 tokens (documents of 2 and 3, eos included; the
    second position's stored in the other order), two windows of 4."""
    first = (np.array([0, 2, 3], dtype=np.int32), np.array([0, 1]), np.array([0, 2, 5]),
             np.array([1, 2]), 0)  # fmt: skip
    second = (np.array([8, 5, 6], dtype=np.int32), np.array([1, 0]), np.array([0, 3, 5]),
              np.array([3, 4]), 0)  # fmt: skip
    args = {"firsts": np.array([0, 4]), "cum": np.array([0, 5, 10]),
            "positions": np.array([0, 1]), "segments": [first, second], "eos": 99,
            "ignore": IGNORE,
            "out": np.zeros((3, 2, 4), dtype=np.int64), "rows": 2, "length": 4,
            "want_docs": False}  # fmt: skip
    args.update(changes)
    return list(args.values())


@BOTH
def test_a_valid_call_spans_positions_and_ends_at_the_stream(impl) -> None:
    args = _args(firsts=np.array([3, 8]))
    impl.cut_windows(*args)
    ids, labels, positions = args[6]
    # The stream: 0 eos | 2 3 eos || 5 6 eos | 8 eos (eos = 99); the second window ends
    # with the stream.
    assert ids.tolist() == [[3, 99, 5, 6], [8, 99, 0, 0]]
    assert labels.tolist() == [[99, IGNORE, 6, 99], [99, IGNORE, 0, 0]]
    assert positions.tolist() == [[0, 1, 0, 1], [0, 1, 0, 0]]


SEGMENT = (np.arange(3, dtype=np.int32), np.array([0, 1]), np.array([0, 2, 5]),
           np.array([1, 2]), 0)  # fmt: skip


@BOTH
@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"firsts": np.array([0, 10])}, IndexError),  # starts at the stream's end
        ({"firsts": np.array([-1, 0])}, IndexError),  # before the stream
        ({"positions": np.array([0, 2])}, KeyError),  # position 1 has no segment
        ({"positions": np.array([1, 0])}, ValueError),  # positions not rising
        ({"positions": np.array([0])}, ValueError),  # two segments for one position
        (
            {
                "cum": np.array([0, 5, 4, 10]),
                "firsts": np.array([3]),
                "positions": np.arange(3),
                "segments": [SEGMENT, SEGMENT, SEGMENT],
            },
            ValueError,
        ),  # cum falls where crossed
        ({"cum": np.array([0])}, ValueError),  # no position at all
        ({"cum": np.array([-(2**63), 5, 10])}, ValueError),  # below 0: lo - cum overflows
        ({"cum": np.array([0, 5, 12]), "firsts": np.array([0, 8])}, IndexError),  # too short
        ({"rows": 1, "out": np.zeros((3, 1, 4), dtype=np.int64)}, ValueError),  # 2 windows
        ({"out": np.zeros((3, 2, 3), dtype=np.int64)}, ValueError),  # smaller than asked
        ({"want_docs": True}, ValueError),  # no plane for the documents
        ({"out": np.zeros((3, 2, 4), dtype=np.int32)}, TypeError),  # not int64
        ({"firsts": np.array([0, 4], dtype=np.int32)}, TypeError),
        ({"segments": [SEGMENT[:4], SEGMENT]}, TypeError),  # no offset
        ({"segments": [SEGMENT, (*SEGMENT[:4], -1)]}, ValueError),  # a negative offset
        ({"segments": [SEGMENT, (SEGMENT[0].astype(float), *SEGMENT[1:])]}, TypeError),
        ({"segments": [SEGMENT, (*SEGMENT[:2], np.array([0, 3, 3]), *SEGMENT[3:])]}, ValueError),
        ({"segments": [SEGMENT, (SEGMENT[0], np.array([0, 2]), *SEGMENT[2:])]}, IndexError),
        ({"segments": [SEGMENT, (SEGMENT[0], np.array([0]), *SEGMENT[2:])]}, IndexError),
    ],
)
def test_cut_windows_refuses_what_it_would_read_or_write_out_of_bounds(impl, changes, error):
    with pytest.raises(error):
        impl.cut_windows(*_args(**changes))


SMALL = st.integers(-3, 14)


@settings(max_examples=400, deadline=None)
@given(st.data(), streams(), st.booleans())
def test_cut_windows_fuzz_raises_or_agrees_with_the_statement(data, stream, want_docs) -> None:
    """Indices changed at random (firsts, cum, positions, offsets, rows, length): the
    compiled loop raises or writes what the statement says; it never crashes."""
    firsts, cum, positions, segments, whole, rows, length = stream
    draw = data.draw
    if draw(st.booleans()):
        firsts = np.array(draw(st.lists(SMALL, max_size=5)), dtype=np.int64)
    if draw(st.booleans()):
        cum = np.array(draw(st.lists(SMALL, min_size=0, max_size=6)), dtype=np.int64)
    if draw(st.booleans()):
        positions = np.array(draw(st.lists(SMALL, max_size=len(segments) + 1)), np.int64)
    if draw(st.booleans()) and segments:
        i = draw(st.integers(0, len(segments) - 1))
        segments = [*segments[:i], (*segments[i][:4], draw(SMALL)), *segments[i + 1 :]]
    if draw(st.booleans()):
        rows, length = draw(st.integers(-1, 5)), draw(st.integers(-1, 12))
    out = np.full((4 if want_docs else 3, max(rows, 0), max(length, 0)), 7, dtype=np.int64)
    try:
        loops.cut_windows(firsts, cum, positions, segments, EOS, IGNORE, out, rows, length,
                          want_docs)  # fmt: skip
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    # Accepted: the segments given are whole ones or pieces at the positions they name,
    # so the windows are what the whole segments' statement says.
    assert positions.size == len(segments)
    at = dict(zip(positions.tolist(), segments, strict=True))
    for p, (tokens, _, _, _, offset) in at.items():
        if whole.get(p) is not None and tokens is whole[p].tokens and offset == 0:
            continue  # the whole segment of this very position
        whole[p] = None  # a piece, or another position's: the statement cannot say
    if all(whole.get(p) is not None for p in range(cum.size - 1) if cum[p + 1] > cum[p]):
        want = _reference(firsts, cum, whole, rows, length, want_docs)
        np.testing.assert_array_equal(out, want)
