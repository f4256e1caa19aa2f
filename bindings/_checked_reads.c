/* slts.bindings.checked_reads' compiled twin: a file range read into a buffer and checked
 * block by block against CRC32Cs, in one call, on two cores where the range is large
 * (the contract, and the pure-Python reference, are in bindings/checked_reads.py).
 *
 * `read_checked(fd, buffer, offset, blocks)`: `blocks` is the list of the blocks the buffer
 * covers, packed big-endian (length u32, crc32c u32) pairs whose lengths sum to len(buffer).
 * Reads fd's bytes [offset, offset + len(buffer)) into buffer (fewer at the end of the file),
 * checks every block read whole, and returns (bytes read, index of the first failing block
 * or -1). A failed pread raises OSError (the first in file order).
 *
 * From SPLIT_BYTES_MIN, the blocks are cut in two runs of about equal bytes: the process's
 * check thread reads and checks the second while the caller's thread (interpreter lock
 * released) reads and checks the first. Each thread checks only bytes it wrote itself, a
 * piece at a time while they are in its cache: a check of bytes another core just wrote
 * makes every cache line cross between the cores, which on the machines measured cost more
 * than the whole check (docs/benchmarks.md, "Issue 29, ninth session").
 *
 * The check thread spins for a short while after each job before it sleeps: waking a
 * sleeping thread costs tens of microseconds on a virtual machine (a Python lock's round
 * trip between two threads measured 62 us), about what a whole MiB costs to read and check.
 * One job at a time: a caller that finds the thread busy (another caller's job) does the
 * whole range itself, and a caller done with its half before the thread took the other
 * (no core free for it) takes that half back. After fork() the child has no check thread; its first large read starts
 * one.
 *
 * CRC32C: ISA-L's crc32_iscsi (exported by the isal package's extension module; AVX-512
 * folding where the CPU has it) or Google's crc32c_extend (shipped by google-crc32c), loaded
 * from the path `configure(path, kind)` is given and checked against a known answer. Without
 * one the module refuses to read (`configured()` is None) and the Python reference does the
 * work.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

/* From this many bytes a range is read and checked in two runs, one per core. */
#define SPLIT_BYTES_MIN (256 * 1024)
/* A thread reads this many bytes (whole blocks, at least one) before checking them: the
 * check finds them in the core's own cache. Measured on 1 and 8 MiB reads (64 KiB blocks):
 * pieces of 64 KiB ran at 0.76-0.91 of a plain read, 128 KiB 0.71-0.78, 512 KiB 0.74-1.02,
 * 1 MiB 0.84-0.94, 4 MiB 0.85-0.99: a syscall per piece costs more than a cache miss saves. */
#define PIECE_BYTES (1024 * 1024)
/* How long the check thread spins for a next job before it sleeps. */
#define SPIN_NS 300000LL
/* How long a caller spins for the other half before it looks only now and then. */
#define WAIT_SPIN_NS 200000LL

typedef uint32_t (*crc32c_extend_fn)(uint32_t, const uint8_t *, size_t);
typedef uint32_t (*crc32_iscsi_fn)(unsigned char *, int, uint32_t);
static crc32c_extend_fn google_extend = NULL;
static crc32_iscsi_fn isal_iscsi = NULL;

/* CRC32C of `length` bytes: ISA-L's crc32_iscsi where it was loaded (it takes and returns
 * the register without the standard's inversions, and an int length), else Google's. */
static uint32_t crc32c_of(const uint8_t *data, size_t length)
{
    if (isal_iscsi != NULL) {
        uint32_t crc = 0xFFFFFFFFu;
        while (length > 0) {
            int piece = length > (size_t)(1 << 30) ? (1 << 30) : (int)length;
            crc = isal_iscsi((unsigned char *)data, piece, crc);
            data += piece;
            length -= (size_t)piece;
        }
        return crc ^ 0xFFFFFFFFu;
    }
    return google_extend(0, data, length);
}

/* One run: blocks [first, end) of the list, read into buffer + start from file offset
 * offset + start. Results: `read` bytes, `bad` block index or -1, `error` errno or 0. */
typedef struct {
    int fd;
    char *buffer;
    const unsigned char *blocks;
    long long offset;
    Py_ssize_t first, end;
    long long start, length;
    long long read;
    Py_ssize_t bad;
    int error;
} Run;

static uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Read the run in pieces of whole blocks, checking each piece's blocks after its read. */
static void do_run(Run *run)
{
    long long done = 0;
    Py_ssize_t block = run->first;
    run->read = 0;
    run->bad = -1;
    run->error = 0;
    while (block < run->end) {
        /* The next piece: whole blocks, at least one, up to PIECE_BYTES. */
        Py_ssize_t piece_end = block;
        long long piece = 0;
        while (piece_end < run->end && (piece == 0 || piece + be32(run->blocks + 8 * piece_end) <= PIECE_BYTES)) {
            piece += be32(run->blocks + 8 * piece_end);
            piece_end++;
        }
        long long got_piece = 0;
        while (got_piece < piece) {
            ssize_t got = pread(run->fd, run->buffer + run->start + done + got_piece, (size_t)(piece - got_piece),
                                (off_t)(run->offset + run->start + done + got_piece));
            if (got < 0) {
                if (errno == EINTR) {
                    continue;
                }
                run->error = errno;
                run->read = done + got_piece;
                return;
            }
            if (got == 0) {
                break; /* end of file */
            }
            got_piece += got;
        }
        /* Check the blocks read whole. */
        long long at = done;
        for (Py_ssize_t b = block; b < piece_end; b++) {
            long long length = be32(run->blocks + 8 * b);
            if (at + length > done + got_piece) {
                break;
            }
            if (run->bad < 0 &&
                crc32c_of((const uint8_t *)run->buffer + run->start + at, (size_t)length) !=
                    be32(run->blocks + 8 * b + 4)) {
                run->bad = b;
            }
            at += length;
        }
        done += got_piece;
        if (got_piece < piece) {
            break;
        }
        block = piece_end;
    }
    run->read = done;
}

/* The check thread's job slot: `pending` set by the caller, taken by the thread, which sets
 * `finished` when the run is done. `busy` is 1 from a caller's claim until it collected. */
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slot_changed = PTHREAD_COND_INITIALIZER;
static Run *_Atomic pending = NULL;
static _Atomic int finished = 0;
static _Atomic int busy = 0;
static _Atomic int sleeping = 0;
static pid_t thread_pid = 0; /* the process whose check thread exists (0: none yet) */

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void *check_thread(void *unused)
{
    (void)unused;
    for (;;) {
        Run *run = atomic_exchange(&pending, NULL);
        if (run == NULL) {
            long long until = now_ns() + SPIN_NS;
            while ((run = atomic_exchange(&pending, NULL)) == NULL && now_ns() < until) {
                for (int i = 0; i < 32; i++) {
                    CPU_RELAX();
                }
            }
        }
        if (run == NULL) {
            pthread_mutex_lock(&slot_lock);
            atomic_store(&sleeping, 1);
            while ((run = atomic_exchange(&pending, NULL)) == NULL) {
                pthread_cond_wait(&slot_changed, &slot_lock);
            }
            atomic_store(&sleeping, 0);
            pthread_mutex_unlock(&slot_lock);
        }
        do_run(run);
        atomic_store_explicit(&finished, 1, memory_order_release); /* the last touch of `run` */
    }
    return NULL;
}

/* Whether this process has a check thread (starting it if not: the first call, or a child
 * after fork(), where the parent's thread does not exist). Called with the GIL held. */
static int have_thread(void)
{
    pid_t pid = getpid();
    if (thread_pid == pid) {
        return 1;
    }
    pthread_mutex_init(&slot_lock, NULL);
    pthread_cond_init(&slot_changed, NULL);
    atomic_store(&pending, NULL);
    atomic_store(&finished, 0);
    atomic_store(&busy, 0);
    atomic_store(&sleeping, 0);
    pthread_attr_t attributes;
    pthread_t thread;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &attributes, check_thread, NULL);
    pthread_attr_destroy(&attributes);
    if (failed) {
        return 0;
    }
    thread_pid = pid;
    return 1;
}

static PyObject *configure(PyObject *module, PyObject *args)
{
    const char *path;
    const char *kind;
    (void)module;
    if (!PyArg_ParseTuple(args, "ss:configure", &path, &kind)) {
        return NULL;
    }
    int isal = strcmp(kind, "isal") == 0;
    if (!isal && strcmp(kind, "google") != 0) {
        return PyErr_Format(PyExc_ValueError, "configure: kind must be 'isal' or 'google', got %s", kind);
    }
    const char *symbol = isal ? "crc32_iscsi" : "crc32c_extend";
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        return PyErr_Format(PyExc_OSError, "configure: cannot load %s: %s", path, dlerror());
    }
    void *function = dlsym(library, symbol);
    if (function == NULL) {
        dlclose(library);
        return PyErr_Format(PyExc_OSError, "configure: %s has no %s", path, symbol);
    }
    /* Known answers (RFC 3720's 32 zero bytes; a byte crossing the int-length cut is never
     * asked of a check): a function that answers otherwise is not the CRC32C it claims. */
    static const uint8_t zeros[32] = {0};
    crc32c_extend_fn saved_google = google_extend;
    crc32_iscsi_fn saved_isal = isal_iscsi;
    if (isal) {
        isal_iscsi = (crc32_iscsi_fn)function;
    } else {
        google_extend = (crc32c_extend_fn)function;
        isal_iscsi = NULL;
    }
    if (crc32c_of(zeros, sizeof zeros) != 0x8A9136AAu || crc32c_of(zeros, 0) != 0) {
        google_extend = saved_google;
        isal_iscsi = saved_isal;
        return PyErr_Format(PyExc_OSError, "configure: %s of %s fails the CRC32C known answer", symbol, path);
    }
    Py_RETURN_NONE;
}

static PyObject *configured(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (isal_iscsi != NULL) {
        return PyUnicode_FromString("isal");
    }
    if (google_extend != NULL) {
        return PyUnicode_FromString("google");
    }
    Py_RETURN_NONE;
}

static PyObject *read_checked(PyObject *module, PyObject *args)
{
    int fd;
    Py_buffer target, blocks;
    long long offset;
    (void)module;
    if (isal_iscsi == NULL && google_extend == NULL) {
        return PyErr_Format(PyExc_RuntimeError, "read_checked: no CRC32C library configured");
    }
    if (!PyArg_ParseTuple(args, "iw*Ly*:read_checked", &fd, &target, &offset, &blocks)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t count = blocks.len / 8;
    long long total = 0;
    for (Py_ssize_t b = 0; b < count; b++) {
        total += be32((const unsigned char *)blocks.buf + 8 * b);
    }
    if (fd < 0 || offset < 0 || blocks.len % 8 != 0 || total != (long long)target.len) {
        PyErr_Format(PyExc_ValueError,
                     "read_checked: fd %d, offset %lld, and blocks of %lld bytes for a buffer of %zd", fd, offset,
                     total, target.len);
        goto done;
    }
    Run first = {fd, (char *)target.buf, (const unsigned char *)blocks.buf, offset, 0, count, 0, total, 0, -1, 0};
    Run second = first;
    int split = 0;
    if (total >= SPLIT_BYTES_MIN && count > 1 && have_thread()) {
        int expected = 0;
        split = atomic_compare_exchange_strong(&busy, &expected, 1);
    }
    if (split) { /* cut at the block boundary nearest the middle */
        long long at = 0;
        Py_ssize_t cut = 0;
        while (cut < count - 1 && at + be32(first.blocks + 8 * cut) <= total / 2) {
            at += be32(first.blocks + 8 * cut);
            cut++;
        }
        if (cut == 0) {
            at += be32(first.blocks);
            cut = 1;
        }
        first.end = cut;
        first.length = at;
        second.first = cut;
        second.start = at;
        second.length = total - at;
        atomic_store_explicit(&finished, 0, memory_order_relaxed);
        atomic_store_explicit(&pending, &second, memory_order_release);
        if (atomic_load(&sleeping)) {
            pthread_mutex_lock(&slot_lock);
            pthread_cond_signal(&slot_changed);
            pthread_mutex_unlock(&slot_lock);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    do_run(&first);
    Run *untaken = &second;
    if (split && atomic_compare_exchange_strong(&pending, &untaken, NULL)) {
        /* The check thread has not started the other half (a busy machine): do it here
         * rather than wait for a thread that may not get a core. */
        do_run(&second);
        atomic_store_explicit(&busy, 0, memory_order_release);
    } else if (split) {
        /* The other half takes about as long as this one did: spin, then (a slow device)
         * look every 20 us rather than keep a core busy. */
        long long until = now_ns() + WAIT_SPIN_NS;
        while (!atomic_load_explicit(&finished, memory_order_acquire)) {
            if (now_ns() < until) {
                CPU_RELAX();
            } else {
                struct timespec pause = {0, 20000};
                nanosleep(&pause, NULL);
            }
        }
        atomic_store_explicit(&busy, 0, memory_order_release);
    }
    Py_END_ALLOW_THREADS
    int error = first.error;
    long long read = first.read;
    Py_ssize_t bad = first.bad;
    if (split && error == 0 && read == first.length) { /* the second run counts only after a whole first */
        error = second.error;
        read += second.read;
        if (bad < 0) {
            bad = second.bad;
        }
    }
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = Py_BuildValue("Ln", read, bad);
done:
    PyBuffer_Release(&target);
    PyBuffer_Release(&blocks);
    return result;
}

static PyObject *covered(PyObject *module, PyObject *blocks)
{
    (void)module;
    if (!PyBytes_CheckExact(blocks) || PyBytes_GET_SIZE(blocks) % 8 != 0) {
        Py_RETURN_NONE;
    }
    const unsigned char *pairs = (const unsigned char *)PyBytes_AS_STRING(blocks);
    long long total = 0;
    for (Py_ssize_t at = 0; at < PyBytes_GET_SIZE(blocks); at += 8) {
        total += be32(pairs + at);
    }
    return PyLong_FromLongLong(total);
}

static PyMethodDef methods[] = {
    {"covered", covered, METH_O, "covered(blocks) -> bytes the block list covers, or None if it is not one."},
    {"configure", configure, METH_VARARGS,
     "configure(path, kind): load the CRC32C function of the library at path ('isal': crc32_iscsi, "
     "'google': crc32c_extend)."},
    {"configured", configured, METH_NOARGS, "configured() -> 'isal', 'google' or None: the CRC32C in use."},
    {"read_checked", read_checked, METH_VARARGS,
     "read_checked(fd, buffer, offset, blocks) -> (bytes read, first bad block or -1)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "slts.bindings._checked_reads", "slts.bindings.checked_reads' compiled twin.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__checked_reads(void)
{
    return PyModule_Create(&module_definition);
}
