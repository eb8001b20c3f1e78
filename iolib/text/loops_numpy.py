"""The loops of packed token windows in NumPy: what `iolib/text/loops.c` computes, used
where the compiled extension is absent (an install without a compiler) or
IOLIB_NO_EXTENSION=1 asks for it (`iolib.text.kernels` chooses once).

The same functions, arguments, results and errors as the compiled ones: batches are the
same bit for bit either way (tests/test_text_loops.py runs both against a plain Python
statement; tests/test_loops_fallback.py compares whole epochs). Slower: a handful of
NumPy calls a batch, holding the GIL, and temporaries of 8 bytes a token.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

_BLOCK = 1 << 20  # tokens a packing step gathers at once: its temporaries stay at 16 MiB


def _integers(name: str, array: object, *, itemsize: int | None = 8) -> np.ndarray:
    """`array` as a flat native-order integer array, refused with a TypeError otherwise
    (the compiled loops refuse the same)."""
    found = np.asarray(array)
    if found.dtype.kind not in "iu" or not found.dtype.isnative:
        raise TypeError(f"{name}: not a native-order integer buffer (found {found.dtype})")
    if itemsize is not None and found.dtype.itemsize != itemsize:
        raise TypeError(f"{name}: expected {itemsize}-byte items, got {found.dtype.itemsize}")
    return found.reshape(-1)


def _out(name: str, array: object) -> np.ndarray:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
        raise ValueError(f"{name}: not a C-contiguous array")
    if not array.flags.writeable:
        raise ValueError(f"{name}: not writable")
    return array


def pack_documents(
    values: np.ndarray, firsts: np.ndarray, sizes: np.ndarray, starts: np.ndarray, out: np.ndarray
) -> None:
    """Copy document j, values[firsts[j]:][:sizes[j]], to out[starts[j]:], for values and
    out of the same item size; the eos after each document is written by the caller."""
    values = _integers("values", values, itemsize=None)
    out = _out("out", out)
    if out.dtype.itemsize != values.dtype.itemsize:
        raise TypeError(
            f"out: expected {values.dtype.itemsize}-byte items, got {out.dtype.itemsize}"
        )
    firsts, sizes = _integers("firsts", firsts), _integers("sizes", sizes)
    starts = _integers("starts", starts)
    docs = sizes.size
    if firsts.size < docs or starts.size < docs:
        raise ValueError("firsts and starts need an entry a document")
    firsts, starts = firsts[:docs].astype(np.int64), starts[:docs].astype(np.int64)
    sizes = sizes.astype(np.int64)
    flat = out.reshape(-1)
    bad = (
        (firsts < 0) | (sizes < 0) | (starts < 0) | (firsts > values.size)
        | (sizes > values.size - firsts) | (starts > flat.size) | (sizes > flat.size - starts)
    )  # fmt: skip
    if bad.any():
        raise IndexError(f"document {int(np.flatnonzero(bad)[0])} lies outside values or out")
    ends = np.cumsum(sizes)
    j = 0
    while j < docs:
        # A block of documents of about _BLOCK tokens: one gather each.
        stop = max(j + 1, int(np.searchsorted(ends, ends[j] - sizes[j] + _BLOCK, side="right")))
        count = sizes[j:stop]
        total = int(count.sum())
        if total:
            within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
            flat[np.repeat(starts[j:stop], count) + within] = values[
                np.repeat(firsts[j:stop], count) + within
            ]
        j = stop


def cut_pieces(
    tokens: np.ndarray,
    starts: np.ndarray,
    doc_rows: np.ndarray,
    pieces: np.ndarray,
    ignore: int,
    out: np.ndarray,
    rows: int,
    length: int,
    want_docs: bool,
) -> None:
    """Fill each piece (row, column, a, b) of a batch from tokens[a:b] of one segment. out
    is int64 [planes, rows, length]: input_ids, labels, position_ids and (want_docs) the
    documents' rows. Document j spans starts[j] .. starts[j + 1] - 1, its eos last (the
    last document may have no eos in it); the token past `length` is only the last label;
    positions restart at 0 with each piece and after each eos."""
    tokens = _integers("tokens", tokens, itemsize=None)
    if tokens.dtype == np.uint64:
        raise TypeError("tokens: uint64 ids do not fit int64")
    starts, doc_rows = _integers("starts", starts), _integers("doc_rows", doc_rows)
    pieces = _integers("pieces", pieces)
    out = _out("out", out)
    if out.dtype != np.int64:
        raise TypeError(f"out: expected int64, got {out.dtype}")
    planes = 4 if want_docs else 3
    rows, length = int(rows), int(length)
    if starts.size < 1 or rows < 0 or length < 1 or rows > out.size // planes // length:
        raise ValueError("out is smaller than [planes, rows, length]")
    if starts[0] < 0 or (starts.size > 1 and (np.diff(starts) <= 0).any()):
        raise ValueError("starts must rise from 0 or more")
    pieces = pieces[: pieces.size // 4 * 4].reshape(-1, 4)
    row, column, a, b = (pieces[:, i] for i in range(4))
    first_doc = np.searchsorted(starts, a, side="right") - 1
    last_doc = np.searchsorted(starts, b - 1, side="right") - 1
    bad = (
        (row < 0) | (row >= rows) | (column < 0) | (column > length) | (a < 0) | (b < a)
        | (b > tokens.size) | (first_doc < 0) | (last_doc >= doc_rows.size)
    )  # fmt: skip
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise IndexError(f"piece {first} lies outside the batch or the segment")
    placed = np.minimum(b - a, length - column)  # tokens each piece places
    total = int(placed.sum())
    if not total:
        return
    keep = placed > 0
    row, column, a, b, placed = row[keep], column[keep], a[keep], b[keep], placed[keep]
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(placed) - placed, placed)
    t = np.repeat(a, placed) + within  # each cell's token
    piece_end = np.repeat(b, placed)
    cell = np.repeat(row * length + column, placed) + within
    flat = out.reshape(-1)
    size = rows * length
    doc = np.searchsorted(starts, t, side="right") - 1
    begin = np.maximum(np.repeat(a, placed), starts[doc])
    last = starts.size - 1
    # A document's eos: its last token, where the next document's start is known.
    eos = (doc < last) & (t == starts[np.minimum(doc + 1, last)] - 1)
    nxt = np.minimum(t + 1, tokens.size - 1)
    labels = np.where((t + 1 < piece_end) & ~eos, tokens[nxt].astype(np.int64), ignore)
    flat[cell] = tokens[t]
    flat[size + cell] = labels
    flat[2 * size + cell] = t - begin
    if want_docs:
        flat[3 * size + cell] = doc_rows[doc]


def cut_windows(
    firsts: np.ndarray,
    cum: np.ndarray,
    positions: np.ndarray,
    segments: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, int]],
    ignore: int,
    out: np.ndarray,
    rows: int,
    length: int,
    want_docs: bool,
) -> None:
    """Fill a batch's windows: window r (row r) is the stream's tokens firsts[r] ..
    firsts[r] + length (the last only a label), cut at the stream's end; position p of
    the stream holds its tokens cum[p] .. cum[p + 1] - 1. `segments[i]` is (tokens,
    starts, doc_rows, offset) of position positions[i] (rising), whose tokens[0] is the
    position's token `offset`. Each window's part in each position is a piece, filled
    by `cut_pieces`."""
    firsts, cum = _integers("firsts", firsts), _integers("cum", cum)
    positions, out = _integers("positions", positions), _out("out", out)
    if out.dtype != np.int64:
        raise TypeError(f"out: expected int64, got {out.dtype}")
    planes = 4 if want_docs else 3
    rows, length = int(rows), int(length)
    if rows < 0 or length < 1 or rows > out.size // planes // length:
        raise ValueError("out is smaller than [planes, rows, length]")
    if firsts.size > rows:
        raise ValueError("more windows than out has rows")
    if cum.size < 2:
        raise ValueError("cum needs a position at least (two entries)")
    if len(segments) != positions.size:
        raise ValueError(f"{len(segments)} segments for {positions.size} positions")
    for i, segment in enumerate(segments):
        if not isinstance(segment, tuple) or len(segment) != 4:
            raise TypeError(f"segment {i}: expected (tokens, starts, doc_rows, offset)")
        if int(segment[3]) < 0:
            raise ValueError(f"segment {i}: positions must rise and offsets be 0 or more")
    if positions.size > 1 and (np.diff(positions) <= 0).any():
        raise ValueError("segment positions must rise")
    end = int(cum[-1])
    if firsts.size and (firsts.min() < 0 or firsts.max() >= end):
        bad = int(np.flatnonzero((firsts < 0) | (firsts >= end))[0])
        raise IndexError(f"window {bad} starts outside the stream")
    width = length + 1
    count = firsts.size
    owners = np.searchsorted(cum, firsts, side="right") - 1
    outside = (owners < 0) | (owners > cum.size - 2)
    if outside.any():
        raise IndexError(f"window {int(np.flatnonzero(outside)[0])} lies outside the stream")
    if owners.size and cum[owners].min() < 0:
        raise ValueError("cum must be 0 or more")
    pieces = np.empty((count, 4), dtype=np.int64)  # row, column, a, b
    pieces[:, 0], pieces[:, 1], pieces[:, 2] = np.arange(count), 0, firsts
    pieces[:, 3] = np.minimum(firsts + width, end)
    whole = pieces[:, 3] <= cum[owners + 1]  # most windows: one piece
    if not whole.all():
        spans = np.array([p for r in np.flatnonzero(~whole).tolist()
                          for p in _spans(r, int(firsts[r]), cum, width)])  # fmt: skip
        pieces = np.concatenate([pieces[whole], spans[:, 1:]])
        owners = np.concatenate([owners[whole], spans[:, 0]])
    if owners.size > 1:  # a segment's pieces together: one call for each segment
        by_owner = np.argsort(owners, kind="stable")
        owners, pieces = owners[by_owner], pieces[by_owner]
    cuts = (np.flatnonzero(owners[1:] != owners[:-1]) + 1).tolist()
    at = {int(p): i for i, p in enumerate(positions.tolist())}
    for a, b in pairwise([0, *cuts, owners.size] if owners.size else []):
        owner = int(owners[a])
        if owner not in at:
            raise KeyError(f"no segment given for position {owner} (window {int(pieces[a, 0])})")
        tokens, starts, doc_rows, offset = segments[at[owner]]
        mine = pieces[a:b].copy()
        mine[:, 2:] -= int(cum[owner]) + int(offset)  # into the segment's tokens
        cut_pieces(tokens, starts, doc_rows, mine, ignore, out, rows, length, want_docs)


def _spans(row: int, lo: int, cum: np.ndarray, width: int) -> list[tuple[int, int, int, int, int]]:
    """(position, row, column, a, b) of each non-empty part, one a position, of a window
    that spans positions or reaches the stream's end, in stream coordinates."""
    end = int(cum[-1])
    position = int(np.searchsorted(cum, lo, side="right") - 1)
    hi, column, parts = min(lo + width, end), 0, []
    while lo < hi:
        stop = min(hi, int(cum[position + 1]))
        if cum[position] < 0:
            raise ValueError("cum must be 0 or more")
        if stop < lo:  # met where a window crosses it, as the compiled loop meets it
            raise ValueError("cum must not fall")
        if stop > lo:  # an empty position gives nothing
            parts.append((position, row, column, lo, stop))
        lo, column, position = stop, column + stop - lo, position + 1
    return parts
