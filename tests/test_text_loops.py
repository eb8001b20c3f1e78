"""The compiled loops of packed windows (iolib/text/loops.c), against a Python
statement of what they do, on random segments and pieces; and bad arguments refused
with an error, never read or written out of bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iolib.text import loops

IGNORE = -100
DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64]


def _reference(tokens, starts, doc_rows, pieces, rows, length, want_docs):
    """Each piece (row, column, a, b): tokens[a:b] from `column` on, the token after
    each one its label (ignore after a document's last token and past the piece),
    positions from 0 at the piece's start and after each document's end."""
    out = np.full((4 if want_docs else 3, rows, length), 7, dtype=np.int64)
    ends = set((starts[1:] - 1).tolist())
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
def segments(draw):
    dtype = draw(st.sampled_from(DTYPES))
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=12))
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    info = np.iinfo(dtype)
    values = draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=int(starts[-1]),
                           max_size=int(starts[-1])))  # fmt: skip
    tokens = np.array(values, dtype=dtype)
    head = draw(st.booleans())  # a piece kept at a chunk's edge: its last document open
    if head:
        starts = starts[:-1]
    doc_rows = np.arange(starts.size, dtype=np.int64) * 10 + 3
    rows, length = draw(st.integers(1, 4)), draw(st.integers(1, 12))
    pieces = []
    for row in range(rows):
        a = draw(st.integers(0, tokens.size - 1))
        b = draw(st.integers(a, tokens.size))
        # A piece after column 0 follows a segment's end: it begins a document.
        column = draw(st.integers(0, length)) if a in set(starts.tolist()) else 0
        pieces.append((row, column, a, b))
    return tokens, starts, doc_rows, np.array(pieces, dtype=np.int64), rows, length


@settings(max_examples=300, deadline=None)
@given(segments(), st.booleans())
def test_cut_pieces_matches_the_reference(segment, want_docs) -> None:
    tokens, starts, doc_rows, pieces, rows, length = segment
    want = _reference(tokens, starts, doc_rows, pieces, rows, length, want_docs)
    got = np.full_like(want, 7)
    loops.cut_pieces(tokens, starts, doc_rows, pieces, IGNORE, got, rows, length, want_docs)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 6), min_size=1, max_size=20))
def test_pack_documents_copies_each_document_to_its_start(dtype, lengths) -> None:
    lengths = np.array(lengths, dtype=np.int64)
    values = np.arange(int(lengths.sum()), dtype=np.int64).astype(dtype)
    firsts = np.cumsum(lengths) - lengths
    order = np.random.default_rng(int(lengths.sum())).permutation(lengths.size)
    starts = np.concatenate([[0], np.cumsum(lengths[order] + 1)]).astype(np.int64)
    out = np.zeros(int(starts[-1]), dtype=dtype)
    loops.pack_documents(values, firsts[order], lengths[order], starts[:-1].copy(), out)
    for j, doc in enumerate(order.tolist()):
        at = int(starts[j])
        np.testing.assert_array_equal(out[at : at + lengths[doc]],
                                      values[firsts[doc] : firsts[doc] + lengths[doc]])  # fmt: skip


def _args(**changes):
    tokens = np.arange(10, dtype=np.int32)
    starts = np.array([0, 4, 10], dtype=np.int64)
    args = {"tokens": tokens, "starts": starts, "doc_rows": np.array([5, 6], dtype=np.int64),
            "pieces": np.array([[0, 0, 0, 5]], dtype=np.int64), "ignore": IGNORE,
            "out": np.zeros((3, 1, 4), dtype=np.int64), "rows": 1, "length": 4,
            "want_docs": False}  # fmt: skip
    args.update(changes)
    return list(args.values())


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"pieces": np.array([[0, 0, 6, 11]], dtype=np.int64)}, IndexError),  # past the tokens
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
    ],
)
def test_cut_pieces_refuses_what_it_would_read_or_write_out_of_bounds(changes, error) -> None:
    with pytest.raises(error):
        loops.cut_pieces(*_args(**changes))


def test_pack_documents_refuses_a_document_outside_its_buffers() -> None:
    values, out = np.arange(5, dtype=np.int32), np.zeros(6, dtype=np.int32)
    one = np.array([1], dtype=np.int64)
    with pytest.raises(IndexError):
        loops.pack_documents(values, np.array([3]), np.array([3]), np.array([0]), out)
    with pytest.raises(IndexError):
        loops.pack_documents(values, np.array([0]), one * 3, np.array([4]), out)
    with pytest.raises(IndexError):  # an end past 2^63 bytes, which would wrap to negative
        loops.pack_documents(values, one, one * 2**62, one, out)
    with pytest.raises(TypeError):  # out of another width than values
        loops.pack_documents(values, one, one, one, np.zeros(6, dtype=np.int64))
