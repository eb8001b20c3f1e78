/* The loops of packed token windows, compiled: a row group's packing and a batch's cut.
 *
 * Why C: as NumPy calls, a batch's cut is dozens of small calls holding the GIL, which
 * cost more than the whole batch of a memmap loader; a JIT (Numba) would cost its LLVM's
 * memory in every process, against a memory budget. These loops touch each token once
 * and release the GIL. Arrays come through the buffer protocol, C-contiguous; every
 * index is checked before the GIL is let go, so a bad argument raises, never corrupts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Integer buffers of any width and sign are widened to int64 by one loop per type, so
 * that the compiler vectorises each. */
enum kind { I8, U8, I16, U16, I32, U32, I64, NOT_INT };

static enum kind kind_of(const Py_buffer *view) {
    const char *f = view->format ? view->format : "B";
    while (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!') f++;
    if (f[0] == '\0' || f[1] != '\0' || strchr("bBhHiIlLqQnN", f[0]) == NULL) return NOT_INT;
    int is_signed = (*f >= 'a' && *f <= 'z');
    switch (view->itemsize) {
        case 1: return is_signed ? I8 : U8;
        case 2: return is_signed ? I16 : U16;
        case 4: return is_signed ? I32 : U32;
        case 8: return I64; /* uint64 token ids are refused before reading */
        default: return NOT_INT;
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

/* One argument's buffer: C-contiguous, `itemsize`-byte items (any if 0). */
struct arg { const char *name; int writable; Py_ssize_t itemsize; };

static void release_all(Py_buffer *views, int got) {
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
}

/* The buffers of `n` arguments, or -1 with an error set and none held. An itemsize of -1
 * means the first argument's. */
static int get_all(PyObject **objs, Py_buffer *views, const struct arg *args, int n) {
    for (int i = 0; i < n; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (args[i].writable ? PyBUF_WRITABLE : 0);
        Py_ssize_t want = args[i].itemsize < 0 ? views[0].itemsize : args[i].itemsize;
        if (PyObject_GetBuffer(objs[i], &views[i], flags) < 0) {
            release_all(views, i);
            return -1;
        }
        if (want && views[i].itemsize != want) {
            PyErr_Format(PyExc_TypeError, "%s: expected %zd-byte items, got %zd", args[i].name,
                         want, views[i].itemsize);
            release_all(views, i + 1);
            return -1;
        }
    }
    return 0;
}

/* pack_documents(values, firsts, sizes, starts, out): document j, values[firsts[j]:][:sizes[j]],
 * copied to out[starts[j]:], for values and out of the same item size; the eos after each
 * document is written by the caller. */
static PyObject *pack_documents(PyObject *self, PyObject *args) {
    PyObject *o[5];
    Py_buffer v[5];
    static const struct arg spec[5] = {
        {"values", 0, 0}, {"firsts", 0, 8}, {"sizes", 0, 8}, {"starts", 0, 8}, {"out", 1, -1}};
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    if (get_all(o, v, spec, 5) < 0) return NULL;
    Py_ssize_t docs = v[2].len / 8, k = v[0].itemsize;
    const int64_t *firsts = v[1].buf, *sizes = v[2].buf, *starts = v[3].buf;
    const char *values = v[0].buf;
    char *out = v[4].buf;
    if (v[1].len / 8 < docs || v[3].len / 8 < docs) {
        PyErr_SetString(PyExc_ValueError, "firsts and starts need an entry a document");
        goto fail;
    }
    Py_ssize_t n_values = v[0].len / k, n_out = v[4].len / k;
    for (Py_ssize_t j = 0; j < docs; j++) { /* bounds, before the GIL is let go */
        if (firsts[j] < 0 || sizes[j] < 0 || starts[j] < 0 || firsts[j] > n_values
            || sizes[j] > n_values - firsts[j] || starts[j] > n_out || sizes[j] > n_out - starts[j]) {
            PyErr_Format(PyExc_IndexError, "document %zd lies outside values or out", j);
            goto fail;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < docs; j++)
        memcpy(out + starts[j] * k, values + firsts[j] * k, (size_t)(sizes[j] * k));
    Py_END_ALLOW_THREADS
    release_all(v, 5);
    Py_RETURN_NONE;
fail:
    release_all(v, 5);
    return NULL;
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

/* cut_pieces(tokens, starts, doc_rows, pieces, ignore, out, want_docs): fill each piece
 * (row, column, a, b) of a batch from tokens[a:b] of one segment. out is int64
 * [planes, rows, length]: input_ids, labels, position_ids and (want_docs) the documents'
 * rows. Document j spans starts[j] .. starts[j + 1] - 1, its eos last (a piece's last
 * document may have no eos in it). The token at column `length` is only the last label.
 * A piece begins a window or follows a segment's end, which is always an eos, so
 * positions restart at 0 with each piece. */
static PyObject *cut_pieces(PyObject *self, PyObject *args) {
    PyObject *o[5];
    Py_buffer v[5];
    long long ignore;
    Py_ssize_t rows, length;
    int want_docs;
    static const struct arg spec[5] = {
        {"tokens", 0, 0}, {"starts", 0, 8}, {"doc_rows", 0, 8}, {"pieces", 0, 8}, {"out", 1, 8}};
    if (!PyArg_ParseTuple(args, "OOOOLOnnp", &o[0], &o[1], &o[2], &o[3], &ignore, &o[4], &rows,
                          &length, &want_docs))
        return NULL;
    if (get_all(o, v, spec, 5) < 0) return NULL;
    enum kind kind = kind_of(&v[0]);
    if (kind == NOT_INT) {
        PyErr_SetString(PyExc_TypeError, "tokens: not an integer buffer");
        goto fail;
    }
    Py_ssize_t planes = want_docs ? 4 : 3, n_tokens = v[0].len / v[0].itemsize;
    Py_ssize_t n_starts = v[1].len / 8, n_rows = v[2].len / 8, n_pieces = v[3].len / 32;
    if (n_starts < 1 || rows < 0 || length < 1 || rows > v[4].len / 8 / planes / length) {
        PyErr_SetString(PyExc_ValueError, "out is smaller than [planes, rows, length]");
        goto fail;
    }
    const int64_t *starts = v[1].buf, *doc_rows = v[2].buf, *pieces = v[3].buf;
    for (Py_ssize_t j = 0; j < n_starts; j++) { /* the loop below walks documents in order */
        if (starts[j] < 0 || (j > 0 && starts[j] <= starts[j - 1])) {
            PyErr_SetString(PyExc_ValueError, "starts must rise from 0 or more");
            goto fail;
        }
    }
    for (Py_ssize_t p = 0; p < n_pieces; p++) { /* bounds, before the GIL is let go */
        const int64_t *q = pieces + 4 * p;
        if (q[0] < 0 || q[0] >= rows || q[1] < 0 || q[1] > length || q[2] < 0 || q[3] < q[2]
            || q[3] > n_tokens || document_of(starts, n_starts, q[2]) < 0
            || document_of(starts, n_starts, q[3] - 1) >= n_rows) {
            PyErr_Format(PyExc_IndexError, "piece %zd lies outside the batch or the segment", p);
            goto fail;
        }
    }
    const char *tokens = v[0].buf;
    int64_t *ids = v[4].buf, *labels = ids + rows * length, *positions = labels + rows * length;
    int64_t *docs = positions + rows * length;
    Py_ssize_t last = n_starts - 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < n_pieces; p++) {
        const int64_t *q = pieces + 4 * p;
        Py_ssize_t row = q[0], column = q[1];
        int64_t a = q[2], b = q[3];
        Py_ssize_t n = b - a < length - column ? b - a : length - column; /* tokens placed */
        Py_ssize_t m = n < b - a - 1 ? n : b - a - 1; /* of which the next token is here */
        int64_t *id = ids + row * length + column, *label = labels + row * length + column;
        int64_t *position = positions + row * length + column;
        widen(id, tokens, kind, a, n);
        widen(label, tokens, kind, a + 1, m);
        if (n > 0 && m < n) label[n - 1] = ignore; /* the stream's end: only eos past it */
        Py_ssize_t doc = document_of(starts, n_starts, a), lo = 0;
        while (lo < n) {
            int ends_here = doc < last && starts[doc + 1] - a <= n; /* its eos is here */
            Py_ssize_t hi = ends_here ? starts[doc + 1] - a : n;
            for (Py_ssize_t i = lo; i < hi; i++) position[i] = i - lo;
            if (want_docs)
                for (Py_ssize_t i = lo; i < hi; i++) docs[row * length + column + i] = doc_rows[doc];
            if (ends_here) label[hi - 1] = ignore;
            lo = hi;
            doc++;
        }
    }
    Py_END_ALLOW_THREADS
    release_all(v, 5);
    Py_RETURN_NONE;
fail:
    release_all(v, 5);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_documents", pack_documents, METH_VARARGS,
     "pack_documents(values, firsts, sizes, starts, out): copy document j to out[starts[j]:]."},
    {"cut_pieces", cut_pieces, METH_VARARGS,
     "cut_pieces(tokens, starts, doc_rows, pieces, ignore, out, rows, length, want_docs): "
     "fill a batch's pieces of one segment."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "loops", NULL, -1, methods};

PyMODINIT_FUNC PyInit_loops(void) { return PyModule_Create(&module); }
