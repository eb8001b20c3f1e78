"""The loops of packed token windows in NumPy: what `iolib/text/loops.c` computes, used
where the compiled extension is absent (an install without a compiler) or
IOLIB_NO_EXTENSION=1 asks for it (`iolib.text.kernels` chooses once).

The same functions, arguments, results and errors as the compiled ones: batches are the
same bit for bit either way (tests/test_text_loops.py runs both against a plain Python
statement; tests/test_loops_fallback.py compares whole epochs). Slower: a handful of
NumPy calls a batch, holding the GIL, and temporaries of 8 bytes a token.
"""

from __future__ import annotations

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
