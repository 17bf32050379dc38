/* ``program.encode`` in C: a graph spec's rows made the records ``graph.c`` builds a graph from.
 *
 * A CPython extension (``_schedfuzz_encode``), built by the worker on first use against the
 * headers of the Python that runs it (``build.build_encoder``). It does what ``program.encode_rows``
 * does, field for field, and that function stays the oracle: the test suite compares the two on
 * drawn, captured and corpus specs. In Python each tensor cost about 3 us (a fresh 420-node
 * scenario's three graphs: 1.6 ms of the worker's 6 ms); here about a third of that, most of it
 * the parameters below.
 *
 * The parameters of the ops ``graph.c`` reads a shape or numbers for (``ops.RECORDED``) are still
 * read by Python (``program._op_record``), once per distinct (op, parameters): ``cache``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { WORDS = 38, REALS = 4, ARGS = 8, INTS = 8 };
enum { F_INPUT = 1, F_OUTPUT = 2, F_INPLACE = 4, F_NAME = 16 };

typedef struct {
    char *data;
    size_t len, cap;
} buf_t;

static int grow(buf_t *b, size_t n) {
    if (b->len + n <= b->cap) return 0;
    size_t want = b->cap ? b->cap : 4096;
    while (want < b->len + n) want *= 2;
    char *p = PyMem_Realloc(b->data, want);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = p;
    b->cap = want;
    return 0;
}

static int put(buf_t *b, const void *src, size_t n) {
    if (grow(b, n)) return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* a Python int as int64, or -1 with an error set */
static int as_i64(PyObject *o, int64_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) return -1;
    *out = (int64_t)v;
    return 0;
}

/* ``d[key]``, a Python int, into ``out``; KeyError as ``d[key]`` raises it */
static int lookup(PyObject *d, PyObject *key, int64_t *out) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (!v) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
        return -1;
    }
    return as_i64(v, out);
}

/* ``seq`` (a tuple or list of ints, ``max`` at most) into ``out``; its length into ``*n`` */
static int ints_of(PyObject *seq, int64_t *out, Py_ssize_t max, Py_ssize_t *n, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    if (k > max) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: %zd values, at most %zd", what, k, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (as_i64(PySequence_Fast_GET_ITEM(fast, i), &out[i])) {
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    *n = k;
    return 0;
}

/* the op's (ne, ints, reals) from ``cache``, or from ``fields(op, name, params)`` (then kept) */
static PyObject *op_fields(PyObject *cache, PyObject *fields, PyObject *op, PyObject *name, PyObject *params) {
    PyObject *key = PyTuple_Pack(2, op, params);
    if (!key) return NULL;
    PyObject *got = PyDict_GetItemWithError(cache, key);
    if (got) {
        Py_DECREF(key);
        Py_INCREF(got);
        return got;
    }
    if (PyErr_Occurred()) { /* an unhashable parameter: read it every time */
        PyErr_Clear();
        Py_DECREF(key);
        return PyObject_CallFunctionObjArgs(fields, op, name, params, NULL);
    }
    got = PyObject_CallFunctionObjArgs(fields, op, name, params, NULL);
    if (got && PyDict_SetItem(cache, key, got)) Py_CLEAR(got);
    Py_DECREF(key);
    return got;
}

/* encode_rows(rows, geometry_rows, roots, codes, types, op_flags, persistent, records_of, cache, fields)
 * -> (records, reals, names, words, roots, index, kept): see ``program.encode_rows`` */
static PyObject *encode_rows(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *rows, *geos, *roots, *codes, *types, *op_flags, *records_of, *cache, *fields;
    int persistent;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!O!pOO!O:encode_rows", &PyTuple_Type, &rows, &PyTuple_Type, &geos, &roots, &PyDict_Type, &codes,
                          &PyDict_Type, &types, &PyDict_Type, &op_flags, &persistent, &records_of, &PyDict_Type, &cache, &fields))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    if (PyTuple_GET_SIZE(geos) != n) return PyErr_Format(PyExc_ValueError, "%zd rows but %zd geometry rows", n, PyTuple_GET_SIZE(geos));
    buf_t rec = {0}, reals = {0}, names = {0}, words = {0}, rts = {0};
    PyObject *index = PyDict_New(), *kept = PyList_New(0), *out = NULL;
    PyObject *s_none = PyUnicode_InternFromString("none"), *s_weight = PyUnicode_InternFromString("weight"),
             *s_cache = PyUnicode_InternFromString("cache"), *s_inplace = PyUnicode_InternFromString("inplace"),
             *s_op_params = PyUnicode_InternFromString("op_params"), *s_leaf = PyUnicode_InternFromString("leaf"),
             *s_persistent = PyUnicode_InternFromString("persistent");
    int64_t op_leaf, op_persistent;
    if (!index || !kept || !s_none || !s_weight || !s_cache || !s_inplace || !s_op_params || !s_leaf || !s_persistent) goto done;
    if (lookup(codes, s_leaf, &op_leaf) || lookup(codes, s_persistent, &op_persistent)) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 9) {
            PyErr_Format(PyExc_ValueError, "row %zd is not a tensor's 9 fields", i);
            goto done;
        }
        PyObject *num = PyLong_FromSsize_t(i);
        if (!num || PyDict_SetItem(index, PyTuple_GET_ITEM(row, 0), num)) {
            Py_XDECREF(num);
            goto done;
        }
        Py_DECREF(num);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *row = PyTuple_GET_ITEM(rows, i), *geo = PyTuple_GET_ITEM(geos, i);
        PyObject *name = PyTuple_GET_ITEM(row, 0), *op_name = PyTuple_GET_ITEM(row, 1), *type_name = PyTuple_GET_ITEM(row, 2);
        PyObject *ne = PyTuple_GET_ITEM(row, 3), *srcs = PyTuple_GET_ITEM(row, 4), *params = PyTuple_GET_ITEM(row, 5);
        PyObject *role = PyTuple_GET_ITEM(row, 6), *output = PyTuple_GET_ITEM(row, 8);
        if (!PyTuple_Check(geo) || PyTuple_GET_SIZE(geo) != 6) {
            PyErr_Format(PyExc_ValueError, "geometry row %zd is not a tensor's 6 fields", i);
            goto done;
        }
        int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(geo, 0), name, Py_EQ);
        if (same < 0) goto done;
        if (!same) {
            PyErr_Format(PyExc_ValueError, "tensor %R: its geometry row is %R's (GraphSpec.geometry_rows out of order)", name, PyTuple_GET_ITEM(geo, 0));
            goto done;
        }
        int64_t r[WORDS];
        double real[REALS] = {0, 0, 0, 0};
        int64_t shape[4] = {1, 1, 1, 1}, ints[INTS] = {0}, args_[ARGS], flags = 0, op, ptr = (int64_t)names.len;
        Py_ssize_t ndims = 0;
        PyObject *w = NULL; /* borrowed: the op_params words */
        for (int k = 0; k < ARGS; k++) args_[k] = -1;
        int truthy = PyObject_IsTrue(output);
        if (truthy < 0) goto done;
        if (truthy && persistent) flags |= F_OUTPUT;
        int leaf = PyObject_RichCompareBool(op_name, s_none, Py_EQ);
        if (leaf < 0) goto done;
        if (leaf) {
            if (ints_of(ne, shape, 4, &ndims, "a leaf's shape")) goto done;
            int weight = PyObject_RichCompareBool(role, s_weight, Py_EQ), cache_ = weight ? 0 : PyObject_RichCompareBool(role, s_cache, Py_EQ);
            if (weight < 0 || cache_ < 0) goto done;
            if (persistent && (weight || cache_)) {
                op = op_persistent;
                ptr = 0;
                PyObject *num = PyLong_FromSsize_t(i);
                if (!num || PyList_Append(kept, num)) {
                    Py_XDECREF(num);
                    goto done;
                }
                Py_DECREF(num);
            } else {
                op = op_leaf;
                flags |= F_NAME | (persistent ? F_INPUT : 0);
            }
        } else {
            PyObject *code = PyDict_GetItemWithError(codes, op_name);
            if (!code && PyErr_Occurred()) goto done;
            if (code) {
                if (as_i64(code, &op)) goto done;
            } else {
                op = -1;
            }
            PyObject *f = PyDict_GetItemWithError(op_flags, op_name);
            if (!f && PyErr_Occurred()) goto done;
            int64_t of = F_NAME;
            if (f && as_i64(f, &of)) goto done;
            flags |= of;
            if (!PyTuple_Check(params)) {
                PyErr_Format(PyExc_ValueError, "tensor %R: its parameters are not a tuple of pairs", name);
                goto done;
            }
            PyObject *inplace = NULL;
            for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(params); k++) { /* as dict(params): the last of a key counts */
                PyObject *pair = PyTuple_GET_ITEM(params, k);
                if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
                    PyErr_Format(PyExc_ValueError, "tensor %R: parameter %zd is not a (key, value) pair", name, k);
                    goto done;
                }
                PyObject *key = PyTuple_GET_ITEM(pair, 0);
                int is = PyObject_RichCompareBool(key, s_inplace, Py_EQ);
                if (is < 0) goto done;
                if (is) {
                    inplace = PyTuple_GET_ITEM(pair, 1);
                    continue;
                }
                is = PyObject_RichCompareBool(key, s_op_params, Py_EQ);
                if (is < 0) goto done;
                if (is) w = PyTuple_GET_ITEM(pair, 1);
            }
            if (inplace) {
                truthy = PyObject_IsTrue(inplace);
                if (truthy < 0) goto done;
                if (truthy) flags |= F_INPLACE;
            }
            if (w == Py_None) w = NULL;
            int has = PySet_Contains(records_of, op_name);
            if (has < 0) goto done;
            if (has) {
                PyObject *got = op_fields(cache, fields, op_name, name, params);
                if (!got) goto done;
                Py_ssize_t k_ints = 0, k_reals = 0;
                int64_t ints_got[INTS];
                PyObject *reals_got = NULL;
                int bad = !PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 3 || ints_of(PyTuple_GET_ITEM(got, 0), shape, 4, &ndims, "an op's shape") ||
                          ints_of(PyTuple_GET_ITEM(got, 1), ints_got, INTS, &k_ints, "an op's integers");
                if (!bad) {
                    memcpy(ints, ints_got, (size_t)k_ints * sizeof ints[0]);
                    reals_got = PySequence_Fast(PyTuple_GET_ITEM(got, 2), "an op's reals");
                    bad = !reals_got || (k_reals = PySequence_Fast_GET_SIZE(reals_got)) > REALS;
                    for (Py_ssize_t k = 0; !bad && k < k_reals; k++) {
                        real[k] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(reals_got, k));
                        bad = real[k] == -1.0 && PyErr_Occurred();
                    }
                }
                Py_XDECREF(reals_got);
                Py_DECREF(got);
                if (bad) {
                    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "tensor %R: _op_record gave no (ne, ints, reals)", name);
                    goto done;
                }
                for (Py_ssize_t k = ndims; k < 4; k++) shape[k] = 1;
            }
            PyObject *fast = PySequence_Fast(srcs, "a tensor's sources");
            if (!fast) goto done;
            Py_ssize_t k_args = PySequence_Fast_GET_SIZE(fast);
            if (k_args > ARGS) {
                Py_DECREF(fast);
                PyErr_Format(PyExc_ValueError, "tensor %R: %zd sources, at most %d", name, k_args, ARGS);
                goto done;
            }
            for (Py_ssize_t k = 0; k < k_args; k++) {
                PyObject *a = PySequence_Fast_GET_ITEM(fast, k);
                if (a != Py_None && lookup(index, a, &args_[k])) {
                    Py_DECREF(fast);
                    goto done;
                }
            }
            Py_DECREF(fast);
        }
        if (flags & F_NAME) {
            Py_ssize_t k;
            const char *utf8 = PyUnicode_AsUTF8AndSize(name, &k);
            if (!utf8 || put(&names, utf8, (size_t)k + 1)) goto done; /* with its NUL */
        }
        int64_t geo_ne[4], geo_nb[4], view = -1, view_offs;
        Py_ssize_t k4;
        PyObject *view_src = PyTuple_GET_ITEM(geo, 4);
        int64_t type_code, geo_type;
        if (lookup(types, type_name, &type_code) || lookup(types, PyTuple_GET_ITEM(geo, 1), &geo_type) ||
            ints_of(PyTuple_GET_ITEM(geo, 2), geo_ne, 4, &k4, "a geometry's ne") || k4 != 4 ||
            ints_of(PyTuple_GET_ITEM(geo, 3), geo_nb, 4, &k4, "a geometry's nb") || k4 != 4 ||
            (view_src != Py_None && lookup(index, view_src, &view)) || as_i64(PyTuple_GET_ITEM(geo, 5), &view_offs)) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "tensor %R: a geometry's ne and nb have four values", name);
            goto done;
        }
        int64_t n_words = 0, at_words = -1;
        if (w) {
            PyObject *fast = PySequence_Fast(w, "op_params");
            if (!fast) goto done;
            n_words = PySequence_Fast_GET_SIZE(fast);
            at_words = (int64_t)(words.len / sizeof(int32_t));
            for (Py_ssize_t k = 0; k < n_words; k++) {
                int64_t v;
                if (as_i64(PySequence_Fast_GET_ITEM(fast, k), &v)) {
                    Py_DECREF(fast);
                    goto done;
                }
                int32_t v32 = (int32_t)v;
                if ((int64_t)v32 != v) {
                    Py_DECREF(fast);
                    PyErr_Format(PyExc_OverflowError, "tensor %R: op_params word %zd does not fit 32 bits", name, k);
                    goto done;
                }
                if (put(&words, &v32, sizeof v32)) {
                    Py_DECREF(fast);
                    goto done;
                }
            }
            Py_DECREF(fast);
        }
        int64_t *p = r;
        *p++ = op;
        *p++ = type_code;
        *p++ = ndims ? ndims : 1;
        for (int k = 0; k < 4; k++) *p++ = shape[k];
        for (int k = 0; k < ARGS; k++) *p++ = args_[k];
        *p++ = flags;
        for (int k = 0; k < INTS; k++) *p++ = ints[k];
        *p++ = ptr;
        *p++ = at_words;
        *p++ = n_words;
        *p++ = geo_type;
        for (int k = 0; k < 4; k++) *p++ = geo_ne[k];
        for (int k = 0; k < 4; k++) *p++ = geo_nb[k];
        *p++ = view;
        *p++ = view_offs;
        if (put(&rec, r, sizeof r) || put(&reals, real, sizeof real)) goto done;
    }
    {
        PyObject *fast = PySequence_Fast(roots, "the roots");
        if (!fast) goto done;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast); k++) {
            int64_t at;
            if (lookup(index, PySequence_Fast_GET_ITEM(fast, k), &at)) {
                Py_DECREF(fast);
                goto done;
            }
            int32_t at32 = (int32_t)at;
            if (put(&rts, &at32, sizeof at32)) {
                Py_DECREF(fast);
                goto done;
            }
        }
        Py_DECREF(fast);
    }
    if (!words.len) { /* as array("i", words or [0]) */
        int32_t zero = 0;
        if (put(&words, &zero, sizeof zero)) goto done;
    }
    out = Py_BuildValue("(y#y#y#y#y#OO)", rec.data ? rec.data : "", (Py_ssize_t)rec.len, reals.data ? reals.data : "", (Py_ssize_t)reals.len,
                        names.data ? names.data : "", (Py_ssize_t)names.len, words.data, (Py_ssize_t)words.len, rts.data ? rts.data : "",
                        (Py_ssize_t)rts.len, index, kept);
done:
    PyMem_Free(rec.data);
    PyMem_Free(reals.data);
    PyMem_Free(names.data);
    PyMem_Free(words.data);
    PyMem_Free(rts.data);
    Py_XDECREF(index);
    Py_XDECREF(kept);
    Py_XDECREF(s_none);
    Py_XDECREF(s_weight);
    Py_XDECREF(s_cache);
    Py_XDECREF(s_inplace);
    Py_XDECREF(s_op_params);
    Py_XDECREF(s_leaf);
    Py_XDECREF(s_persistent);
    return out;
}

static PyMethodDef methods[] = {
    {"encode_rows", encode_rows, METH_VARARGS, "A graph spec's rows as graph.c's records (program.encode_rows, in C)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_schedfuzz_encode", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__schedfuzz_encode(void) { return PyModule_Create(&module); }
