/* The compiled twins of slts.journal.system_layout.appends_python (journal replay) and
 * slts.journal.metadata_copy.changes_python (restore's metadata log); see those functions.
 *
 * `appends(data, offset, segment, chunk, length, epoch, last, attrs)` walks the framed
 * journal records of `data` from `offset` and applies those that are plain appends to the
 * last chunk of one system segment, as `SystemLayout.apply` would, without making a Python
 * object per record: per frame the header, the CRC32C of the payload, and one pass over the
 * msgpack map that checks every field; the attributes are folded by name and set once. It stops at the first frame that is anything else
 * (another kind, another segment or epoch, a duplicate id, a torn or CRC-bad frame, a sealed
 * payload, an unknown or repeated key, a value of another type, bytes after the map...) and
 * returns `(offset, length, last, count)`: where it stopped, the segment's new length, the
 * last record number applied and how many records it applied. `attrs` (the segment's
 * attribute dict) gets each applied record's attributes, in order. The caller handles the
 * frame it stopped at with the reference code (framing.read_records + SystemLayout.apply),
 * which decides what that frame means; this walk only ever takes frames whose meaning is
 * plain, so taking or leaving one never changes the outcome.
 *
 * `changes(data, offset, sequence, tables, ops_max)` does the same for the metadata log in a
 * restore: it walks runs of plain commit records and puts their operations into the
 * window `tables` (table -> key -> (key, sequence, value or None)) without a msgpack
 * decode: a bytes object per key and value, a tuple per operation. `plain_change(payload,
 * tables)` checks one payload as that walk does (the metadata log checks each commit it
 * ships with it: slts.journal.metadata_copy.plain_change_python is its twin).
 *
 * They keep no Python object past the call; the pure-Python twins are the reference and
 * tests/journal/test_replay_native.py and test_restore_native.py run both on the same inputs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_SSE42_PATH 1
#endif

#define HEADER_BYTES 8
#define RECORD_BYTES_MAX (64u << 20)
#define SEALED_MARKER 0xc1
#define ATTRS_MAX 8

/* -- CRC32C (Castagnoli), as the crc32c package computes it ------------------------------- */

static uint32_t crc_table[256];
static int crc_hardware;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t value = i;
        for (int bit = 0; bit < 8; bit++) {
            value = (value & 1) ? (value >> 1) ^ 0x82F63B78u : value >> 1;
        }
        crc_table[i] = value;
    }
#ifdef HAVE_SSE42_PATH
    __builtin_cpu_init();
    crc_hardware = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_software(const unsigned char *data, size_t size)
{
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < size; i++) {
        crc = crc_table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
    }
    return crc ^ 0xFFFFFFFFu;
}

#ifdef HAVE_SSE42_PATH
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(const unsigned char *data, size_t size)
{
    uint64_t crc = 0xFFFFFFFFu;
    while (size >= 8) {
        uint64_t word;
        memcpy(&word, data, 8);
        crc = _mm_crc32_u64(crc, word);
        data += 8;
        size -= 8;
    }
    uint32_t small = (uint32_t)crc;
    while (size--) {
        small = _mm_crc32_u8(small, *data++);
    }
    return small ^ 0xFFFFFFFFu;
}
#endif

static uint32_t crc32c(const unsigned char *data, size_t size)
{
#ifdef HAVE_SSE42_PATH
    if (crc_hardware) {
        return crc_sse42(data, size);
    }
#endif
    return crc_software(data, size);
}

/* -- a reader of the few msgpack types an append record holds ----------------------------- */

typedef struct {
    const unsigned char *at;
    const unsigned char *end;
} Reader;

static int read_big_endian(Reader *r, int size, uint64_t *out)
{
    if (r->end - r->at < size) {
        return 0;
    }
    uint64_t value = 0;
    for (int i = 0; i < size; i++) {
        value = (value << 8) | r->at[i];
    }
    r->at += size;
    *out = value;
    return 1;
}

/* A msgpack integer (not a bool, not beyond int64): 1 and *out set, else 0. */
static int read_int(Reader *r, int64_t *out)
{
    if (r->at >= r->end) {
        return 0;
    }
    unsigned char tag = *r->at++;
    uint64_t raw;
    if (tag <= 0x7f) {
        *out = tag;
        return 1;
    }
    if (tag >= 0xe0) {
        *out = (int64_t)(int8_t)tag;
        return 1;
    }
    switch (tag) {
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
        if (!read_big_endian(r, 1 << (tag - 0xcc), &raw) || raw > (uint64_t)INT64_MAX) {
            return 0;
        }
        *out = (int64_t)raw;
        return 1;
    case 0xd0:
        if (!read_big_endian(r, 1, &raw)) {
            return 0;
        }
        *out = (int8_t)raw;
        return 1;
    case 0xd1:
        if (!read_big_endian(r, 2, &raw)) {
            return 0;
        }
        *out = (int16_t)raw;
        return 1;
    case 0xd2:
        if (!read_big_endian(r, 4, &raw)) {
            return 0;
        }
        *out = (int32_t)raw;
        return 1;
    case 0xd3:
        if (!read_big_endian(r, 8, &raw)) {
            return 0;
        }
        *out = (int64_t)raw;
        return 1;
    default:
        return 0;
    }
}

/* A msgpack str: 1 with its bytes in *text, *size, else 0 (bin is not a str). */
static int read_str(Reader *r, const unsigned char **text, Py_ssize_t *size)
{
    if (r->at >= r->end) {
        return 0;
    }
    unsigned char tag = *r->at++;
    uint64_t length;
    if (tag >= 0xa0 && tag <= 0xbf) {
        length = tag & 0x1f;
    } else if (tag == 0xd9 || tag == 0xda || tag == 0xdb) {
        if (!read_big_endian(r, 1 << (tag - 0xd9), &length)) {
            return 0;
        }
    } else {
        return 0;
    }
    if ((uint64_t)(r->end - r->at) < length) {
        return 0;
    }
    *text = r->at;
    *size = (Py_ssize_t)length;
    r->at += length;
    return 1;
}

/* A msgpack map or array header of the given family: 1 with its count, else 0. */
static int read_count(Reader *r, unsigned char fix_low, unsigned char fix_high, unsigned char tag16, uint64_t *count)
{
    if (r->at >= r->end) {
        return 0;
    }
    unsigned char tag = *r->at++;
    if (tag >= fix_low && tag <= fix_high) {
        *count = tag & 0x0f;
        return 1;
    }
    if (tag == tag16) {
        return read_big_endian(r, 2, count);
    }
    if (tag == tag16 + 1) {
        return read_big_endian(r, 4, count);
    }
    return 0;
}

static int same(const unsigned char *text, Py_ssize_t size, const char *expected, Py_ssize_t expected_size)
{
    return size == expected_size && memcmp(text, expected, (size_t)size) == 0;
}

enum {
    KEY_K = 1,
    KEY_SEG = 2,
    KEY_CHUNK = 4,
    KEY_OFFSET = 8,
    KEY_LENGTH = 16,
    KEY_ID = 32,
    KEY_ATTRS = 64,
    KEYS_REQUIRED = KEY_K | KEY_SEG | KEY_CHUNK | KEY_OFFSET | KEY_LENGTH | KEY_ID,
};

typedef struct {
    const char *segment;
    Py_ssize_t segment_size;
    const char *chunk;
    Py_ssize_t chunk_size;
    int64_t epoch;
} Expected;

/* An attribute of a record: its name's bytes (in the frame) and its value. */
typedef struct {
    const unsigned char *name;
    Py_ssize_t size;
    int64_t value;
} RawAttr;

/* One payload: 1 if it is a plain append that fits (*added, *number and the record's
 * attributes, attrs[0..*attr_count), filled in), 0 otherwise. */
static int parse_append(
    const unsigned char *payload,
    Py_ssize_t size,
    const Expected *expected,
    int64_t length,
    int64_t last,
    int64_t *added,
    int64_t *number,
    RawAttr *attrs,
    int *attr_count)
{
    Reader r = {payload, payload + size};
    uint64_t fields;
    int seen = 0;
    int held = 0;
    if (!read_count(&r, 0x80, 0x8f, 0xde, &fields) || fields < 6 || fields > 7) {
        return 0;
    }
    for (uint64_t i = 0; i < fields; i++) {
        const unsigned char *key;
        Py_ssize_t key_size;
        const unsigned char *text;
        Py_ssize_t text_size;
        int64_t value;
        int bit;
        if (!read_str(&r, &key, &key_size)) {
            return 0;
        }
        if (same(key, key_size, "k", 1)) {
            bit = KEY_K;
        } else if (same(key, key_size, "seg", 3)) {
            bit = KEY_SEG;
        } else if (same(key, key_size, "chunk", 5)) {
            bit = KEY_CHUNK;
        } else if (same(key, key_size, "offset", 6)) {
            bit = KEY_OFFSET;
        } else if (same(key, key_size, "length", 6)) {
            bit = KEY_LENGTH;
        } else if (same(key, key_size, "id", 2)) {
            bit = KEY_ID;
        } else if (same(key, key_size, "attrs", 5)) {
            bit = KEY_ATTRS;
        } else {
            return 0; /* a key the walk does not know: the reference decides */
        }
        if (seen & bit) {
            return 0; /* a repeated key */
        }
        seen |= bit;
        if (bit == KEY_K) {
            if (!read_str(&r, &text, &text_size) || !same(text, text_size, "append", 6)) {
                return 0;
            }
        } else if (bit == KEY_SEG) {
            if (!read_str(&r, &text, &text_size)
                || !same(text, text_size, expected->segment, expected->segment_size)) {
                return 0;
            }
        } else if (bit == KEY_CHUNK) {
            if (!read_str(&r, &text, &text_size)
                || !same(text, text_size, expected->chunk, expected->chunk_size)) {
                return 0;
            }
        } else if (bit == KEY_OFFSET) {
            if (!read_int(&r, &value) || value != length) {
                return 0;
            }
        } else if (bit == KEY_LENGTH) {
            if (!read_int(&r, &value) || value < 0 || value > INT64_MAX - length) {
                return 0;
            }
            *added = value;
        } else if (bit == KEY_ID) {
            uint64_t items;
            int64_t epoch;
            if (!read_count(&r, 0x90, 0x9f, 0xdc, &items) || items != 2 || !read_int(&r, &epoch)
                || epoch != expected->epoch || !read_int(&r, &value) || value <= last) {
                return 0;
            }
            *number = value;
        } else if (r.at < r.end && *r.at == 0xc0) { /* attrs nil: no attributes */
            r.at++;
        } else {
            uint64_t count;
            if (!read_count(&r, 0x80, 0x8f, 0xde, &count) || count > ATTRS_MAX) {
                return 0;
            }
            for (uint64_t j = 0; j < count; j++) {
                if (!read_str(&r, &text, &text_size) || !read_int(&r, &value)) {
                    return 0;
                }
                for (int other = 0; other < held; other++) { /* a repeated name */
                    if (same(text, text_size, (const char *)attrs[other].name, attrs[other].size)) {
                        return 0;
                    }
                }
                attrs[held].name = text;
                attrs[held].size = text_size;
                attrs[held].value = value;
                held++;
            }
        }
    }
    if ((seen & KEYS_REQUIRED) != KEYS_REQUIRED || r.at != r.end) {
        return 0;
    }
    *attr_count = held;
    return 1;
}

/* The attributes a run set so far, by name (first seen first): each record's are folded
 * in here, and the segment's dict gets them once, when the run ends (``flush``). The
 * result is the dict sequential updates make: the same keys, in the same order, with
 * the last values. A name is checked to be UTF-8 once, when first seen. */
#define RUN_ATTRS_MAX 32

typedef struct {
    const unsigned char *name;
    Py_ssize_t size;
    PyObject *key; /* the decoded name (a new reference) */
    int64_t value;
} RunAttr;

typedef struct {
    RunAttr attrs[RUN_ATTRS_MAX];
    int count;
} RunAttrs;

static int run_attrs_flush(RunAttrs *run, PyObject *dict)
{
    int failed = 0;
    for (int i = 0; i < run->count; i++) {
        if (!failed) {
            PyObject *value = PyLong_FromLongLong(run->attrs[i].value);
            if (value == NULL || PyDict_SetItem(dict, run->attrs[i].key, value) != 0) {
                failed = 1;
            }
            Py_XDECREF(value);
        }
        Py_DECREF(run->attrs[i].key);
    }
    run->count = 0;
    return failed ? -1 : 0;
}

/* Fold one record's attributes in: 1 done, 0 a name is not UTF-8 (nothing changed), -1 a
 * Python error. */
static int run_attrs_fold(RunAttrs *run, PyObject *dict, const RawAttr *attrs, int count)
{
    int index[ATTRS_MAX];
    int fresh = 0;
    for (int i = 0; i < count; i++) {
        index[i] = -1;
        for (int j = 0; j < run->count; j++) {
            if (same(attrs[i].name, attrs[i].size, (const char *)run->attrs[j].name, run->attrs[j].size)) {
                index[i] = j;
                break;
            }
        }
        fresh += index[i] < 0;
    }
    if (fresh && run->count + fresh > RUN_ATTRS_MAX && run_attrs_flush(run, dict) != 0) {
        return -1;
    }
    if (fresh && run->count == 0) {
        for (int i = 0; i < count; i++) {
            index[i] = -1;
        }
    }
    int first_new = run->count;
    for (int i = 0; i < count; i++) {
        if (index[i] >= 0) {
            continue;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)attrs[i].name, attrs[i].size, "strict");
        if (key == NULL) {
            PyErr_Clear(); /* not UTF-8: the reference decides what that means */
            while (run->count > first_new) {
                Py_DECREF(run->attrs[--run->count].key);
            }
            return 0;
        }
        RunAttr *slot = &run->attrs[run->count];
        slot->name = attrs[i].name;
        slot->size = attrs[i].size;
        slot->key = key;
        index[i] = run->count++;
    }
    for (int i = 0; i < count; i++) {
        run->attrs[index[i]].value = attrs[i].value;
    }
    return 1;
}

static PyObject *appends(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        return PyErr_Format(PyExc_TypeError, "appends() takes 8 arguments (%zd given)", nargs);
    }
    PyObject *attrs_dict = args[7];
    if (!PyDict_CheckExact(attrs_dict)) {
        return PyErr_Format(PyExc_TypeError, "appends(): attrs must be a dict");
    }
    if (!PyUnicode_Check(args[2]) || !PyUnicode_Check(args[3])) {
        return PyErr_Format(PyExc_TypeError, "appends(): segment and chunk must be str");
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Expected expected;
    expected.segment = PyUnicode_AsUTF8AndSize(args[2], &expected.segment_size);
    expected.chunk = PyUnicode_AsUTF8AndSize(args[3], &expected.chunk_size);
    if (expected.segment == NULL || expected.chunk == NULL) {
        return NULL;
    }
    int overflow = 0;
    int64_t length = PyLong_AsLongLongAndOverflow(args[4], &overflow);
    int64_t epoch = overflow ? 0 : PyLong_AsLongLongAndOverflow(args[5], &overflow);
    int64_t last = overflow ? 0 : PyLong_AsLongLongAndOverflow(args[6], &overflow);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (overflow || length < 0 || offset < 0) {
        /* beyond what the walk handles (or nonsense): take nothing, the reference decides */
        return Py_BuildValue("(nOOn)", offset, args[4], args[6], (Py_ssize_t)0);
    }
    expected.epoch = epoch;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    const unsigned char *data = view.buf;
    Py_ssize_t size = view.len;
    Py_ssize_t count = 0;
    RawAttr attrs[ATTRS_MAX];
    RunAttrs run;
    run.count = 0;
    while (offset <= size - HEADER_BYTES) {
        const unsigned char *header = data + offset;
        uint32_t payload_size = ((uint32_t)header[0] << 24) | ((uint32_t)header[1] << 16)
                                | ((uint32_t)header[2] << 8) | header[3];
        uint32_t checksum = ((uint32_t)header[4] << 24) | ((uint32_t)header[5] << 16)
                            | ((uint32_t)header[6] << 8) | header[7];
        if (payload_size == 0 || payload_size > RECORD_BYTES_MAX
            || (Py_ssize_t)payload_size > size - offset - HEADER_BYTES) {
            break;
        }
        const unsigned char *payload = header + HEADER_BYTES;
        if (payload[0] == SEALED_MARKER || crc32c(payload, payload_size) != checksum) {
            break;
        }
        int64_t added = 0, number = 0;
        int attr_count = 0;
        if (!parse_append(payload, payload_size, &expected, length, last, &added, &number, attrs, &attr_count)) {
            break;
        }
        int folded = attr_count ? run_attrs_fold(&run, attrs_dict, attrs, attr_count) : 1;
        if (folded < 0) {
            run_attrs_flush(&run, attrs_dict);
            PyBuffer_Release(&view);
            return NULL;
        }
        if (folded == 0) {
            break;
        }
        length += added;
        last = number;
        offset += HEADER_BYTES + (Py_ssize_t)payload_size;
        count++;
    }
    int flushed = run_attrs_flush(&run, attrs_dict); /* before the view goes: names point into it */
    PyBuffer_Release(&view);
    if (flushed != 0) {
        return NULL;
    }
    return Py_BuildValue("(nLLn)", offset, (long long)length, (long long)last, count);
}

/* -- the metadata log: runs of plain commits into a restore's window ----------------------- */

#define TABLES_MAX 128

typedef struct {
    const char *name;
    Py_ssize_t size;
    PyObject *rows; /* the table's dict in the window (borrowed) */
} Table;

/* A msgpack bin: 1 with its bytes, else 0. */
static int read_bin(Reader *r, const unsigned char **bytes, Py_ssize_t *size)
{
    if (r->at >= r->end) {
        return 0;
    }
    unsigned char tag = *r->at++;
    uint64_t length;
    if (tag < 0xc4 || tag > 0xc6 || !read_big_endian(r, 1 << (tag - 0xc4), &length)) {
        return 0;
    }
    if ((uint64_t)(r->end - r->at) < length) {
        return 0;
    }
    *bytes = r->at;
    *size = (Py_ssize_t)length;
    r->at += length;
    return 1;
}

/* One operation [table, key, value or nil]: 1 (its table's index, key and value set;
 * *value NULL for nil), else 0. */
static int read_operation(
    Reader *r, const Table *tables, int table_count, int *table, const unsigned char **key,
    Py_ssize_t *key_size, const unsigned char **value, Py_ssize_t *value_size)
{
    uint64_t items;
    const unsigned char *name;
    Py_ssize_t name_size;
    if (!read_count(r, 0x90, 0x9f, 0xdc, &items) || items != 3 || !read_str(r, &name, &name_size)) {
        return 0;
    }
    *table = -1;
    for (int i = 0; i < table_count; i++) {
        if (same(name, name_size, tables[i].name, tables[i].size)) {
            *table = i;
            break;
        }
    }
    if (*table < 0 || !read_bin(r, key, key_size)) {
        return 0;
    }
    if (r->at < r->end && *r->at == 0xc0) {
        r->at++;
        *value = NULL;
        *value_size = 0;
        return 1;
    }
    return read_bin(r, value, value_size);
}

/* A log record's payload: 1 if it is a plain commit {"s": int, "o": [operation, ...]}
 * (its sequence, the count and where the operations start set), else 0. */
static int parse_change(
    const unsigned char *payload, Py_ssize_t size, const Table *tables, int table_count, int64_t *sequence,
    uint64_t *count, const unsigned char **operations)
{
    Reader r = {payload, payload + size};
    uint64_t fields;
    int seen = 0;
    if (!read_count(&r, 0x80, 0x8f, 0xde, &fields) || fields != 2) {
        return 0;
    }
    for (int i = 0; i < 2; i++) {
        const unsigned char *key;
        Py_ssize_t key_size;
        if (!read_str(&r, &key, &key_size)) {
            return 0;
        }
        if (same(key, key_size, "s", 1) && !(seen & 1)) {
            seen |= 1;
            if (!read_int(&r, sequence)) {
                return 0;
            }
        } else if (same(key, key_size, "o", 1) && !(seen & 2)) {
            seen |= 2;
            if (!read_count(&r, 0x90, 0x9f, 0xdc, count)) {
                return 0;
            }
            *operations = r.at;
            for (uint64_t j = 0; j < *count; j++) {
                int table;
                const unsigned char *k, *v;
                Py_ssize_t k_size, v_size;
                if (!read_operation(&r, tables, table_count, &table, &k, &k_size, &v, &v_size)) {
                    return 0;
                }
            }
        } else {
            return 0;
        }
    }
    return r.at == r.end;
}

/* Put a checked record's operations into the window: rows[key] = (key, sequence, value). */
static int apply_change(
    const unsigned char *operations, const unsigned char *end, uint64_t count, const Table *tables,
    int table_count, PyObject *sequence)
{
    Reader r = {operations, end};
    for (uint64_t j = 0; j < count; j++) {
        int table;
        const unsigned char *k, *v;
        Py_ssize_t k_size, v_size;
        int read = read_operation(&r, tables, table_count, &table, &k, &k_size, &v, &v_size);
        assert(read);
        (void)read;
        PyObject *key = PyBytes_FromStringAndSize((const char *)k, k_size);
        if (key == NULL) {
            return -1;
        }
        PyObject *value = v == NULL ? Py_NewRef(Py_None) : PyBytes_FromStringAndSize((const char *)v, v_size);
        if (value == NULL) {
            Py_DECREF(key);
            return -1;
        }
        PyObject *row = PyTuple_Pack(3, key, sequence, value);
        Py_DECREF(value);
        if (row == NULL) {
            Py_DECREF(key);
            return -1;
        }
        int failed = PyDict_SetItem(tables[table].rows, key, row);
        Py_DECREF(key);
        Py_DECREF(row);
        if (failed) {
            return -1;
        }
    }
    return 0;
}

/* The tables of a window dict (str -> dict) into `tables`: their count, or -1 with a
 * TypeError set. */
static int collect_tables(PyObject *tables_dict, Table *tables, const char *caller)
{
    if (!PyDict_CheckExact(tables_dict) || PyDict_GET_SIZE(tables_dict) > TABLES_MAX) {
        PyErr_Format(PyExc_TypeError, "%s(): tables must be a dict of at most %d tables", caller, TABLES_MAX);
        return -1;
    }
    int table_count = 0;
    Py_ssize_t position = 0;
    PyObject *name, *rows;
    while (PyDict_Next(tables_dict, &position, &name, &rows)) {
        if (!PyUnicode_Check(name) || !PyDict_CheckExact(rows)) {
            PyErr_Format(PyExc_TypeError, "%s(): tables must map str to dict", caller);
            return -1;
        }
        tables[table_count].name = PyUnicode_AsUTF8AndSize(name, &tables[table_count].size);
        if (tables[table_count].name == NULL) {
            return -1;
        }
        tables[table_count].rows = rows;
        table_count++;
    }
    return table_count;
}

/* `plain_change(payload, tables)`: (sequence, operations) if the msgpack `payload` is a
 * plain commit whose every operation names a table of `tables`, else None. */
static PyObject *plain_change(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        return PyErr_Format(PyExc_TypeError, "plain_change() takes 2 arguments (%zd given)", nargs);
    }
    Table tables[TABLES_MAX];
    int table_count = collect_tables(args[1], tables, "plain_change");
    if (table_count < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    int64_t sequence = 0;
    uint64_t count = 0;
    const unsigned char *operations = view.buf;
    int plain = view.len > 0
                && parse_change(view.buf, view.len, tables, table_count, &sequence, &count, &operations);
    PyBuffer_Release(&view);
    if (!plain) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(LK)", (long long)sequence, (unsigned long long)count);
}

static PyObject *changes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        return PyErr_Format(PyExc_TypeError, "changes() takes 5 arguments (%zd given)", nargs);
    }
    PyObject *tables_dict = args[3];
    Py_ssize_t offset = PyLong_AsSsize_t(args[1]);
    if (offset == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_ssize_t ops_max = PyLong_AsSsize_t(args[4]);
    if (ops_max == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int overflow = 0;
    int64_t sequence = PyLong_AsLongLongAndOverflow(args[2], &overflow);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (overflow || sequence < 0 || offset < 0) {
        return Py_BuildValue("(nOnnO)", offset, args[2], (Py_ssize_t)0, (Py_ssize_t)0, Py_False);
    }
    Table tables[TABLES_MAX];
    int table_count = collect_tables(tables_dict, tables, "changes");
    if (table_count < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    const unsigned char *data = view.buf;
    Py_ssize_t size = view.len;
    Py_ssize_t records = 0, ops = 0;
    int full = 0;
    while (offset <= size - HEADER_BYTES) {
        const unsigned char *header = data + offset;
        uint32_t payload_size = ((uint32_t)header[0] << 24) | ((uint32_t)header[1] << 16)
                                | ((uint32_t)header[2] << 8) | header[3];
        uint32_t checksum = ((uint32_t)header[4] << 24) | ((uint32_t)header[5] << 16)
                            | ((uint32_t)header[6] << 8) | header[7];
        if (payload_size == 0 || payload_size > RECORD_BYTES_MAX
            || (Py_ssize_t)payload_size > size - offset - HEADER_BYTES) {
            break;
        }
        const unsigned char *payload = header + HEADER_BYTES;
        if (payload[0] == SEALED_MARKER || crc32c(payload, payload_size) != checksum) {
            break;
        }
        int64_t record_sequence = 0;
        uint64_t count = 0;
        const unsigned char *operations = payload;
        if (!parse_change(payload, payload_size, tables, table_count, &record_sequence, &count, &operations)) {
            break;
        }
        if (record_sequence > sequence) {
            if (record_sequence != sequence + 1) {
                break; /* a gap: the reference says so */
            }
            if (ops > 0 && (uint64_t)ops + count > (uint64_t)ops_max) {
                full = 1; /* the next window's */
                break;
            }
            PyObject *sequence_object = PyLong_FromLongLong(record_sequence);
            if (sequence_object == NULL) {
                PyBuffer_Release(&view);
                return NULL;
            }
            int failed = apply_change(operations, payload + payload_size, count, tables, table_count, sequence_object);
            Py_DECREF(sequence_object);
            if (failed) {
                PyBuffer_Release(&view);
                return NULL;
            }
            sequence = record_sequence;
            records++;
            ops += (Py_ssize_t)count;
        } /* else covered by the snapshot: passed over */
        offset += HEADER_BYTES + (Py_ssize_t)payload_size;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nLnnO)", offset, (long long)sequence, records, ops, full ? Py_True : Py_False);
}

static PyObject *checksum(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) {
        return NULL;
    }
    uint32_t value = crc32c(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(value);
}

static PyMethodDef methods[] = {
    {"appends", (PyCFunction)(void (*)(void))appends, METH_FASTCALL,
     "appends(data, offset, segment, chunk, length, epoch, last, attrs) -> (offset, length, last, count)"},
    {"changes", (PyCFunction)(void (*)(void))changes, METH_FASTCALL,
     "changes(data, offset, sequence, tables, ops_max) -> (offset, sequence, records, ops, full)"},
    {"plain_change", (PyCFunction)(void (*)(void))plain_change, METH_FASTCALL,
     "plain_change(payload, tables) -> (sequence, operations) or None: a plain commit's sequence and operation count"},
    {"crc32c", checksum, METH_O, "crc32c(data) -> int: the CRC32C of data (as the crc32c package computes it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "slts.journal._replay",
    .m_doc = "The compiled twin of slts.journal.system_layout.appends_python (optional; see it).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__replay(void)
{
    crc_init();
    return PyModule_Create(&definition);
}
