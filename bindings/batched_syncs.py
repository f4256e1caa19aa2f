"""Many files' data syncs issued together from one thread: Linux native AIO.

``fdatasync`` blocks its thread until the one file is on disk, so eight files synced by
one thread take eight round trips to the device, one after the other (on this project's
test machine a third to a quarter of eight threads syncing at once). Linux's native AIO
accepts an ``IOCB_CMD_FDSYNC`` request per file in one ``io_submit`` call (kernel 4.18 and
later), runs them concurrently and reports each one's outcome to ``io_getevents``: one
thread, one wait, every file's data on disk when it returns.

The filesystem binding's ``write_together`` syncs a group of appends with it (the engine's
combined small appends, ``slts.storage.chunked``); ``slts bench`` measures a floor with it
(``write_4k_x8_floor_one_thread``). Through ``ctypes`` (the calls release the
interpreter's lock while they block); no library in the project's dependencies offers
AIO's sync requests. ``sync_each`` is the one entry point: it uses AIO where this system
has it and falls back to one ``fdatasync`` after the other where it does not.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading
from collections.abc import Sequence

from slts.errors import InvalidConfig

#: System call numbers (io_setup, io_destroy, io_getevents, io_submit) per machine.
_SYSCALLS = {
    "x86_64": (206, 207, 208, 209),
    "aarch64": (0, 1, 4, 2),
}
_IOCB_CMD_FDSYNC = 3


class _ControlBlock(ctypes.Structure):
    """``struct iocb`` of ``linux/aio_abi.h`` (64 bytes, little-endian field order)."""

    _fields_ = [
        ("data", ctypes.c_uint64),
        ("key", ctypes.c_uint32),
        ("rw_flags", ctypes.c_int32),
        ("opcode", ctypes.c_uint16),
        ("reqprio", ctypes.c_int16),
        ("fildes", ctypes.c_uint32),
        ("buf", ctypes.c_uint64),
        ("nbytes", ctypes.c_uint64),
        ("offset", ctypes.c_int64),
        ("reserved2", ctypes.c_uint64),
        ("flags", ctypes.c_uint32),
        ("resfd", ctypes.c_uint32),
    ]


class _Event(ctypes.Structure):
    """``struct io_event``: the request's ``data``, its address, its result (or -errno)."""

    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


assert ctypes.sizeof(_ControlBlock) == 64 and ctypes.sizeof(_Event) == 32


class BatchedSyncs:
    """An AIO context for up to ``depth`` syncs at once; ``sync_all`` makes files durable.

    ``InvalidConfig`` when this system has no native AIO (another operating system or
    machine, or AIO turned off in the kernel). Not thread-safe: one thread uses one
    instance. ``close`` frees the kernel's context.
    """

    def __init__(self, depth: int) -> None:
        assert depth >= 1
        numbers = _SYSCALLS.get(platform.machine())
        if os.name != "posix" or platform.system() != "Linux" or numbers is None:
            raise InvalidConfig(
                f"batched syncs need Linux native AIO on x86_64 or aarch64, "
                f"not {platform.system()} on {platform.machine()}"
            )
        self._setup, self._destroy, self._getevents, self._submit = numbers
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._libc.syscall.restype = ctypes.c_long
        self._depth = depth
        self._context = ctypes.c_ulong(0)
        if self._call(self._setup, ctypes.c_long(depth), ctypes.byref(self._context)) < 0:
            raise InvalidConfig(f"Linux native AIO is not available: {os.strerror(ctypes.get_errno())}")
        self._closed = False

    def _call(self, number: int, *arguments: object) -> int:
        """One system call, retried on EINTR; its result (< 0: errno is set)."""
        while True:
            result = int(self._libc.syscall(ctypes.c_long(number), *arguments))
            if result >= 0 or ctypes.get_errno() != errno.EINTR:
                return result

    def sync_all(self, fds: Sequence[int]) -> list[OSError | None]:
        """Make the data of every file in ``fds`` durable (as ``fdatasync`` of each), the
        syncs issued together; returns once all have ended, with each one's outcome (None:
        durable). A request the kernel refuses at submission (a kernel before 4.18 has no
        AIO sync: EINVAL) is run as a plain ``fdatasync``. Raises ``OSError`` only when the
        context itself fails (``io_getevents``): then no outcome is known."""
        assert not self._closed and 0 < len(fds) <= self._depth
        count = len(fds)
        blocks = (_ControlBlock * count)()
        pointers = (ctypes.POINTER(_ControlBlock) * count)()
        for i, fd in enumerate(fds):
            blocks[i].opcode = _IOCB_CMD_FDSYNC
            blocks[i].fildes = fd
            blocks[i].data = i
            pointers[i] = ctypes.pointer(blocks[i])
        submitted = 0
        while submitted < count:
            taken = self._call(
                self._submit,
                self._context,
                ctypes.c_long(count - submitted),
                ctypes.byref(pointers, submitted * ctypes.sizeof(ctypes.c_void_p)),
            )
            if taken < 0:
                break  # the rest are synced one by one below
            submitted += taken
        events = (_Event * count)()
        ended = 0
        while ended < submitted:
            got = self._call(
                self._getevents,
                self._context,
                ctypes.c_long(1),
                ctypes.c_long(submitted - ended),
                ctypes.byref(events, ended * ctypes.sizeof(_Event)),
                None,
            )
            if got < 0:
                code = ctypes.get_errno()
                raise OSError(code, f"io_getevents: {os.strerror(code)}")  # the context is unusable
            ended += got
        outcomes: list[OSError | None] = [None] * count
        for event in events[:ended]:
            if event.res < 0:
                outcomes[event.data] = OSError(-event.res, os.strerror(-event.res))
        for i in range(submitted, count):
            outcomes[i] = _fdatasync(fds[i])
        return outcomes

    def close(self) -> None:
        """Free the kernel's context (idempotent)."""
        if not self._closed:
            self._closed = True
            self._call(self._destroy, self._context)


def _fdatasync(fd: int) -> OSError | None:
    """``fdatasync(fd)``'s outcome: None, or its error."""
    try:
        os.fdatasync(fd)
    except OSError as error:
        return error
    return None


class SharedSyncs:
    """Batched syncs for many threads: a free list of ``BatchedSyncs`` contexts (one per
    call in flight, made on demand, at most ``depth`` syncs each), or one ``fdatasync``
    after the other where this system has no native AIO. Thread-safe; ``close`` frees
    the contexts (a later call makes new ones)."""

    def __init__(self, depth: int) -> None:
        assert depth >= 1
        self._depth = depth
        self._lock = threading.Lock()
        self._free: list[BatchedSyncs] = []
        self._unavailable = False
        self._pid = os.getpid()  # an AIO context serves the process that made it only

    def sync_each(self, fds: Sequence[int]) -> list[OSError | None]:
        """Each file's data of ``fds`` durable, as ``fdatasync`` of each: its outcome
        (None: durable), in order. One file is synced directly (no AIO round trip)."""
        if len(fds) <= 1:
            return [_fdatasync(fd) for fd in fds]
        outcomes: list[OSError | None] = []
        for start in range(0, len(fds), self._depth):
            outcomes += self._sync_batch(fds[start : start + self._depth])
        return outcomes

    def _sync_batch(self, fds: Sequence[int]) -> list[OSError | None]:
        context = self._take()
        if context is None:
            return [_fdatasync(fd) for fd in fds]
        try:
            outcomes = context.sync_all(fds)
        except OSError:  # the context broke: nothing known; each file synced again, plainly
            context.close()
            return [_fdatasync(fd) for fd in fds]
        with self._lock:
            self._free.append(context)
        return outcomes

    def _take(self) -> BatchedSyncs | None:
        """A free context, a new one, or None where AIO is not available here."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's contexts are not its own
                self._free, self._pid = [], os.getpid()
            if self._free:
                return self._free.pop()
            if self._unavailable:
                return None
        try:
            return BatchedSyncs(self._depth)
        except InvalidConfig:
            with self._lock:
                self._unavailable = True
            return None

    def close(self) -> None:
        """Free every idle context (idempotent)."""
        with self._lock:
            free, self._free = self._free, []
        for context in free:
            context.close()
