/* slts.buffers' compiled twin: a new bytes object filled in place (see slts/buffers.py).
 *
 * `filled_bytes(size, fill)` makes a bytes object of `size` bytes whose contents are not
 * set yet, hands `fill` a writable memoryview of exactly those bytes, releases the view when
 * `fill` returns, and returns the bytes. The bytes object is not seen by anyone before it is
 * returned (no hash computed, no reference handed out): writing it through the view is
 * filling a buffer that does not exist yet for any reader, as CPython's own bytes builders
 * do. `fill` must not keep the view or a view made from it. If `fill` raises, the bytes are
 * dropped and the error passes through.
 *
 * The pure-Python module is the reference and stays; this extension is optional (built where
 * a C compiler is at hand) and tests/storage/test_buffers.py runs both.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *filled_bytes(PyObject *module, PyObject *args)
{
    Py_ssize_t size;
    PyObject *fill;
    (void)module;
    if (!PyArg_ParseTuple(args, "nO:filled_bytes", &size, &fill)) {
        return NULL;
    }
    if (size < 0) {
        return PyErr_Format(PyExc_ValueError, "filled_bytes: size must be >= 0, got %zd", size);
    }
    if (!PyCallable_Check(fill)) {
        return PyErr_Format(PyExc_TypeError, "filled_bytes: fill must be callable");
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL) {
        return NULL;
    }
    PyObject *view = PyMemoryView_FromMemory(PyBytes_AS_STRING(result), size, PyBUF_WRITE);
    if (view == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    PyObject *done = PyObject_CallOneArg(fill, view);
    int kept = Py_REFCNT(view) != 1; /* fill kept the view itself: the bytes could change later */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback); /* fill's error, if any, survives the release */
    PyObject *released = PyObject_CallMethod(view, "release", NULL);
    Py_DECREF(view);
    if (done == NULL) {
        Py_XDECREF(released);
        PyErr_Restore(type, value, traceback);
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(done);
    if (released == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(released);
    if (kept) {
        Py_DECREF(result);
        return PyErr_Format(PyExc_RuntimeError, "filled_bytes: fill kept its view");
    }
    return result;
}

static PyMethodDef methods[] = {
    {"filled_bytes", filled_bytes, METH_VARARGS,
     "filled_bytes(size, fill) -> bytes: a new bytes object of size bytes, filled by fill(view)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "slts._buffers",
    .m_doc = "The compiled twin of slts.buffers (optional; see that module).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__buffers(void)
{
    return PyModule_Create(&definition);
}
