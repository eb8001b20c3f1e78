/* The loops of packed token windows, compiled: a row group's packing and a batch's cut.
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
 * 64-bit indices; ANY_TOKEN: any integer kind that fits in int64, so not U64; SAME: the
 * first argument's kind). */
enum want { INDEX, ANY_TOKEN, SAME };
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
        else if (args[i].want == SAME && kinds[i] != kinds[0])
            wrong = "integers of the same width and sign as the first argument";
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

/* pack_documents(values, firsts, sizes, starts, out): document j, values[firsts[j]:][:sizes[j]],
 * copied to out[starts[j]:], for values and out of the same integer kind; the eos after
 * each document is written by the caller. */
static PyObject *pack_documents(PyObject *self, PyObject *args) {
    PyObject *o[5];
    Py_buffer v[5];
    enum kind kinds[5];
    static const struct arg spec[5] = {{"values", 0, ANY_TOKEN}, {"firsts", 0, INDEX},
                                       {"sizes", 0, INDEX}, {"starts", 0, INDEX}, {"out", 1, SAME}};
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4])) return NULL;
    if (get_all(o, v, kinds, spec, 5) < 0) return NULL;
    Py_ssize_t docs = v[2].len / 8, k = v[0].itemsize;
    int64_t *index = NULL; /* firsts, sizes, starts: one copy, read once */
    const char *values = v[0].buf;
    char *out = v[4].buf;
    if (v[1].len / 8 < docs || v[3].len / 8 < docs) {
        PyErr_SetString(PyExc_ValueError, "firsts and starts need an entry a document");
        goto fail;
    }
    if ((index = PyMem_Malloc((size_t)(docs > 0 ? docs : 1) * 3 * sizeof(int64_t))) == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    int64_t *firsts = index, *sizes = index + docs, *starts = index + 2 * docs;
    for (int i = 0; i < 3; i++)
        if (docs > 0) memcpy(index + i * docs, v[1 + i].buf, (size_t)docs * sizeof(int64_t));
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
        memmove(out + starts[j] * k, values + firsts[j] * k, (size_t)(sizes[j] * k));
    Py_END_ALLOW_THREADS
    PyMem_Free(index);
    release_all(v, 5);
    Py_RETURN_NONE;
fail:
    PyMem_Free(index);
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
    enum kind kinds[5];
    long long ignore;
    Py_ssize_t rows, length;
    int want_docs;
    static const struct arg spec[5] = {{"tokens", 0, ANY_TOKEN}, {"starts", 0, INDEX},
                                       {"doc_rows", 0, INDEX}, {"pieces", 0, INDEX},
                                       {"out", 1, INDEX}};
    if (!PyArg_ParseTuple(args, "OOOOLOnnp", &o[0], &o[1], &o[2], &o[3], &ignore, &o[4], &rows,
                          &length, &want_docs))
        return NULL;
    if (get_all(o, v, kinds, spec, 5) < 0) return NULL;
    enum kind kind = kinds[0];
    /* pieces: copied and checked with the GIL held. starts: checked, then read once a
     * value in the loop, which stays in bounds whatever another thread writes there
     * meanwhile (a copy of a row group's every start cost more than the cut). */
    int64_t *pieces = NULL;
    Py_ssize_t planes = want_docs ? 4 : 3, n_tokens = v[0].len / v[0].itemsize;
    Py_ssize_t n_starts = v[1].len / 8, n_rows = v[2].len / 8, n_pieces = v[3].len / 32;
    if (n_starts < 1) {
        PyErr_SetString(PyExc_ValueError, "starts is empty: a segment holds one document or more");
        goto fail;
    }
    if (rows < 0 || length < 1 || rows > v[4].len / 8 / planes / length) {
        PyErr_SetString(PyExc_ValueError, "out is smaller than [planes, rows, length]");
        goto fail;
    }
    const int64_t *starts = v[1].buf;
    for (Py_ssize_t j = 0; j < n_starts; j++) { /* the loop below walks documents in order */
        if (starts[j] < 0 || (j > 0 && starts[j] <= starts[j - 1])) {
            PyErr_SetString(PyExc_ValueError, "starts must rise from 0 or more");
            goto fail;
        }
    }
    if ((pieces = copy_of(&v[3], 4 * n_pieces)) == NULL) goto fail;
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
    const int64_t *doc_rows = v[2].buf; /* values only: a row read while written is no index */
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
        /* Each start read once, and what is made of it kept in bounds: checked above, it
         * is; changed since by another thread, the output is wrong but no write strays. */
        Py_ssize_t doc = document_of(starts, n_starts, a), lo = 0;
        doc = doc < 0 ? 0 : doc;
        while (lo < n) {
            int64_t next = doc < last ? starts[doc + 1] - a : (int64_t)n + 1;
            int ends_here = next > lo && next <= n; /* its eos is here */
            Py_ssize_t hi = ends_here ? (Py_ssize_t)next : n;
            for (Py_ssize_t i = lo; i < hi; i++) position[i] = i - lo;
            if (want_docs) {
                int64_t owner = doc < n_rows ? doc_rows[doc] : -1;
                for (Py_ssize_t i = lo; i < hi; i++) docs[row * length + column + i] = owner;
            }
            if (ends_here) label[hi - 1] = ignore;
            lo = hi;
            doc++;
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(pieces);
    release_all(v, 5);
    Py_RETURN_NONE;
fail:
    PyMem_Free(pieces);
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
