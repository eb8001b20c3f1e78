/* The loops of packed token windows, compiled: a batch's cut from its row groups' tokens.
 *
 * Why C: as NumPy calls, a batch's cut is dozens of small calls holding the GIL, which
 * cost more than the whole batch of a memmap loader; a JIT (Numba) would cost its LLVM's
 * memory in every process, against a memory budget. These loops touch each token once
 * and release the GIL. Arrays come through the buffer protocol, C-contiguous, native-order
 * integers of a checked format; every index is checked before the GIL is let go, and
 * what another thread may write meanwhile cannot move a read or write out of bounds (the
 * indices are copied, or read once and kept in bounds), so a bad argument raises, never
 * corrupts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Integer buffers of any width and sign are widened to int64 by one loop per type, so
 * that the compiler vectorises each. */
enum kind { I8, U8, I16, U16, I32, U32, I64, U64, NOT_INT };

static int native_little(void) {
    const uint16_t one = 1;
    return *(const char *)&one == 1;
}

/* The kind of an integer buffer, or NOT_INT with an error set naming the argument: a
 * format of one integer code (struct module syntax) in native byte order, whose item
 * size is 1, 2, 4 or 8. Objects (`O`), floats, records and empty items are refused:
 * their bytes are not integers, and an `O` buffer holds references. */
static enum kind kind_of(const Py_buffer *view, const char *name) {
    const char *f = view->format ? view->format : "B";
    char order = 0;
    if (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!') order = *f++;
    if (f[0] == '\0' || f[1] != '\0' || strchr("bBhHiIlLqQnN", f[0]) == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: expected a buffer of integers, got format '%s'", name,
                     view->format ? view->format : "B");
        return NOT_INT;
    }
    if (order == '!' || (order == '>' && native_little()) || (order == '<' && !native_little())) {
        PyErr_Format(PyExc_ValueError,
                     "%s: byte order '%c' is not this machine's: pass a native-order array "
                     "(numpy: .astype(a.dtype.newbyteorder('=')))",
                     name, order);
        return NOT_INT;
    }
    int is_signed = (*f >= 'a' && *f <= 'z');
    switch (view->itemsize) {
        case 1: return is_signed ? I8 : U8;
        case 2: return is_signed ? I16 : U16;
        case 4: return is_signed ? I32 : U32;
        case 8: return is_signed ? I64 : U64;
        default:
            PyErr_Format(PyExc_TypeError, "%s: integers of %zd bytes are not supported", name,
                         view->itemsize);
            return NOT_INT;
    }
}

#define WIDEN(type) \
    for (Py_ssize_t i = 0; i < count; i++) dst[i] = (int64_t)((const type *)src)[start + i]; \
    return;

static void widen(int64_t *dst, const char *src, enum kind kind, Py_ssize_t start, Py_ssize_t count) {
    switch (kind) {
        case I8: WIDEN(int8_t)
        case U8: WIDEN(uint8_t)
        case I16: WIDEN(int16_t)
        case U16: WIDEN(uint16_t)
        case I32: WIDEN(int32_t)
        case U32: WIDEN(uint32_t)
        default: WIDEN(int64_t)
    }
}

/* One argument: its name, whether it is written, and the kinds it may have (I64: signed
 * 64-bit indices; ANY_TOKEN: any integer kind that fits in int64, so not U64). */
enum want { INDEX, ANY_TOKEN };
struct arg { const char *name; int writable; enum want want; };

static void release_all(Py_buffer *views, int got) {
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
}

/* The buffers of `n` arguments, C-contiguous, each of a kind its `want` allows; or -1
 * with an error set (naming the argument) and none held. */
static int get_all(PyObject **objs, Py_buffer *views, enum kind *kinds, const struct arg *args,
                   int n) {
    for (int i = 0; i < n; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (args[i].writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[i], &views[i], flags) < 0) {
            PyObject *type, *value, *trace; /* the exporter's refusal, with the name */
            PyErr_Fetch(&type, &value, &trace);
            PyErr_NormalizeException(&type, &value, &trace);
            PyErr_Format(type, "%s: %S", args[i].name, value);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(trace);
            release_all(views, i);
            return -1;
        }
        kinds[i] = kind_of(&views[i], args[i].name);
        const char *wrong = NULL;
        if (kinds[i] == NOT_INT)
            wrong = "";
        else if (args[i].want == INDEX && kinds[i] != I64)
            wrong = "signed 64-bit integers (int64)";
        else if (args[i].want == ANY_TOKEN && kinds[i] == U64)
            wrong = "integers that fit in int64 (uint64 would wrap)";
        if (wrong != NULL) {
            if (*wrong)
                PyErr_Format(PyExc_TypeError, "%s: expected %s, got format '%s' (%zd-byte items)",
                             args[i].name, wrong, views[i].format, views[i].itemsize);
            release_all(views, i + 1);
            return -1;
        }
    }
    return 0;
}

/* A copy of an int64 buffer of `n` items, taken with the GIL held: the loops read the
 * copy, so another thread writing the argument while the GIL is let go cannot move an
 * index past the bounds checked. NULL with MemoryError set on failure. */
static int64_t *copy_of(const Py_buffer *view, Py_ssize_t n) {
    int64_t *copy = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (copy == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (n > 0) memcpy(copy, view->buf, (size_t)n * sizeof(int64_t));
    return copy;
}

/* The first j in [0, n) with starts[j] > a, less one: the document holding token a. */
static Py_ssize_t document_of(const int64_t *starts, Py_ssize_t n, int64_t a) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= a) lo = mid + 1; else hi = mid;
    }
    return lo - 1;
}

/* A segment's tokens: one integer buffer, or a list or tuple of them of one kind (a row
 * group decoded in record batches, whose documents each lie in one), read as their
 * concatenation: buffer c holds its tokens bases[c] .. bases[c + 1] - 1. */
struct tokens {
    Py_buffer *views;
    Py_ssize_t n; /* buffers held */
    const char **data;
    int64_t *bases;
    enum kind kind;
};

static void tokens_release(struct tokens *t) {
    release_all(t->views, (int)t->n);
    PyMem_Free(t->views);
    PyMem_Free(t->data);
    PyMem_Free(t->bases);
    memset(t, 0, sizeof *t);
}

/* The tokens of `obj` (a buffer, or a list or tuple of buffers), held until
 * tokens_release; or -1 with an error set naming `tokens` and none held. */
static int tokens_of(PyObject *obj, struct tokens *t) {
    static const struct arg spec[1] = {{"tokens", 0, ANY_TOKEN}};
    int many = PyList_Check(obj) || PyTuple_Check(obj);
    PyObject *items = many ? PySequence_Fast(obj, "tokens") : NULL;
    Py_ssize_t count = many ? (items ? PySequence_Fast_GET_SIZE(items) : -1) : 1;
    memset(t, 0, sizeof *t);
    if (count < 0) return -1;
    t->views = PyMem_Calloc((size_t)count + 1, sizeof(Py_buffer));
    t->data = PyMem_Calloc((size_t)count + 1, sizeof(char *));
    t->bases = PyMem_Calloc((size_t)count + 2, sizeof(int64_t));
    t->kind = I64; /* no buffer at all: no token to read */
    if (t->views == NULL || t->data == NULL || t->bases == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t c = 0; c < count; c++) {
        PyObject *item = many ? PySequence_Fast_GET_ITEM(items, c) : obj;
        enum kind kind;
        if (get_all(&item, &t->views[c], &kind, spec, 1) < 0) goto fail;
        t->n = c + 1;
        if (c > 0 && kind != t->kind) {
            PyErr_SetString(PyExc_TypeError, "tokens: its buffers must be of one integer kind");
            goto fail;
        }
        t->kind = kind;
        t->data[c] = t->views[c].buf;
        t->bases[c + 1] = t->bases[c] + t->views[c].len / t->views[c].itemsize;
    }
    Py_XDECREF(items);
    return 0;
fail:
    Py_XDECREF(items);
    tokens_release(t);
    return -1;
}

/* The buffer of `t` holding tokens from .. from + count - 1 (its index), or -1 where they
 * do not lie in one buffer. */
static Py_ssize_t buffer_of(const struct tokens *t, int64_t from, int64_t count) {
    Py_ssize_t c = document_of(t->bases, t->n, from); /* the last buffer starting at or before */
    if (c < 0 || count < 0 || count > t->bases[c + 1] - from) return -1;
    return c;
}

/* One segment as the cuts read it: its tokens as the row group decoded them (no eos
 * among them), and per document of its stream where its tokens begin in them (sources),
 * where it begins in the stream (starts, the stream's length last) and its row.
 * Document j spans stream tokens starts[j] .. starts[j + 1] - 1, the last its eos:
 * tokens sources[j] .. sources[j] + starts[j + 1] - starts[j] - 2, then eos. */
struct segment {
    struct tokens tokens;
    const int64_t *sources;
    Py_ssize_t n_sources;
    const int64_t *starts;
    Py_ssize_t n_starts;
    const int64_t *doc_rows;
    Py_ssize_t n_rows;
};

/* The segment of `tokens` and three buffers (sources, starts, doc_rows), checked: starts
 * rising from 0 or more (the fill walks documents in order); or -1 with an error set.
 * Starts and sources are then read once a value in the fill, which stays in bounds
 * whatever another thread writes there meanwhile (a copy of a row group's every start
 * cost more than the cut). */
static int segment_of(const struct tokens *tokens, const Py_buffer *v, struct segment *s) {
    s->tokens = *tokens;
    s->sources = v[0].buf;
    s->n_sources = v[0].len / 8;
    s->starts = v[1].buf;
    s->n_starts = v[1].len / 8;
    s->doc_rows = v[2].buf;
    s->n_rows = v[2].len / 8;
    if (s->n_starts < 1) {
        PyErr_SetString(PyExc_ValueError, "starts is empty: it holds the stream's length last");
        return -1;
    }
    for (Py_ssize_t j = 0; j < s->n_starts; j++) {
        if (s->starts[j] < 0 || (j > 0 && s->starts[j] <= s->starts[j - 1])) {
            PyErr_SetString(PyExc_ValueError, "starts must rise from 0 or more");
            return -1;
        }
    }
    return 0;
}

/* Whether piece (row, column, a, b) of segment `s` lies inside a batch of `rows` x
 * `length` and inside the segment's stream, its documents each with a row and their
 * tokens inside `tokens`. */
static int piece_fits(const struct segment *s, Py_ssize_t rows, Py_ssize_t length, int64_t row,
                      int64_t column, int64_t a, int64_t b) {
    if (row < 0 || row >= rows || column < 0 || column > length || a < 0 || b < a
        || b > s->starts[s->n_starts - 1])
        return 0;
    if (b == a) return 1;
    Py_ssize_t first = document_of(s->starts, s->n_starts, a);
    Py_ssize_t last = document_of(s->starts, s->n_starts, b - 1); /* < n_starts - 1: b fits */
    if (first < 0 || last >= s->n_rows || last >= s->n_sources) return 0;
    for (Py_ssize_t j = first; j <= last; j++) { /* its tokens (eos not counted) in one buffer */
        int64_t size = s->starts[j + 1] - s->starts[j] - 1, src = s->sources[j];
        if (size > 0 ? buffer_of(&s->tokens, src, size) < 0
                     : src < 0 || src > s->tokens.bases[s->tokens.n])
            return 0;
    }
    return 1;
}

/* Fill piece (row, column, a, b) of a batch from stream tokens a .. b - 1 of segment `s`,
 * checked by piece_fits. out is int64 [planes, rows, length]: input_ids, labels,
 * position_ids and (want_docs) the documents' rows. The token at column `length` is only
 * the last label. A piece begins a window or follows a segment's end, which is always an
 * eos, so positions restart at 0 with each piece. Runs without the GIL: each start and
 * source is read once and what is made of it kept in bounds (checked before, it is;
 * changed since by another thread, the output is wrong, ignore where it cannot be
 * read, but nothing is read or written out of bounds). */
static void fill_piece(const struct segment *s, int64_t *out, Py_ssize_t rows, Py_ssize_t length,
                       int want_docs, int64_t eos, int64_t ignore, Py_ssize_t row,
                       Py_ssize_t column, int64_t a, int64_t b) {
    Py_ssize_t cell = row * length + column, plane = rows * length;
    int64_t *id = out + cell, *label = id + plane, *position = label + plane;
    int64_t *owner = position + plane;
    Py_ssize_t n = b - a < length - column ? b - a : length - column; /* tokens placed */
    int next_here = b - a > n; /* the token after the last placed is in the piece */
    Py_ssize_t doc = document_of(s->starts, s->n_starts, a), i = 0;
    doc = doc < 0 ? 0 : doc;
    while (i < n && doc < s->n_starts - 1 && doc < s->n_sources) {
        int64_t d0 = s->starts[doc], d1 = s->starts[doc + 1], src = s->sources[doc];
        if (d0 < 0 || d0 > a + i || d1 <= a + i) break; /* starts changed since checked */
        if (src < 0 || src > s->tokens.bases[s->tokens.n]) break; /* so is `from` below */
        Py_ssize_t hi = d1 - a < n ? (Py_ssize_t)(d1 - a) : n; /* its part ends here */
        Py_ssize_t eos_at = (Py_ssize_t)(d1 - 1 - a);          /* >= i */
        Py_ssize_t own = (eos_at < hi ? eos_at : hi) - i;      /* its own tokens placed */
        int64_t from = src + (a + i - d0), reads = own + (hi == n && next_here && eos_at > n);
        Py_ssize_t c = reads > 0 ? buffer_of(&s->tokens, from, reads) : 0;
        if (c < 0) break;
        const char *data = s->tokens.data[c];
        from -= s->tokens.bases[c];
        widen(id + i, data, s->tokens.kind, from, own);
        if (eos_at < hi) id[eos_at] = eos;
        /* Each token's label is the next one; an eos's is ignore; the last placed one's
         * is the token after it where the piece holds one (its eos, or its own next). */
        if (hi - i > 1) memcpy(label + i, id + i + 1, (size_t)(hi - i - 1) * sizeof(int64_t));
        if (eos_at < hi)
            label[hi - 1] = ignore;
        else if (!next_here)
            label[hi - 1] = ignore;
        else if (eos_at == n)
            label[hi - 1] = eos;
        else
            widen(label + hi - 1, data, s->tokens.kind, from + own, 1);
        for (Py_ssize_t k = i; k < hi; k++) position[k] = k - i;
        if (want_docs) {
            int64_t who = doc < s->n_rows ? s->doc_rows[doc] : -1;
            for (Py_ssize_t k = i; k < hi; k++) owner[k] = who;
        }
        i = hi;
        doc++;
    }
    for (; i < n; i++) { /* only where starts or sources changed since they were checked */
        id[i] = label[i] = ignore;
        position[i] = 0;
        if (want_docs) owner[i] = -1;
    }
}

/* Whether out holds [planes, rows, length]; or 0 with an error set. */
static int out_fits(const Py_buffer *out, Py_ssize_t rows, Py_ssize_t length, int want_docs) {
    Py_ssize_t planes = want_docs ? 4 : 3;
    if (rows < 0 || length < 1 || rows > out->len / 8 / planes / length) {
        PyErr_SetString(PyExc_ValueError, "out is smaller than [planes, rows, length]");
        return 0;
    }
    return 1;
}

/* cut_pieces(tokens, sources, starts, doc_rows, pieces, eos, ignore, out, rows, length,
 * want_docs): fill each piece (row, column, a, b) of a batch from stream tokens a .. b - 1
 * of one segment (fill_piece). */
static PyObject *cut_pieces(PyObject *self, PyObject *args) {
    PyObject *given, *o[5];
    Py_buffer v[5];
    enum kind kinds[5];
    long long eos, ignore;
    Py_ssize_t rows, length;
    int want_docs;
    static const struct arg spec[5] = {{"sources", 0, INDEX}, {"starts", 0, INDEX},
                                       {"doc_rows", 0, INDEX}, {"pieces", 0, INDEX},
                                       {"out", 1, INDEX}};
    if (!PyArg_ParseTuple(args, "OOOOOLLOnnp", &given, &o[0], &o[1], &o[2], &o[3], &eos, &ignore,
                          &o[4], &rows, &length, &want_docs))
        return NULL;
    struct tokens tokens;
    if (tokens_of(given, &tokens) < 0) return NULL;
    if (get_all(o, v, kinds, spec, 5) < 0) {
        tokens_release(&tokens);
        return NULL;
    }
    PyObject *result = NULL;
    int64_t *pieces = NULL; /* copied and checked with the GIL held */
    struct segment s;
    Py_ssize_t n_pieces = v[3].len / 32;
    if (segment_of(&tokens, v, &s) < 0 || !out_fits(&v[4], rows, length, want_docs)) goto fail;
    if ((pieces = copy_of(&v[3], 4 * n_pieces)) == NULL) goto fail;
    for (Py_ssize_t p = 0; p < n_pieces; p++) { /* bounds, before the GIL is let go */
        const int64_t *q = pieces + 4 * p;
        if (!piece_fits(&s, rows, length, q[0], q[1], q[2], q[3])) {
            PyErr_Format(PyExc_IndexError, "piece %zd lies outside the batch or the segment", p);
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < n_pieces; p++) {
        const int64_t *q = pieces + 4 * p;
        fill_piece(&s, v[4].buf, rows, length, want_docs, eos, ignore, q[0], q[1], q[2], q[3]);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
fail: /* and done: what was taken is given back either way */
    PyMem_Free(pieces);
    release_all(v, 5);
    tokens_release(&tokens);
    return result;
}

/* The first j in [0, n) with cum[j] > at, less one: with cum an epoch's prefix sums of
 * stream tokens by position, the position that holds stream token `at`. */
#define position_of document_of

/* cut_windows(firsts, cum, positions, segments, eos, ignore, out, rows, length, want_docs):
 * a whole batch in one call. Window r (row r) is the stream's tokens firsts[r] ..
 * firsts[r] + length (the last only a label), cut at the end of the stream; the stream
 * is positions 0 .. len(cum) - 2, position p its tokens cum[p] .. cum[p + 1] - 1. The
 * segments given (a sequence of (tokens, sources, starts, doc_rows, offset), the segment
 * of position positions[i], rising, whose stream begins at the position's token
 * `offset`) hold every position a window touches. Each window's part in each position is a piece,
 * filled as cut_pieces fills one. Why one call: the same pieces found in NumPy cost more
 * than the copy. */
static PyObject *cut_windows(PyObject *self, PyObject *args) {
    PyObject *o[4], *given;
    Py_buffer v[4];
    enum kind kinds[4];
    long long eos, ignore;
    Py_ssize_t rows, length;
    int want_docs;
    static const struct arg spec[4] = {{"firsts", 0, INDEX}, {"cum", 0, INDEX},
                                       {"positions", 0, INDEX}, {"out", 1, INDEX}};
    if (!PyArg_ParseTuple(args, "OOOOLLOnnp", &o[0], &o[1], &o[2], &given, &eos, &ignore, &o[3],
                          &rows, &length, &want_docs))
        return NULL;
    if (get_all(o, v, kinds, spec, 4) < 0) return NULL;
    PyObject *items = NULL, *result = NULL;
    Py_buffer *views = NULL;
    struct tokens *tokens = NULL;
    struct segment *segs = NULL;
    int64_t *offsets = NULL, *found = NULL, *pieces = NULL; /* pieces: (segment, row, column, a, b) */
    Py_ssize_t n_segs = 0, held = 0, n_pieces = 0, room = 0;
    Py_ssize_t count = v[0].len / 8, n_cum = v[1].len / 8;
    if (!out_fits(&v[3], rows, length, want_docs)) goto fail;
    if (count > rows) {
        PyErr_SetString(PyExc_ValueError, "more windows than out has rows");
        goto fail;
    }
    if (n_cum < 2) {
        PyErr_SetString(PyExc_ValueError, "cum needs a position at least (two entries)");
        goto fail;
    }
    if ((items = PySequence_Fast(given, "segments: expected a sequence of (tokens, sources, "
                                        "starts, doc_rows, offset)")) == NULL)
        goto fail;
    n_segs = PySequence_Fast_GET_SIZE(items);
    if (n_segs != v[2].len / 8) {
        PyErr_Format(PyExc_ValueError, "%zd segments for %zd positions", n_segs, v[2].len / 8);
        goto fail;
    }
    /* Indices read once, with the GIL held: what another thread writes later moves nothing. */
    if ((found = copy_of(&v[2], n_segs)) == NULL) goto fail;
    offsets = PyMem_Calloc((size_t)(n_segs + 1), sizeof(int64_t));
    views = PyMem_Calloc((size_t)(3 * n_segs + 1), sizeof(Py_buffer));
    tokens = PyMem_Calloc((size_t)(n_segs + 1), sizeof(struct tokens));
    segs = PyMem_Calloc((size_t)(n_segs + 1), sizeof(struct segment));
    if (offsets == NULL || views == NULL || tokens == NULL || segs == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    static const struct arg seg_spec[3] = {{"sources", 0, INDEX}, {"starts", 0, INDEX},
                                           {"doc_rows", 0, INDEX}};
    for (Py_ssize_t i = 0; i < n_segs; i++) {
        PyObject *parts[3], *item = PySequence_Fast_GET_ITEM(items, i);
        enum kind seg_kinds[3];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5) {
            PyErr_Format(PyExc_TypeError, "segment %zd: expected (tokens, sources, starts, "
                         "doc_rows, offset)", i);
            goto fail;
        }
        for (int j = 0; j < 3; j++) parts[j] = PyTuple_GET_ITEM(item, j + 1);
        if (tokens_of(PyTuple_GET_ITEM(item, 0), &tokens[i]) < 0) goto fail;
        if (get_all(parts, views + 3 * i, seg_kinds, seg_spec, 3) < 0) {
            tokens_release(&tokens[i]);
            goto fail;
        }
        held = i + 1;
        offsets[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 4));
        if (offsets[i] == -1 && PyErr_Occurred()) goto fail;
        if (offsets[i] < 0 || (i > 0 && found[i] <= found[i - 1])) {
            PyErr_Format(PyExc_ValueError, "segment %zd: positions must rise and offsets be 0 "
                         "or more", i);
            goto fail;
        }
        if (segment_of(&tokens[i], views + 3 * i, &segs[i]) < 0) goto fail;
    }
    const int64_t *firsts = v[0].buf, *cum = v[1].buf;
    Py_ssize_t last_position = n_cum - 2;
    int64_t end = cum[n_cum - 1];
    for (Py_ssize_t r = 0; r < count; r++) { /* the pieces, checked, before the GIL is let go */
        int64_t lo = firsts[r], column = 0;
        if (lo < 0 || lo >= end) {
            PyErr_Format(PyExc_IndexError, "window %zd starts outside the stream", r);
            goto fail;
        }
        int64_t hi = lo <= end - length - 1 ? lo + length + 1 : end;
        Py_ssize_t position = position_of(cum, n_cum, lo);
        while (lo < hi) {
            if (position < 0 || position > last_position) {
                PyErr_Format(PyExc_IndexError, "window %zd lies outside the stream", r);
                goto fail;
            }
            int64_t base = cum[position], top = cum[position + 1];
            int64_t stop = top < hi ? top : hi;
            if (base < 0) { /* and so lo - base stays in range */
                PyErr_SetString(PyExc_ValueError, "cum must be 0 or more");
                goto fail;
            }
            if (stop > lo) { /* an empty position gives nothing: no segment needed */
                Py_ssize_t k = position_of(found, n_segs, position);
                if (k < 0 || found[k] != position) {
                    PyErr_Format(PyExc_KeyError, "no segment given for position %zd (window %zd)",
                                 position, r);
                    goto fail;
                }
                int64_t a = lo - base - offsets[k], b = stop - base - offsets[k];
                if (!piece_fits(&segs[k], rows, length, r, column, a, b)) {
                    PyErr_Format(PyExc_IndexError, "window %zd lies outside the segment of "
                                 "position %zd", r, position);
                    goto fail;
                }
                if (n_pieces == room) {
                    room = room ? 2 * room : 2 * count + 8;
                    int64_t *more = PyMem_Realloc(pieces, (size_t)room * 5 * sizeof(int64_t));
                    if (more == NULL) {
                        PyErr_NoMemory();
                        goto fail;
                    }
                    pieces = more;
                }
                int64_t *q = pieces + 5 * n_pieces++;
                q[0] = k, q[1] = r, q[2] = column, q[3] = a, q[4] = b;
                column += stop - lo;
                lo = stop;
            } else if (stop < lo) { /* cum falls here: not prefix sums */
                PyErr_SetString(PyExc_ValueError, "cum must not fall");
                goto fail;
            }
            position++;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < n_pieces; p++) {
        const int64_t *q = pieces + 5 * p;
        fill_piece(&segs[q[0]], v[3].buf, rows, length, want_docs, eos, ignore, q[1], q[2], q[3],
                   q[4]);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
fail: /* and done: what was taken is given back either way */
    PyMem_Free(pieces);
    PyMem_Free(found);
    PyMem_Free(offsets);
    PyMem_Free(segs);
    for (Py_ssize_t i = 0; i < held; i++) {
        release_all(views + 3 * i, 3);
        tokens_release(&tokens[i]);
    }
    PyMem_Free(tokens);
    PyMem_Free(views);
    Py_XDECREF(items);
    release_all(v, 4);
    return result;
}

static PyMethodDef methods[] = {
    {"cut_pieces", cut_pieces, METH_VARARGS,
     "cut_pieces(tokens, sources, starts, doc_rows, pieces, eos, ignore, out, rows, length, "
     "want_docs): fill a batch's pieces of one segment."},
    {"cut_windows", cut_windows, METH_VARARGS,
     "cut_windows(firsts, cum, positions, segments, eos, ignore, out, rows, length, "
     "want_docs): fill a batch's windows from the segments of the positions they touch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "loops", NULL, -1, methods};

PyMODINIT_FUNC PyInit_loops(void) { return PyModule_Create(&module); }
