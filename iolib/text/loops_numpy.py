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


def _tokens(tokens: object) -> tuple[list[np.ndarray], np.ndarray]:
    """A segment's token buffers (one array, or a list or tuple of them of one kind) and
    where each begins in their concatenation (its length last)."""
    chunks = list(tokens) if isinstance(tokens, (list, tuple)) else [tokens]
    chunks = [_integers("tokens", chunk, itemsize=None) for chunk in chunks]
    if any(chunk.dtype == np.uint64 for chunk in chunks):
        raise TypeError("tokens: uint64 ids do not fit int64")
    if len({chunk.dtype for chunk in chunks}) > 1:
        raise TypeError("tokens: its buffers must be of one integer kind")
    bases = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum([chunk.size for chunk in chunks], out=bases[1:])
    return chunks, bases


def _buffer_of(bases: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The buffer holding tokens first .. first + count - 1 of each, or -1 where they do
    not lie in one (the compiled loops' `buffer_of`)."""
    chunk = np.searchsorted(bases[:-1], first, side="right") - 1
    top = bases[np.clip(chunk + 1, 0, bases.size - 1)]  # the buffer's end (any, where none)
    inside = (chunk >= 0) & (count >= 0) & (count <= top - first)
    return np.where(inside, chunk, -1)


def _gather(chunks: list[np.ndarray], bases: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Tokens `at` (checked) of the buffers' concatenation, as int64."""
    out = np.empty(at.size, dtype=np.int64)
    chunk = np.searchsorted(bases[:-1], at, side="right") - 1
    for c in np.unique(chunk).tolist():
        mine = chunk == c
        out[mine] = chunks[c][at[mine] - bases[c]]
    return out


def _check_starts(starts: np.ndarray) -> None:
    if starts.size < 1:
        raise ValueError("starts is empty: it holds the stream's length last")
    if starts[0] < 0 or (starts.size > 1 and (np.diff(starts) <= 0).any()):
        raise ValueError("starts must rise from 0 or more")


def cut_pieces(
    tokens: np.ndarray | Sequence[np.ndarray],
    sources: np.ndarray,
    starts: np.ndarray,
    doc_rows: np.ndarray,
    pieces: np.ndarray,
    eos: int,
    ignore: int,
    out: np.ndarray,
    rows: int,
    length: int,
    want_docs: bool,
) -> None:
    """Fill each piece (row, column, a, b) of a batch from stream tokens a .. b - 1 of one
    segment. out is int64 [planes, rows, length]: input_ids, labels, position_ids and
    (want_docs) the documents' rows. Document j spans stream tokens starts[j] ..
    starts[j + 1] - 1: tokens[sources[j]:] up to its eos, the last; the token past
    `length` is only the last label; positions restart at 0 with each piece and after
    each eos. `tokens` may be several buffers, read as their concatenation, each
    document's in one."""
    chunks, bases = _tokens(tokens)
    sources, starts = _integers("sources", sources), _integers("starts", starts)
    doc_rows, pieces = _integers("doc_rows", doc_rows), _integers("pieces", pieces)
    out = _out("out", out)
    if out.dtype != np.int64:
        raise TypeError(f"out: expected int64, got {out.dtype}")
    planes = 4 if want_docs else 3
    rows, length = int(rows), int(length)
    _check_starts(starts)
    if rows < 0 or length < 1 or rows > out.size // planes // length:
        raise ValueError("out is smaller than [planes, rows, length]")
    pieces = pieces[: pieces.size // 4 * 4].reshape(-1, 4)
    row, column, a, b = (pieces[:, i] for i in range(4))
    documents = starts.size - 1
    # A document whose tokens do not lie in one buffer, or that has no source or row: a
    # piece that touches one is refused (prefix counts: any between its first and last).
    sizes = np.diff(starts) - 1
    own = np.zeros(documents, dtype=bool)
    known = min(documents, sources.size)
    mine, size = sources[:known], sizes[:known]
    own[:known] = np.where(size > 0, _buffer_of(bases, mine, size) >= 0,
                           (mine >= 0) & (mine <= bases[-1]))  # fmt: skip
    own[doc_rows.size :] = False
    bad_before = np.concatenate([[0], np.cumsum(~own)])
    first_doc = np.searchsorted(starts, a, side="right") - 1
    last_doc = np.searchsorted(starts, b - 1, side="right") - 1
    span = (b > a) & (a >= 0) & (b <= starts[-1])
    inside = np.where(span, np.clip(first_doc, 0, documents), 0)
    upto = np.where(span, np.clip(last_doc + 1, 0, documents), 0)
    bad = (
        (row < 0) | (row >= rows) | (column < 0) | (column > length) | (a < 0) | (b < a)
        | (b > starts[-1]) | (span & (first_doc < 0))
        | (bad_before[upto] - bad_before[inside] > 0)
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
    t = np.repeat(a, placed) + within  # each cell's stream token
    piece_end = np.repeat(b, placed)
    cell = np.repeat(row * length + column, placed) + within
    flat = out.reshape(-1)
    size = rows * length
    doc = np.searchsorted(starts, t, side="right") - 1
    begin = np.maximum(np.repeat(a, placed), starts[doc])
    ends = starts[doc + 1] - 1  # each cell's document's eos
    at_eos = t == ends
    ids = np.full(total, eos, dtype=np.int64)
    ids[~at_eos] = _gather(chunks, bases, (sources[doc] + t - starts[doc])[~at_eos])
    # The next token: in the same document (its eos, or its own next), where the piece
    # holds it; after an eos, ignore.
    has_next = (t + 1 < piece_end) & ~at_eos
    labels = np.full(total, ignore, dtype=np.int64)
    labels[has_next & (t + 1 == ends)] = eos
    inner = has_next & (t + 1 < ends)
    labels[inner] = _gather(chunks, bases, (sources[doc] + t + 1 - starts[doc])[inner])
    flat[cell] = ids
    flat[size + cell] = labels
    flat[2 * size + cell] = t - begin
    if want_docs:
        flat[3 * size + cell] = doc_rows[doc]


def cut_windows(
    firsts: np.ndarray,
    cum: np.ndarray,
    positions: np.ndarray,
    segments: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]],
    eos: int,
    ignore: int,
    out: np.ndarray,
    rows: int,
    length: int,
    want_docs: bool,
) -> None:
    """Fill a batch's windows: window r (row r) is the stream's tokens firsts[r] ..
    firsts[r] + length (the last only a label), cut at the stream's end; position p of
    the stream holds its tokens cum[p] .. cum[p + 1] - 1. `segments[i]` is (tokens,
    sources, starts, doc_rows, offset) of position positions[i] (rising), whose stream
    begins at the position's token `offset`. Each window's part in each position is a
    piece, filled by `cut_pieces`."""
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
        if not isinstance(segment, tuple) or len(segment) != 5:
            raise TypeError(f"segment {i}: expected (tokens, sources, starts, doc_rows, offset)")
        _tokens(segment[0])  # every segment's buffers checked, as the compiled loop does
        for name, array in zip(("sources", "starts", "doc_rows"), segment[1:4], strict=True):
            _integers(name, array)
        _check_starts(_integers("starts", segment[2]))
        if int(segment[4]) < 0:
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
        tokens, sources, starts, doc_rows, offset = segments[at[owner]]
        mine = pieces[a:b].copy()
        mine[:, 2:] -= int(cum[owner]) + int(offset)  # into the segment's stream
        cut_pieces(tokens, sources, starts, doc_rows, mine, eos, ignore, out, rows, length,
                   want_docs)  # fmt: skip


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
