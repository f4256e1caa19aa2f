/* The hot loops of slts.offload.framing and slts.offload.pending, compiled: the walk over a block's entry frames
 * ([length i32][entry id i64][payload], big-endian), and the payloads of a run handed out
 * as `Payload` objects: read-only, zero-copy views of the bytes read, made for the cost of
 * a small object each (a memoryview slice costs several times more and is tracked by the
 * garbage collector, which scans it in every collection that reaches it); and the streaming
 * block an offer frames its entry into (`Block`), a step per entry with no Python work.
 *
 * The pure-Python module is the reference and stays: this extension is optional (built
 * when a C compiler is at hand, `framing.NATIVE` says whether it is in use) and must
 * answer exactly as the Python code does; tests/offload/test_framing.py runs every case
 * through both. Nothing here keeps a reference or a pointer past the call that got it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define HEADER_BYTES 12

/* Outcomes of walk (framing.WALK_*). */
#define WALK_DONE 0    /* the entries end: count reached, the fill pattern or the block's end */
#define WALK_MORE 1    /* the next frame lies (partly) past the bytes at hand */
#define WALK_DAMAGED 2 /* the frame at the position has another id or ends past the block */

static inline int64_t load_be(const unsigned char *p, int width)
{
    uint64_t value = 0;
    for (int i = 0; i < width; i++) {
        value = (value << 8) | p[i];
    }
    if (width == 4) {
        return (int64_t)(int32_t)(uint32_t)value;
    }
    return (int64_t)value;
}

/* A growable table of int64 quintuples (first id, count, start, stride, length). */
typedef struct {
    int64_t *items;
    Py_ssize_t used; /* int64 items, a multiple of 5 */
    Py_ssize_t size;
} RunTable;

static int runs_add(RunTable *t, int64_t first, int64_t start, int64_t stride, int64_t length)
{
    if (t->used) { /* a frame of the last run's length right after it extends that run */
        int64_t *last = t->items + t->used - 5;
        if (last[4] == length && last[3] == stride && last[2] + last[1] * stride == start) {
            last[1] += 1;
            return 0;
        }
    }
    if (t->used + 5 > t->size) {
        Py_ssize_t size = t->size ? t->size * 2 : 80;
        int64_t *items = PyMem_Realloc(t->items, (size_t)size * sizeof(int64_t));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->items = items;
        t->size = size;
    }
    int64_t *row = t->items + t->used;
    row[0] = first;
    row[1] = 1;
    row[2] = start;
    row[3] = stride;
    row[4] = length;
    t->used += 5;
    return 0;
}

PyDoc_STRVAR(walk_doc,
"walk(buffer, position, limit, block_end, first, remaining) -> (runs, found, position, outcome)\n\n"
"Walk the frames of one block from `position`, ids from `first`, at most `remaining` of\n"
"them (-1: no bound), reading below `limit` (<= block_end) only. `runs`: bytes of native\n"
"int64 quintuples (first id, count, payload start, stride, payload length), one per run\n"
"of frames of one length; `found`: the frames walked; `position`: after the last one;\n"
"`outcome`: WALK_DONE, WALK_MORE or WALK_DAMAGED (the frame at `position`).");

static PyObject *walk(PyObject *module, PyObject *args)
{
    (void)module;
    Py_buffer view;
    Py_ssize_t position, limit, block_end;
    long long first, remaining;
    if (!PyArg_ParseTuple(args, "y*nnnLL:walk", &view, &position, &limit, &block_end, &first, &remaining)) {
        return NULL;
    }
    /* A position past `limit` (a block that ends before it) walks nothing, as in Python. */
    if (position < 0 || limit > view.len || limit > block_end) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "walk: position %zd, limit %zd, block end %zd, buffer %zd",
                            position, limit, block_end, view.len);
    }
    const unsigned char *bytes = view.buf;
    RunTable table = {NULL, 0, 0};
    int64_t expected = first;
    int past_max = 0; /* an entry id 2**63-1 was walked: no id can follow it */
    int outcome = WALK_DONE;
    while (remaining != 0) {
        if (position + HEADER_BYTES > limit) {
            if (limit < block_end && position + HEADER_BYTES <= block_end) {
                outcome = WALK_MORE; /* the header is in the next bytes */
            }
            break;
        }
        int64_t length = load_be(bytes + position, 4);
        int64_t entry_id = load_be(bytes + position + 4, 8);
        if (length < 0) {
            break; /* the fill pattern */
        }
        int64_t end = (int64_t)position + HEADER_BYTES + length;
        if (entry_id != expected || past_max || end > block_end) {
            outcome = WALK_DAMAGED;
            break;
        }
        if (end > limit) {
            outcome = WALK_MORE;
            break;
        }
        if (runs_add(&table, expected, position + HEADER_BYTES, HEADER_BYTES + length, length) < 0) {
            PyMem_Free(table.items);
            PyBuffer_Release(&view);
            return NULL;
        }
        position = (Py_ssize_t)end;
        if (expected == INT64_MAX) {
            past_max = 1;
        } else {
            expected += 1;
        }
        if (remaining > 0) {
            remaining -= 1;
        }
    }
    PyBuffer_Release(&view);
    PyObject *runs = PyBytes_FromStringAndSize((const char *)table.items, table.used * (Py_ssize_t)sizeof(int64_t));
    PyMem_Free(table.items);
    if (runs == NULL) {
        return NULL;
    }
    return Py_BuildValue("NLni", runs, (long long)(expected - first + past_max), position, outcome);
}

/* -- Payload: a read-only view of `length` bytes at `data`, inside a Span ------------------- */

/* The buffer of one object that payloads are cut from, held (and so the object, and what it
 * maps) until the last payload cut from it is gone. */
typedef struct {
    PyObject_HEAD
    Py_buffer view;
} Span;

static void span_dealloc(Span *self)
{
    PyBuffer_Release(&self->view);
    PyObject_Free(self);
}

static PyTypeObject SpanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "slts.offload._framing.Span",
    .tp_basicsize = sizeof(Span),
    .tp_dealloc = (destructor)span_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The buffer payloads are cut from (internal).",
};

/* Not tracked by the garbage collector: a payload refers to its span only, and a span to
 * the buffer's exporter, which never refers back to a payload: no cycle can pass through. */
typedef struct {
    PyObject_HEAD
    Span *span;
    const char *data;
    Py_ssize_t length;
    Py_hash_t hash; /* -1 until asked for */
} Payload;

static void payload_dealloc(Payload *self)
{
    Py_DECREF(self->span);
    PyObject_Free(self);
}

static PyObject *payload_bytes(Payload *self, PyObject *unused)
{
    (void)unused;
    return PyBytes_FromStringAndSize(self->data, self->length);
}

static int payload_getbuffer(Payload *self, Py_buffer *view, int flags)
{
    /* Fails (BufferError) for a writable request: the bytes are read-only. */
    return PyBuffer_FillInfo(view, (PyObject *)self, (void *)self->data, self->length, 1, flags);
}

static Py_ssize_t payload_length(Payload *self)
{
    return self->length;
}

static PyObject *payload_subscript(Payload *self, PyObject *key)
{
    /* An item or a slice, as of the bytes (a slice is a bytes copy). */
    PyObject *copy = payload_bytes(self, NULL);
    if (copy == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_GetItem(copy, key);
    Py_DECREF(copy);
    return result;
}

static PyObject *payload_richcompare(Payload *self, PyObject *other, int op)
{
    /* Equal to any bytes-like object of the same bytes (as bytes and memoryview are). */
    if ((op != Py_EQ && op != Py_NE) || !PyObject_CheckBuffer(other)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    Py_buffer theirs;
    if (PyObject_GetBuffer(other, &theirs, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int equal = theirs.len == self->length && memcmp(theirs.buf, self->data, (size_t)self->length) == 0;
    PyBuffer_Release(&theirs);
    return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static Py_hash_t payload_hash(Payload *self)
{
    /* The hash of the bytes it holds, so that a payload and its bytes are one dict key. */
    if (self->hash == -1) {
        PyObject *copy = payload_bytes(self, NULL);
        if (copy == NULL) {
            return -1;
        }
        self->hash = PyObject_Hash(copy);
        Py_DECREF(copy);
    }
    return self->hash;
}

static PyObject *payload_repr(Payload *self)
{
    PyObject *copy = payload_bytes(self, NULL);
    if (copy == NULL) {
        return NULL;
    }
    PyObject *repr = PyUnicode_FromFormat("Payload(%R)", copy);
    Py_DECREF(copy);
    return repr;
}

static PyObject *payload_reduce(Payload *self, PyObject *unused)
{
    /* Pickled (and copied by the copy module) as the bytes it holds. */
    (void)unused;
    return Py_BuildValue("(O(N))", (PyObject *)&PyBytes_Type, payload_bytes(self, NULL));
}

static PyMethodDef payload_methods[] = {
    {"tobytes", (PyCFunction)payload_bytes, METH_NOARGS, "The payload as a bytes object (a copy)."},
    {"__bytes__", (PyCFunction)payload_bytes, METH_NOARGS, "The payload as a bytes object (a copy)."},
    {"__reduce__", (PyCFunction)payload_reduce, METH_NOARGS, "Pickled as its bytes."},
    {NULL, NULL, 0, NULL},
};

static PyBufferProcs payload_as_buffer = {.bf_getbuffer = (getbufferproc)payload_getbuffer};
static PySequenceMethods payload_as_sequence = {.sq_length = (lenfunc)payload_length};
static PyMappingMethods payload_as_mapping = {
    .mp_length = (lenfunc)payload_length,
    .mp_subscript = (binaryfunc)payload_subscript,
};

static PyTypeObject PayloadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "slts.offload._framing.Payload",
    .tp_basicsize = sizeof(Payload),
    .tp_dealloc = (destructor)payload_dealloc,
    .tp_repr = (reprfunc)payload_repr,
    .tp_as_sequence = &payload_as_sequence,
    .tp_as_mapping = &payload_as_mapping,
    .tp_hash = (hashfunc)payload_hash,
    .tp_as_buffer = &payload_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An entry's payload: a read-only, zero-copy view of the bytes it was read with.\n\n"
              "Bytes-like (the buffer protocol: bytes(), memoryview(), join, write, hashing),\n"
              "len(), items and slices (as bytes), equal to and hashed as the bytes it holds,\n"
              "pickled as bytes. It keeps what it was cut from alive; bytes(payload) keeps the\n"
              "payload alone.",
    .tp_richcompare = (richcmpfunc)payload_richcompare,
    .tp_methods = payload_methods,
};

PyDoc_STRVAR(views_doc,
"views(buffer, at, stride, length, count, out) -> None\n\n"
"Append to the list `out` `count` Payloads of `length` bytes each, at `at`, `at + stride`,\n"
"... of `buffer` (ValueError if they do not all lie in it). They share one hold on\n"
"`buffer`'s bytes, released with the last of them.");

static PyObject *views(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *source, *out;
    Py_ssize_t at, stride, length, count;
    if (!PyArg_ParseTuple(args, "OnnnnO!:views", &source, &at, &stride, &length, &count, &PyList_Type, &out)) {
        return NULL;
    }
    Span *span = PyObject_New(Span, &SpanType);
    if (span == NULL) {
        return NULL;
    }
    span->view.obj = NULL; /* released by span_dealloc only once held */
    if (PyObject_GetBuffer(source, &span->view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(span);
        return NULL;
    }
    if (at < 0 || stride < length || length < 0 || count < 0
        || (count && at + (count - 1) * stride + length > span->view.len)) {
        PyErr_Format(PyExc_ValueError, "views: %zd payloads of %zd bytes every %zd from %zd of %zd",
                     count, length, stride, at, span->view.len);
        Py_DECREF(span);
        return NULL;
    }
    const char *bytes = span->view.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        Payload *payload = PyObject_New(Payload, &PayloadType);
        if (payload == NULL) {
            Py_DECREF(span);
            return NULL;
        }
        Py_INCREF(span);
        payload->span = span;
        payload->data = bytes + at + i * stride;
        payload->length = length;
        payload->hash = -1;
        int appended = PyList_Append(out, (PyObject *)payload);
        Py_DECREF(payload);
        if (appended < 0) {
            Py_DECREF(span);
            return NULL;
        }
    }
    Py_DECREF(span);
    Py_RETURN_NONE;
}

/* -- Block: a streaming block filled as its entries are offered ------------------------------ */

#define BLOCK_HEADER_BYTES 128

/* One ledger's consecutive entries, framed straight into the bytes object that is written:
 * room for the block's header, then the frames; `finish` writes the header and the fill
 * pattern and hands the object out (once: it is never changed after). Not tracked by the
 * garbage collector: it refers to its own bytes object only. */
typedef struct {
    PyObject_HEAD
    PyObject *data; /* the block's bytes, being filled; NULL once finished */
    long long ledger_id, first, last, count, payload, used;
} Block;

static inline void store_be(unsigned char *p, uint64_t value, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        p[i] = (unsigned char)(value & 0xff);
        value >>= 8;
    }
}

static void block_frame(Block *self, long long entry_id, PyObject *data)
{
    unsigned char *at = (unsigned char *)PyBytes_AS_STRING(self->data) + self->used;
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    store_be(at, (uint64_t)(uint32_t)size, 4);
    store_be(at + 4, (uint64_t)entry_id, 8);
    memcpy(at + HEADER_BYTES, PyBytes_AS_STRING(data), (size_t)size);
    self->used += HEADER_BYTES + size;
    self->payload += size;
    self->last = entry_id;
    self->count += 1;
}

static PyTypeObject BlockType;

/* Ask for huge pages for a block's bytes (Linux, where transparent huge pages are on
 * "madvise"): a 5 MiB block filled entry by entry then takes a few page faults, not 1,280
 * (the faults of fresh memory were most of an offer's cost). A hint: failures are ignored. */
static void block_huge_pages(PyObject *data)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t start = (uintptr_t)PyBytes_AS_STRING(data);
    uintptr_t end = start + (uintptr_t)PyBytes_GET_SIZE(data);
    uintptr_t first = (start + huge - 1) & ~(huge - 1);
    uintptr_t last = end & ~(huge - 1);
    if (last > first) {
        (void)madvise((void *)first, (size_t)(last - first), MADV_HUGEPAGE);
    }
#else
    (void)data;
#endif
}

/* A new block beginning with entry `first` of `ledger_id` (its bytes object reserved at
 * once: `block_bytes`, or more for a first entry larger than that). */
static Block *block_create(long long ledger_id, long long first, PyObject *data, Py_ssize_t block_bytes)
{
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    if (ledger_id < 0 || first < 0 || size > INT32_MAX || block_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "Block: ledger %lld, entry %lld, %zd bytes, blocks of %zd", ledger_id,
                     first, size, block_bytes);
        return NULL;
    }
    Py_ssize_t used = BLOCK_HEADER_BYTES + HEADER_BYTES + size;
    Block *self = (Block *)BlockType.tp_alloc(&BlockType, 0);
    if (self == NULL) {
        return NULL;
    }
    self->data = PyBytes_FromStringAndSize(NULL, used > block_bytes ? used : block_bytes);
    if (self->data == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    block_huge_pages(self->data);
    self->ledger_id = ledger_id;
    self->first = first;
    self->last = first - 1;
    self->count = 0;
    self->payload = 0;
    self->used = BLOCK_HEADER_BYTES;
    block_frame(self, first, data);
    return self;
}

/* Frame the entry into the block if it is the next of the block's ledger and fits in
 * `block_bytes` (and in the bytes reserved): 1 if taken, else 0. */
static int block_take(Block *self, long long ledger_id, long long entry_id, PyObject *data, Py_ssize_t block_bytes)
{
    long long used = self->used + HEADER_BYTES + PyBytes_GET_SIZE(data);
    if (ledger_id != self->ledger_id || entry_id - 1 != self->last || used > block_bytes
        || used > PyBytes_GET_SIZE(self->data)) {
        return 0;
    }
    block_frame(self, entry_id, data);
    return 1;
}

static PyObject *block_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    (void)type;
    long long ledger_id, first;
    PyObject *data;
    Py_ssize_t block_bytes;
    static char *names[] = {"ledger_id", "first", "data", "block_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "LLSn:Block", names, &ledger_id, &first, &data, &block_bytes)) {
        return NULL;
    }
    return (PyObject *)block_create(ledger_id, first, data, block_bytes);
}

static void block_dealloc(Block *self)
{
    Py_XDECREF(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *block_add(Block *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        return PyErr_Format(PyExc_TypeError, "add takes 4 arguments, got %zd", nargs);
    }
    long long ledger_id = PyLong_AsLongLong(args[0]);
    long long entry_id = PyLong_AsLongLong(args[1]);
    Py_ssize_t block_bytes = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (!PyBytes_Check(args[2])) {
        return PyErr_Format(PyExc_TypeError, "add: an entry is bytes, not %s", Py_TYPE(args[2])->tp_name);
    }
    if (self->data == NULL) {
        return PyErr_Format(PyExc_ValueError, "add: the block is finished");
    }
    return PyBool_FromLong(block_take(self, ledger_id, entry_id, args[2], block_bytes));
}

static PyObject *block_finish(Block *self, PyObject *args)
{
    PyObject *header, *fill;
    if (!PyArg_ParseTuple(args, "SS:finish", &header, &fill)) {
        return NULL;
    }
    if (self->data == NULL) {
        return PyErr_Format(PyExc_ValueError, "finish: the block is finished");
    }
    if (PyBytes_GET_SIZE(header) != BLOCK_HEADER_BYTES) {
        return PyErr_Format(PyExc_ValueError, "finish: a header of %zd bytes, not %d",
                            PyBytes_GET_SIZE(header), BLOCK_HEADER_BYTES);
    }
    Py_ssize_t size = (Py_ssize_t)self->used + PyBytes_GET_SIZE(fill);
    if (size != PyBytes_GET_SIZE(self->data) && _PyBytes_Resize(&self->data, size) < 0) {
        return NULL; /* self->data is NULL now: the block is gone */
    }
    char *bytes = PyBytes_AS_STRING(self->data);
    memcpy(bytes, PyBytes_AS_STRING(header), BLOCK_HEADER_BYTES);
    memcpy(bytes + self->used, PyBytes_AS_STRING(fill), (size_t)PyBytes_GET_SIZE(fill));
    PyObject *data = self->data;
    self->data = NULL;
    return data;
}

static PyMethodDef block_methods[] = {
    {"add", (PyCFunction)(void (*)(void))block_add, METH_FASTCALL,
     "add(ledger_id, entry_id, data, block_bytes) -> bool: frame the entry in if it is the next of the\n"
     "block's ledger and fits in block_bytes."},
    {"finish", (PyCFunction)block_finish, METH_VARARGS,
     "finish(header, fill) -> bytes: the block's bytes: its 128-byte header, the frames, the fill;\n"
     "once."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef block_members[] = {
    {"ledger_id", T_LONGLONG, offsetof(Block, ledger_id), READONLY, "The block's ledger."},
    {"first", T_LONGLONG, offsetof(Block, first), READONLY, "Its first entry id."},
    {"last", T_LONGLONG, offsetof(Block, last), READONLY, "Its last entry id."},
    {"count", T_LONGLONG, offsetof(Block, count), READONLY, "Its entries."},
    {"payload", T_LONGLONG, offsetof(Block, payload), READONLY, "Its entries' payload bytes."},
    {"used", T_LONGLONG, offsetof(Block, used), READONLY, "Header and frames so far, bytes."},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "slts.offload._framing.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = (destructor)block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Block(ledger_id, first, data, block_bytes): a streaming block being filled\n"
              "(slts.offload.pending.PendingBlock's compiled twin).",
    .tp_methods = block_methods,
    .tp_members = block_members,
    .tp_new = block_new,
};

/* -- Offers: the entries offered to a streaming segment, not yet taken by its writer ------- */

/* Bits of `offer`'s answer (slts.offload.pending: TAKEN ... INVALID). */
#define OFFER_TAKEN 1
#define OFFER_HANDED 2
#define OFFER_ROLLOVER 4
#define OFFER_FULL 8
#define OFFER_CLOSED 16
#define OFFER_UNORDERED 32
#define OFFER_INVALID 64
#define OFFER_PAUSE 128
/* slts.offload.pending.PAUSE_EVERY: while the writer writes, every this many offers taken
 * answer PAUSE too. */
#define PAUSE_EVERY 256

/* slts.offload.pending.OfferBuffer's twin. Not tracked by the garbage collector: it holds
 * a list of Blocks and a Block, which hold bytes only. The handle calls it under its lock,
 * and each call runs without releasing the interpreter or running Python code. */
typedef struct {
    PyObject_HEAD
    long long begin_ledger, begin_entry;
    int has_last;
    long long last_ledger, last_entry;
    long long segment_bytes, buffered;
    long long buffer_bytes, block_bytes, max_segment_bytes;
    double assigned_s, max_age_s, min_age_s;
    int closing;
    int writing;              /* the writer is writing (set by it) */
    long long taken_writing;  /* offers taken while it was */
    PyObject *full; /* list of Blocks, oldest first */
    Block *filling; /* NULL: none */
} Offers;

static PyObject *offers_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    long long begin_ledger, begin_entry, segment_bytes;
    PyObject *last, *limits;
    int closing;
    static char *names[] = {"begin", "last", "segment_bytes", "limits", "closing", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "(LL)OLOp:Offers", names, &begin_ledger, &begin_entry, &last,
                                     &segment_bytes, &limits, &closing)) {
        return NULL;
    }
    Offers *self = (Offers *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->full = PyList_New(0);
    if (self->full == NULL
        || !PyArg_ParseTuple(limits, "LLLddd:limits", &self->buffer_bytes, &self->block_bytes,
                             &self->max_segment_bytes, &self->assigned_s, &self->max_age_s, &self->min_age_s)
        || (last != Py_None && !PyArg_ParseTuple(last, "LL:last", &self->last_ledger, &self->last_entry))) {
        Py_DECREF(self);
        return NULL;
    }
    self->begin_ledger = begin_ledger;
    self->begin_entry = begin_entry;
    self->has_last = last != Py_None;
    self->segment_bytes = segment_bytes;
    self->buffered = 0;
    self->closing = closing;
    self->writing = 0;
    self->taken_writing = 0;
    self->filling = NULL;
    return (PyObject *)self;
}

static void offers_dealloc(Offers *self)
{
    Py_XDECREF(self->full);
    Py_XDECREF(self->filling);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* An id as OfferBuffer.offer accepts it: an int (not a bool) in [0, 2**63-1]. */
static int offer_id(PyObject *value, long long *id)
{
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        return 0;
    }
    *id = PyLong_AsLongLong(value);
    if (*id == -1 && PyErr_Occurred()) {
        PyErr_Clear(); /* too large: bad input, answered as such */
        return 0;
    }
    return *id >= 0;
}

/* OfferBuffer.offer: the bits of what happened, or -1 with an exception set. */
static long offer_bits(Offers *self, PyObject *ledger, PyObject *entry, PyObject *data, PyObject *when)
{
    long long ledger_id, entry_id;
    if (!offer_id(ledger, &ledger_id) || !offer_id(entry, &entry_id) || !PyBytes_Check(data)
        || PyBytes_GET_SIZE(data) > INT32_MAX) {
        return OFFER_INVALID;
    }
    double now = PyFloat_AsDouble(when);
    if (now == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    double age = now - self->assigned_s;
    if (self->closing || age >= self->max_age_s) {
        return OFFER_CLOSED;
    }
    int follows = self->has_last ? (ledger_id == self->last_ledger && entry_id - 1 == self->last_entry)
                                       || (ledger_id > self->last_ledger && entry_id == 0)
                                 : (ledger_id == self->begin_ledger && entry_id == self->begin_entry);
    if (!follows) {
        return OFFER_UNORDERED;
    }
    if (self->buffered >= self->buffer_bytes) {
        return OFFER_FULL;
    }
    long outcome = OFFER_TAKEN;
    if (self->filling == NULL || !block_take(self->filling, ledger_id, entry_id, data, self->block_bytes)) {
        Block *block = block_create(ledger_id, entry_id, data, self->block_bytes);
        if (block == NULL) {
            return -1;
        }
        if (self->filling != NULL) {
            if (PyList_Append(self->full, (PyObject *)self->filling) < 0) {
                Py_DECREF(block);
                return -1;
            }
            Py_DECREF(self->filling);
            outcome |= OFFER_HANDED;
        }
        self->filling = block;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(data);
    self->buffered += size;
    self->segment_bytes += size;
    self->has_last = 1;
    self->last_ledger = ledger_id;
    self->last_entry = entry_id;
    if (self->segment_bytes >= self->max_segment_bytes && age >= self->min_age_s) {
        outcome |= OFFER_ROLLOVER;
    }
    if (self->writing && ++self->taken_writing % PAUSE_EVERY == 0) {
        outcome |= OFFER_PAUSE;
    }
    return outcome;
}

static PyObject *offers_offer(Offers *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        return PyErr_Format(PyExc_TypeError, "offer takes 4 arguments, got %zd", nargs);
    }
    long outcome = offer_bits(self, args[0], args[1], args[2], args[3]);
    return outcome < 0 ? NULL : PyLong_FromLong(outcome);
}

static PyObject *offers_take(Offers *self, PyObject *args)
{
    long long batch_bytes;
    int filling;
    if (!PyArg_ParseTuple(args, "Lp:take", &batch_bytes, &filling)) {
        return NULL;
    }
    Py_ssize_t queued = PyList_GET_SIZE(self->full), taken = 0;
    long long size = 0, payload = 0;
    while (taken < queued) {
        Block *block = (Block *)PyList_GET_ITEM(self->full, taken);
        if (taken && size + block->used > batch_bytes) {
            break;
        }
        size += block->used;
        payload += block->payload;
        taken += 1;
    }
    PyObject *blocks = PyList_GetSlice(self->full, 0, taken);
    if (blocks == NULL || PyList_SetSlice(self->full, 0, taken, NULL) < 0) {
        Py_XDECREF(blocks);
        return NULL;
    }
    if (filling && taken == queued && self->filling != NULL && (!taken || size + self->filling->used <= batch_bytes)) {
        if (PyList_Append(blocks, (PyObject *)self->filling) < 0) {
            Py_DECREF(blocks);
            return NULL;
        }
        payload += self->filling->payload;
        Py_CLEAR(self->filling);
    }
    self->buffered -= payload;
    return blocks;
}

static PyObject *offers_get_closing(Offers *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->closing);
}

static int offers_set_closing(Offers *self, PyObject *value, void *unused)
{
    (void)unused;
    int closing = value == NULL ? -1 : PyObject_IsTrue(value);
    if (closing < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "closing cannot be deleted");
        }
        return -1;
    }
    self->closing = closing;
    return 0;
}

static PyObject *offers_get_writing(Offers *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->writing);
}

static int offers_set_writing(Offers *self, PyObject *value, void *unused)
{
    (void)unused;
    int writing = value == NULL ? -1 : PyObject_IsTrue(value);
    if (writing < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "writing cannot be deleted");
        }
        return -1;
    }
    self->writing = writing;
    return 0;
}

static PyObject *offers_get_last(Offers *self, void *unused)
{
    (void)unused;
    if (!self->has_last) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(LL)", self->last_ledger, self->last_entry);
}

static PyObject *offers_get_has_full(Offers *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(PyList_GET_SIZE(self->full) > 0);
}

static PyObject *offers_get_has_filling(Offers *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->filling != NULL);
}

static PyGetSetDef offers_getset[] = {
    {"closing", (getter)offers_get_closing, (setter)offers_set_closing, "The segment closes: offers are refused.", NULL},
    {"last", (getter)offers_get_last, NULL, "The (ledger, entry) last taken, or None.", NULL},
    {"writing", (getter)offers_get_writing, (setter)offers_set_writing,
     "The writer is writing: every PAUSE_EVERY-th offer taken answers PAUSE too.", NULL},
    {"has_full", (getter)offers_get_has_full, NULL, "Whether a full block waits for the writer.", NULL},
    {"has_filling", (getter)offers_get_has_filling, NULL, "Whether a block is being filled.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef offers_members[] = {
    {"buffered", T_LONGLONG, offsetof(Offers, buffered), READONLY, "The payload held, bytes."},
    {"segment_bytes", T_LONGLONG, offsetof(Offers, segment_bytes), READONLY, "The payload offered to the segment."},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef offers_methods[] = {
    {"offer", (PyCFunction)(void (*)(void))offers_offer, METH_FASTCALL,
     "offer(ledger_id, entry_id, data, now) -> int: take the entry if it may be; bits of what happened."},
    {"take", (PyCFunction)offers_take, METH_VARARGS,
     "take(batch_bytes, filling) -> list: the blocks for the writer's next write, in order."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject OffersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "slts.offload._framing.Offers",
    .tp_basicsize = sizeof(Offers),
    .tp_dealloc = (destructor)offers_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Offers(begin, last, segment_bytes, limits, closing): slts.offload.pending.OfferBuffer's\n"
              "compiled twin.",
    .tp_methods = offers_methods,
    .tp_members = offers_members,
    .tp_getset = offers_getset,
    .tp_new = offers_new,
};

/* slts.offload.pending.OfferGate's twin: a streaming handle's offer_entry in one call.
 * Tracked by the garbage collector: its callables are bound methods of the handle that
 * holds it (a cycle). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *acquire, *release; /* the lock's */
    Offers *offers;
    PyObject *clock, *ok, *locked, *after;
} OfferGate;

/* Release the gate's lock, keeping an exception being raised (if any) as it is. */
static int gate_release(OfferGate *self)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyObject *done = PyObject_CallNoArgs(self->release);
    if (done == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(traceback);
        return -1;
    }
    Py_DECREF(done);
    PyErr_Restore(type, value, traceback);
    return 0;
}

static PyObject *gate_offer(OfferGate *self, PyObject *ledger, PyObject *entry, PyObject *data)
{
    if (self->acquire == NULL) {
        return PyErr_Format(PyExc_ValueError, "OfferGate: cleared");
    }
    PyObject *held = PyObject_CallNoArgs(self->acquire);
    if (held == NULL) {
        return NULL;
    }
    Py_DECREF(held);
    PyObject *now = PyObject_CallNoArgs(self->clock);
    long bits = now == NULL ? -1 : offer_bits(self->offers, ledger, entry, data, now);
    Py_XDECREF(now);
    if (bits == OFFER_TAKEN) { /* the common case: no Python code runs */
        return gate_release(self) < 0 ? NULL : Py_NewRef(self->ok);
    }
    PyObject *outcome = bits < 0 ? NULL : PyLong_FromLong(bits);
    PyObject *answer = NULL;
    if (outcome != NULL) {
        PyObject *call[4] = {outcome, ledger, entry, data};
        answer = PyObject_Vectorcall(self->locked, call, 4, NULL);
    }
    if (gate_release(self) < 0) {
        Py_XDECREF(answer);
        answer = NULL;
    }
    if (answer == NULL || answer != Py_None) {
        Py_XDECREF(outcome);
        return answer; /* an error, or the refusal */
    }
    Py_DECREF(answer);
    PyObject *done = PyObject_CallOneArg(self->after, outcome);
    Py_DECREF(outcome);
    if (done == NULL) {
        return NULL;
    }
    Py_DECREF(done);
    return Py_NewRef(self->ok);
}

static PyObject *gate_vectorcall(OfferGate *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    static const char *const names[] = {"ledger_id", "entry_id", "data"};
    PyObject *given[3] = {NULL, NULL, NULL};
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 3) {
        return PyErr_Format(PyExc_TypeError, "offer_entry takes 3 arguments, got %zd", nargs);
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        given[i] = args[i];
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int slot = -1;
        for (int i = 0; i < 3 && slot < 0; i++) {
            if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) {
                slot = i;
            }
        }
        if (slot < 0 || given[slot] != NULL) {
            return PyErr_Format(PyExc_TypeError, "offer_entry got %s keyword argument %R",
                                slot < 0 ? "an unexpected" : "a repeated", name);
        }
        given[slot] = args[nargs + k];
    }
    for (int i = 0; i < 3; i++) {
        if (given[i] == NULL) {
            return PyErr_Format(PyExc_TypeError, "offer_entry missing argument %s", names[i]);
        }
    }
    return gate_offer(self, given[0], given[1], given[2]);
}

static PyObject *gate_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *lock, *offers, *clock, *ok, *locked, *after;
    static char *names[] = {"lock", "offers", "clock", "ok", "locked", "after", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!OOOO:OfferGate", names, &lock, &OffersType, &offers, &clock,
                                     &ok, &locked, &after)) {
        return NULL;
    }
    if (!PyCallable_Check(clock) || !PyCallable_Check(locked) || !PyCallable_Check(after)) {
        return PyErr_Format(PyExc_TypeError, "OfferGate: clock, locked and after must be callable");
    }
    OfferGate *self = (OfferGate *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)gate_vectorcall;
    self->acquire = PyObject_GetAttrString(lock, "acquire");
    self->release = self->acquire == NULL ? NULL : PyObject_GetAttrString(lock, "release");
    if (self->release == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->offers = (Offers *)Py_NewRef(offers);
    self->clock = Py_NewRef(clock);
    self->ok = Py_NewRef(ok);
    self->locked = Py_NewRef(locked);
    self->after = Py_NewRef(after);
    return (PyObject *)self;
}

static int gate_traverse(OfferGate *self, visitproc visit, void *arg)
{
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->offers);
    Py_VISIT(self->clock);
    Py_VISIT(self->ok);
    Py_VISIT(self->locked);
    Py_VISIT(self->after);
    return 0;
}

static int gate_clear(OfferGate *self)
{
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->offers);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->ok);
    Py_CLEAR(self->locked);
    Py_CLEAR(self->after);
    return 0;
}

static void gate_dealloc(OfferGate *self)
{
    PyObject_GC_UnTrack(self);
    gate_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject OfferGateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "slts.offload._framing.OfferGate",
    .tp_basicsize = sizeof(OfferGate),
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_vectorcall_offset = offsetof(OfferGate, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "OfferGate(lock, offers, clock, ok, locked, after): slts.offload.pending.OfferGate's\n"
              "compiled twin; called as offer_entry(ledger_id, entry_id, data).",
    .tp_traverse = (traverseproc)gate_traverse,
    .tp_clear = (inquiry)gate_clear,
    .tp_new = gate_new,
};

PyDoc_STRVAR(frame_entries_doc,
             "frame_entries(pieces, first_entry_id, payloads, start, room, enough) -> (frames, bytes):\n"
             "framing.frame_entries_python's twin: frame payloads[start:] into pieces while each\n"
             "fits in room, stopping after the frame that brings the bytes framed to enough.");

/* The offloader's per-entry loop (framing.frame_entries_python, the reference): for each
 * payload from `start`, a 12-byte header and the payload itself appended to `pieces`, while
 * the frame fits in what is left of `room`; stop after the frame that brings the bytes
 * framed to `enough`. A payload's length is its len(), as in Python. */
static PyObject *frame_entries(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *pieces, *payloads;
    long long first, room, enough;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!LOnLL:frame_entries", &PyList_Type, &pieces, &first, &payloads, &start, &room,
                          &enough)) {
        return NULL;
    }
    if (first < 0 || start < 0 || room < 0 || room > INT32_MAX || enough < 1) {
        return PyErr_Format(PyExc_ValueError,
                            "frame_entries: first entry id %lld, start %zd, room %lld (at most 2**31-1),"
                            " enough %lld (at least 1)",
                            first, start, room, enough);
    }
    PyObject *sequence = PySequence_Fast(payloads, "frame_entries: the payloads must be a sequence");
    if (sequence == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    PyObject **items = PySequence_Fast_ITEMS(sequence);
    long long taken = 0, framed = 0;
    for (Py_ssize_t i = start; i < count; i++) {
        PyObject *payload = items[i];
        Py_ssize_t length = PyBytes_CheckExact(payload) ? PyBytes_GET_SIZE(payload) : PyObject_Size(payload);
        if (length < 0) {
            goto fail;
        }
        long long size = HEADER_BYTES + (long long)length;
        if (size > room - framed) {
            break; /* room <= 2**31-1: a payload that fits has a length an i32 holds */
        }
        PyObject *header = PyBytes_FromStringAndSize(NULL, HEADER_BYTES);
        if (header == NULL) {
            goto fail;
        }
        unsigned char *at = (unsigned char *)PyBytes_AS_STRING(header);
        store_be(at, (uint64_t)(uint32_t)length, 4);
        store_be(at + 4, (uint64_t)(first + taken), 8);
        int failed = PyList_Append(pieces, header);
        Py_DECREF(header);
        if (failed < 0 || PyList_Append(pieces, payload) < 0) {
            goto fail;
        }
        taken += 1;
        framed += size;
        if (framed >= enough) {
            break;
        }
    }
    Py_DECREF(sequence);
    return Py_BuildValue("(LL)", taken, framed);
fail:
    Py_DECREF(sequence);
    return NULL;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, walk_doc},
    {"views", views, METH_VARARGS, views_doc},
    {"frame_entries", frame_entries, METH_VARARGS, frame_entries_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "slts.offload._framing",
    .m_doc = "The compiled hot loops of slts.offload.framing (optional; see that module).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__framing(void)
{
    if (PyType_Ready(&SpanType) < 0 || PyType_Ready(&PayloadType) < 0 || PyType_Ready(&BlockType) < 0
        || PyType_Ready(&OffersType) < 0 || PyType_Ready(&OfferGateType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&definition);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddType(module, &PayloadType) < 0 || PyModule_AddType(module, &BlockType) < 0
        || PyModule_AddType(module, &OffersType) < 0 || PyModule_AddType(module, &OfferGateType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "WALK_DONE", WALK_DONE) < 0
        || PyModule_AddIntConstant(module, "WALK_MORE", WALK_MORE) < 0
        || PyModule_AddIntConstant(module, "WALK_DAMAGED", WALK_DAMAGED) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
