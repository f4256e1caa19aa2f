/* The compiled twin of slts.metadata.lmdb_store.frame_rows_python (see that function).
 *
 * `frame_rows(rows, sequence, key_bytes_max)` takes one table's rows of replicate_rows
 * and returns (puts, deletes): puts as (key, stored value) pairs, the stored value being
 * the 8-byte big-endian version and the value (LMDB's layout, lmdb_store), and the deleted
 * keys; or None as soon as a row is anything but plain (a key that is not exactly bytes,
 * empty, too long or not greater than the one before; a version that is not exactly
 * an int, or outside [1, sequence] for a put; a value that is neither exactly bytes nor
 * None), for the shared checks to say what is wrong. One loop in C instead of one in
 * Python: a restore loads every entry of a store through it.
 *
 * It keeps no Python object past the call; the pure-Python twin is the reference and
 * tests/metadata/test_rows_native.py runs both on the same inputs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define VERSION_BYTES 8

static PyObject *frame_rows(PyObject *module, PyObject *args)
{
    PyObject *rows;
    unsigned long long sequence;
    Py_ssize_t key_bytes_max;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!Kn:frame_rows", &PyList_Type, &rows, &sequence, &key_bytes_max)) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(rows);
    PyObject *puts = PyList_New(0);
    PyObject *deletes = PyList_New(0);
    if (puts == NULL || deletes == NULL) {
        goto error;
    }
    PyObject *previous = NULL; /* borrowed: the rows list holds it */
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        PyObject *key, *version, *value;
        if (PyTuple_CheckExact(row) && PyTuple_GET_SIZE(row) == 3) {
            key = PyTuple_GET_ITEM(row, 0);
            version = PyTuple_GET_ITEM(row, 1);
            value = PyTuple_GET_ITEM(row, 2);
        } else if (PyList_CheckExact(row) && PyList_GET_SIZE(row) == 3) {
            key = PyList_GET_ITEM(row, 0);
            version = PyList_GET_ITEM(row, 1);
            value = PyList_GET_ITEM(row, 2);
        } else {
            goto unusual;
        }
        if (!PyBytes_CheckExact(key) || PyBytes_GET_SIZE(key) < 1 || PyBytes_GET_SIZE(key) > key_bytes_max
            || !PyLong_CheckExact(version)) {
            goto unusual;
        }
        if (previous != NULL) { /* keys strictly ascending: sorted and distinct */
            Py_ssize_t before = PyBytes_GET_SIZE(previous), size = PyBytes_GET_SIZE(key);
            int order = memcmp(PyBytes_AS_STRING(previous), PyBytes_AS_STRING(key), (size_t)(before < size ? before : size));
            if (order > 0 || (order == 0 && before >= size)) {
                goto unusual;
            }
        }
        previous = key;
        if (value == Py_None) {
            if (PyList_Append(deletes, key) != 0) {
                goto error;
            }
            continue;
        }
        if (!PyBytes_CheckExact(value)) {
            goto unusual;
        }
        unsigned long long number = PyLong_AsUnsignedLongLong(version);
        if (number == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear(); /* negative, or beyond 64 bits: outside [1, sequence] */
            goto unusual;
        }
        if (number < 1 || number > sequence) {
            goto unusual;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(value);
        PyObject *stored = PyBytes_FromStringAndSize(NULL, VERSION_BYTES + size);
        if (stored == NULL) {
            goto error;
        }
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(stored);
        for (int b = VERSION_BYTES - 1; b >= 0; b--) {
            out[b] = (unsigned char)(number & 0xFF);
            number >>= 8;
        }
        memcpy(out + VERSION_BYTES, PyBytes_AS_STRING(value), (size_t)size);
        PyObject *pair = PyTuple_Pack(2, key, stored);
        Py_DECREF(stored);
        if (pair == NULL) {
            goto error;
        }
        int failed = PyList_Append(puts, pair);
        Py_DECREF(pair);
        if (failed) {
            goto error;
        }
    }
    PyObject *result = PyTuple_Pack(2, puts, deletes);
    Py_DECREF(puts);
    Py_DECREF(deletes);
    return result;
unusual:
    Py_DECREF(puts);
    Py_DECREF(deletes);
    Py_RETURN_NONE;
error:
    Py_XDECREF(puts);
    Py_XDECREF(deletes);
    return NULL;
}

static PyMethodDef methods[] = {
    {"frame_rows", frame_rows, METH_VARARGS,
     "frame_rows(rows, sequence, key_bytes_max) -> (puts, deletes) or None (see lmdb_store.frame_rows_python)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "slts.metadata._rows",
    .m_doc = "The compiled twin of slts.metadata.lmdb_store.frame_rows_python (optional; see it).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__rows(void)
{
    return PyModule_Create(&definition);
}
