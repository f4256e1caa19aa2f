"""Filesystem chunk storage (local disks, NFS): one file per chunk below a root folder.

Name mapping (``chunk_relpath``): the hierarchical path codec of ``hierarchical_paths``
with ``[A-Za-z0-9._-]`` kept (a component made only of dots has them encoded), folders
suffixed ``%``, an empty last component the file ``%2F``, components longer than one file
name (255 bytes) cut into ``~`` folders. No name can reach outside the root, and the chunk
``a`` and the chunk ``a/b`` never collide (file ``a`` vs. folder ``a%``). The folder
``%tmp`` below the root is reserved for chunks being created; ``list`` reports only files
whose path is the canonical path of the name they decode to, so temporary and foreign
files are never chunks.

Durability: ``create`` and ``concat`` write a temporary file, fsync it, hard-link it
under its final name (the link fails if the name exists: that is the exclusive create)
and fsync the folder; readers never see a partial chunk. ``write`` checks the length and
appends with ``O_APPEND`` under a per-name lock (threads) and ``flock`` (processes), then
``fdatasync``: of two writers at one offset exactly one wins. New folders are fsynced
into their parents.

Appends: the descriptor a ``write`` opened is kept for the chunk's next append
(``_Appenders``: the most recently appended chunks, at most ``APPENDERS_MAX``, none longer
than ``APPENDER_IDLE_S`` after its last append), so a segment's stream of small writes
does not walk the chunk's path, open and close its file each time (a quarter of a 4 KiB
write's CPU in the engine). Each append still takes the per-name lock and ``flock``, and
checks the file through the descriptor (``fstat``): its length and its mode (read-only).
A kept descriptor whose file has no name left (``st_nlink``: deleted by another process)
is closed and the append goes by the path, as without it: ``ChunkNotFound``, or the chunk
of that name created since. A delete through this binding drops the chunk's kept
descriptor under the same per-name lock, a failed append closes it, and ``close`` closes
them all. A file deleted by another process or binding (a takeover's GC, ``slts gc`` run
beside the owner) is held open, its space not yet free, until this binding's next append
to the name, until it ages out (noticed at the binding's next append to any chunk) or
until ``close``; a binding that never appends again holds at most ``APPENDERS_MAX`` such
files until it is closed.

Read-only is the file's mode bits, checked explicitly (root ignores them in the kernel).
Every ``OSError`` becomes a typed error in ``_translated``; typed errors pass through it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import stat
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from urllib.parse import unquote, urlparse

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkNotFound,
    ChunkReadOnly,
    ChunkStorageError,
    InvalidConfig,
    SltsError,
    StorageUnavailable,
)

from . import checked_reads
from .base import ChunkAppend, ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource
from .batched_syncs import SharedSyncs
from .hierarchical_paths import TMP_AGE_S_MAX as TMP_AGE_S_MAX  # re-exported: its age limit
from .hierarchical_paths import TMP_FOLDER, Entry, PathCodec, remove_stale
from .mapped_reads import FileMappings

#: Names as paths: dots kept (file names may hold them), 255-byte file names.
CODEC = PathCodec(
    safe=frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"),
    empty_file="%2F",
    component_bytes_max=255,
)
_COPY_BYTES = 8 << 20
_LOCK_STRIPES = 64
#: Reads up to this long are issued before the file's size is known (see ``_do_read``).
_DIRECT_READ_BYTES_MAX = 1 << 20
_LINK_ATTEMPTS_MAX = 16
#: Appended chunks whose descriptor is kept open for their next append (module doc), and
#: for how long after their last append.
APPENDERS_MAX = 64
APPENDER_IDLE_S = 10.0
#: The most data syncs one AIO submission carries (``write_together``: more go in turns).
SYNCS_TOGETHER_MAX = 64

_RETRYABLE_ERRNOS = {errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE, errno.EBUSY}
#: copy_file_range cannot serve these files: copy through user space instead.
_NO_COPY_RANGE_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}


@functools.lru_cache(maxsize=16384)  # every call of the binding maps a name: the codec's walk once per name
def chunk_relpath(name: str) -> str:
    """The path of chunk ``name`` relative to the root (see module doc); no part of it is
    ``..``, so the path stays under the root (checked once per name: the result is kept)."""
    relpath = CODEC.relpath(name)
    assert ".." not in relpath.split("/"), (name, relpath)
    return relpath


class _translated:
    """The one place where OS errors become typed chunk storage errors: ``with
    _translated(name, binding):`` (a class, not a generator: every call of the binding
    passes here)."""

    __slots__ = ("binding", "name")

    def __init__(self, name: str, binding: str) -> None:
        self.name = name
        self.binding = binding

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, trace: object) -> None:
        if isinstance(exc, OSError) and not isinstance(exc, SltsError):
            raise _typed(exc, self.name, self.binding) from exc
        # none, not an OS error, or typed already (ChunkNotFound is an OSError too): as it is


def _typed(exc: OSError, name: str, binding: str) -> SltsError:
    """The typed chunk storage error for ``exc``, an OS error of a call on chunk ``name``
    (``_translated``'s mapping; the read path's ``except`` clauses call it directly: a
    ``with`` block costs each read a tenth of a microsecond more than a ``try``)."""
    code = exc.errno
    if code == errno.ENOENT:
        return ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=binding)
    if code == errno.EEXIST:
        return ChunkExists(f"chunk {name!r} exists", chunk=name, binding=binding)
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ChunkReadOnly(f"chunk {name!r}: {exc.strerror}", chunk=name, binding=binding)
    if code == errno.ENAMETOOLONG:
        return ChunkNameInvalid(f"chunk name too long: {name[:60]!r}", chunk=name)
    error = StorageUnavailable if code in _RETRYABLE_ERRNOS else ChunkStorageError
    return error(f"chunk {name!r}: {exc.strerror} (errno {code})", chunk=name, binding=binding)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _lock_file(fd: int) -> None:
    """``flock`` against writers in other processes, where the filesystem offers it.

    NFS without a lock daemon answers ENOLCK: the in-process lock still orders this
    process's writers, and the single-writer rule (epochs) orders processes.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise


def _unlock_file(fd: int) -> None:
    """Release ``_lock_file``'s ``flock`` (where the filesystem offered it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise


class _Appenders:
    """Open write descriptors of recently appended chunks, by name: at most ``limit``, none
    kept longer than ``idle_s`` after its last append (least recently kept first out). A
    writer *takes* a chunk's descriptor (it leaves the set while in use) and *keeps* it
    again after a successful append; the binding's per-name lock is held around both, so
    one descriptor has one user at a time. Each take and keep closes what aged out, so a
    file deleted by another process is held open at most ``idle_s`` past this binding's
    last append to it while the binding is in use (module doc)."""

    def __init__(self, limit: int, idle_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        assert limit >= 0 and idle_s >= 0
        self._limit = limit
        self._idle_s = idle_s
        self._clock = clock
        self._open: dict[str, tuple[int, float]] = {}  # name -> (fd, kept at); oldest first
        self._lock = threading.Lock()

    def take(self, name: str) -> int | None:
        """The kept descriptor of ``name``, now the caller's (None: none kept)."""
        with self._lock:
            kept = self._open.pop(name, None)
            aged = self._aged(self._clock())
        self._close(aged)
        return kept[0] if kept is not None else None

    def keep(self, name: str, fd: int) -> None:
        """Keep ``fd`` for ``name``'s next append; closes what is beyond the limit (``fd``
        itself with a limit of 0) or aged out."""
        now = self._clock()
        with self._lock:
            assert name not in self._open, "a descriptor is kept by the writer that took it"
            self._open[name] = (fd, now)
            closing = self._aged(now)
            while len(self._open) > self._limit:
                closing.append(self._open.pop(next(iter(self._open)))[0])
        self._close(closing)

    def _aged(self, now: float) -> list[int]:
        """Remove and return the descriptors kept longer than ``idle_s`` (lock held)."""
        aged: list[int] = []
        while self._open:
            oldest = next(iter(self._open))
            fd, kept_at = self._open[oldest]
            if now - kept_at <= self._idle_s:
                break
            del self._open[oldest]
            aged.append(fd)
        return aged

    @staticmethod
    def _close(fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)

    def drop(self, name: str) -> None:
        """Close ``name``'s kept descriptor, if any (the chunk is being deleted)."""
        fd = self.take(name)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every kept descriptor."""
        with self._lock:
            kept, self._open = [fd for fd, _ in self._open.values()], {}
        self._close(kept)

    def __len__(self) -> int:
        return len(self._open)


def _remove_empty_folder(path: str) -> bool:
    """``rmdir``: False if the folder is not empty (or gone)."""
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _entries(folder: str) -> list[Entry]:
    """The files and folders in ``folder`` (none if it is missing); links are no chunks."""
    try:
        with os.scandir(folder) as found:
            entries = list(found)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [
        Entry(entry.name, folder=entry.is_dir(follow_symlinks=False))
        for entry in entries
        if entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False)
    ]


def _copy_range(source_fd: int, target_fd: int, offset: int, length: int) -> int:
    """Copy up to ``length`` bytes from ``offset`` to the target's position; bytes copied."""
    step = min(length, _COPY_BYTES)
    if hasattr(os, "copy_file_range"):
        try:
            return os.copy_file_range(source_fd, target_fd, step, offset)
        except OSError as exc:
            if exc.errno not in _NO_COPY_RANGE_ERRNOS:
                raise
    data = os.pread(source_fd, step, offset)
    _write_all(target_fd, data)
    return len(data)


class FileSystemChunkStorage(ChunkStorage):
    """Chunks as files below ``root``. Supports append, concat (copy), truncate, read-only."""

    supports_append = True
    supports_concat = True
    supports_truncate = True
    supports_readonly = True
    checks_as_it_reads = checked_reads.NATIVE is not None  # ``read_into_checked``: one compiled pass
    maps_reads = True  # ``read_view``: slices of the files' shared mappings (``mapped_reads``)

    def __init__(self, root: str, url: str | None = None) -> None:
        if not root:
            raise InvalidConfig("filesystem binding needs a root folder")
        self.root = os.path.abspath(root)
        self._root_prefix = os.path.join(self.root, "")  # + a chunk's relpath: its path
        if not self.root.strip(os.sep):  # "/", and "//", which paths keep apart
            raise InvalidConfig(
                "the filesystem binding's root must be a folder of its own, not the file system's"
                " root / (file:/// names it): give a folder, e.g. file:///var/lib/slts/chunks"
            )
        self.url = url or f"file://{self.root}"
        self._tmp = os.path.join(self.root, TMP_FOLDER)
        # Writers of one chunk in this process take the same stripe (flock alone is per
        # process on NFS); the check of the length and the append happen under it.
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))
        self._mappings = FileMappings()
        self._appenders = _Appenders(APPENDERS_MAX, APPENDER_IDLE_S)
        self._syncs = SharedSyncs(SYNCS_TOGETHER_MAX)
        # Deletes in flight per folder (see ``_do_delete``); no entry at zero.
        self._deleting: dict[str, int] = {}
        self._deleting_lock = threading.Lock()
        with _translated(self.root, self.url):
            os.makedirs(self._tmp, exist_ok=True)
            _fsync_dir(self.root)
        self._remove_stale_tmp()

    @classmethod
    def from_url(cls, url: str) -> FileSystemChunkStorage:
        """``file:///absolute/path`` (or ``file://relative/path`` for a relative root)."""
        parsed = urlparse(url)
        path = unquote(parsed.netloc + parsed.path)
        if not path:
            raise InvalidConfig(f"file URL has no path: {url!r}")
        return cls(path, url=url)

    # -- paths and locks ----------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return self._root_prefix + chunk_relpath(name)

    def _lock(self, name: str) -> threading.Lock:
        return self._locks[self._stripe(name)]

    @staticmethod
    def _stripe(name: str) -> int:
        """The index of ``name``'s stripe lock."""
        return zlib.crc32(name.encode("utf-8", "surrogatepass")) % _LOCK_STRIPES

    @contextlib.contextmanager
    def _open_for_change(self, handle: ChunkHandle, flags: int) -> Iterator[tuple[int, os.stat_result]]:
        """Open ``handle``'s file for a change, locked against other writers of it.

        Yields the descriptor and its stat; refuses read-only chunks (``ChunkStorage``
        refused read-only handles).
        """
        path = self._path(handle.name)
        with self._lock(handle.name), _translated(handle.name, self.url):
            fd = os.open(path, flags)
            try:
                _lock_file(fd)
                st = os.fstat(fd)
                if not st.st_mode & stat.S_IWUSR:
                    raise ChunkReadOnly(
                        f"chunk {handle.name!r} is read-only", chunk=handle.name, binding=self.url
                    )
                yield fd, st
            finally:
                os.close(fd)  # also releases the flock

    def _ensure_parent(self, path: str) -> None:
        """Create missing folders up to ``path``'s parent, each fsynced into its own parent."""
        parent = os.path.dirname(path)
        missing = []
        while parent != self.root and not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for folder in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder)
            _fsync_dir(os.path.dirname(folder))

    def _remove_stale_tmp(self) -> None:
        ages: list[tuple[str, float]] = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._tmp):
                with contextlib.suppress(OSError):
                    ages.append((entry.name, entry.stat(follow_symlinks=False).st_mtime))

        def remove(name: str) -> None:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self._tmp, name))

        remove_stale(ages, time.time(), remove)

    def _publish(self, name: str, fill) -> ChunkHandle:  # noqa: ANN001 - fill(fd) -> None
        """Write a temporary file with ``fill``, then link it as ``name`` (exclusive)."""
        path = self._path(name)
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        with _translated(name, self.url):
            fd = self._open_temporary(tmp)
            try:
                try:
                    fill(fd)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                for attempt in range(_LINK_ATTEMPTS_MAX):
                    try:
                        self._ensure_parent(path)
                        os.link(tmp, path)
                        break
                    except FileNotFoundError:
                        # A delete pruned a (then empty) folder between our mkdir and link.
                        if attempt + 1 == _LINK_ATTEMPTS_MAX or not os.path.exists(tmp):
                            raise
                _fsync_dir(os.path.dirname(path))
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return ChunkHandle(name, readonly=False)

    def _open_temporary(self, tmp: str) -> int:
        """A new temporary file ``tmp`` in the root's temporary folder, which is made again
        if something removed it since this instance made it (an operator's clean-up, a
        copy's removal: a binding kept for a long time, as a Spark worker keeps its own,
        would otherwise fail every create). Never makes the root: a root that is gone
        raises ``ChunkStorageError`` naming the temporary folder, not the chunk (whose
        ``ChunkNotFound`` pointed at the wrong thing)."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            return os.open(tmp, flags, 0o644)
        except FileNotFoundError:
            pass
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self._tmp)
                _fsync_dir(self.root)
            return os.open(tmp, flags, 0o644)
        except FileNotFoundError as exc:  # any other error is typed as every call's is
            raise ChunkStorageError(
                f"the binding's temporary folder {self._tmp!r} cannot be used: {exc.strerror}"
                f" (errno {exc.errno}); is the root {self.root!r} still there?",
                binding=self.url,
            ) from exc

    # -- hooks (arguments checked by ChunkStorage) ------------------------------------------------

    def _do_exists(self, name: str) -> bool:
        path = self._path(name)
        with _translated(name, self.url):
            try:
                return stat.S_ISREG(os.stat(path).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                return False

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        return self._publish(name, lambda fd: _write_all(fd, data))

    def _do_delete(self, handle: ChunkHandle) -> None:
        """Unlink the chunk's file, then remove the folders it leaves empty.

        Pruning is left to the last of the deletes in flight in the folder in this
        process (counted in ``_deleting``): it runs after every one of them has
        unlinked, failed or not, so a folder they empty is still removed, and a GC batch
        deleting thousands of chunks of one folder on many threads tries one ``rmdir``
        instead of one per chunk (each a failing syscall that takes the folder's lock
        the unlinks beside it need). Not fsynced: an empty folder that reappears after a
        crash is harmless. A create racing with this retries its link (``_publish``)."""
        path = self._path(handle.name)
        folder = path.rpartition("/")[0]
        with self._deleting_lock:
            self._deleting[folder] = self._deleting.get(folder, 0) + 1
        try:
            with self._lock(handle.name), _translated(handle.name, self.url):
                self._appenders.drop(handle.name)  # no append is in flight: it holds the lock
                os.unlink(path)
            self._mappings.forget(handle.name)  # its disk space goes with the last view of it
        finally:
            with self._deleting_lock:
                left = self._deleting[folder] - 1
                if left:
                    self._deleting[folder] = left
                else:
                    del self._deleting[folder]
            assert left >= 0, (folder, left)
            if not left:
                CODEC.prune_folders(self.root, path, _remove_empty_folder)

    def _stat(self, name: str) -> os.stat_result:
        with _translated(name, self.url):
            try:
                st = os.stat(self._path(name))
            except NotADirectoryError as exc:
                raise FileNotFoundError(errno.ENOENT, "not found") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=self.url)
        return st

    def _do_open_read(self, name: str) -> ChunkHandle:
        self._stat(name)
        return ChunkHandle(name, readonly=True)

    def _do_open_write(self, name: str) -> ChunkHandle:
        if not self._stat(name).st_mode & stat.S_IWUSR:
            raise ChunkReadOnly(f"chunk {name!r} is read-only", chunk=name, binding=self.url)
        return ChunkHandle(name, readonly=False)

    def _do_get_info(self, name: str) -> ChunkInfo:
        return ChunkInfo(name, self._stat(name).st_size)

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        name = handle.name
        try:  # (``_translated``'s mapping, as a ``try``: the read path's every call passes here)
            fd = os.open(self._path(name), os.O_RDONLY)
            try:
                # A small read first reads, then asks the size only if it came back short
                # (a read clipped at the end; no stat in the common case). A large one
                # asks first: pread allocates all the length it is given.
                data = os.pread(fd, length, offset) if 0 < length <= _DIRECT_READ_BYTES_MAX else b""
                if data and len(data) == length:
                    return data
                size = os.fstat(fd).st_size
                if offset > size:
                    raise ChunkInvalidOffset(
                        f"chunk {name!r}: read at {offset} past its end {size}", chunk=name, offset=offset
                    )
                pieces = [data] if data else []
                position, end = offset + len(data), offset + min(length, size - offset)
                while position < end:  # a short read below the end (a signal, a file growing)
                    piece = os.pread(fd, end - position, position)
                    if not piece:
                        break
                    pieces.append(piece)
                    position += len(piece)
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            finally:
                os.close(fd)
        except OSError as exc:
            if isinstance(exc, SltsError):
                raise
            raise _typed(exc, name, self.url) from exc

    def _do_read_into(self, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        with _translated(handle.name, self.url):
            fd = os.open(self._path(handle.name), os.O_RDONLY)
            try:
                return self._clipped(fd, handle, offset, view, checked_reads.pread_into(fd, view, offset))
            finally:
                os.close(fd)

    def _do_read_into_checked(self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes) -> int:
        """One call of ``checked_reads.read_checked`` on the chunk's file: the copy and
        the check in one pass, on two cores for a large range."""
        with _translated(handle.name, self.url):
            fd = os.open(self._path(handle.name), os.O_RDONLY)
            try:
                done, bad = checked_reads.read_checked(fd, view, offset, blocks)
                if bad >= 0:
                    raise checked_reads.corrupted(handle.name, offset, blocks, bad)
                return self._clipped(fd, handle, offset, view, done)
            finally:
                os.close(fd)

    @staticmethod
    def _clipped(fd: int, handle: ChunkHandle, offset: int, view: memoryview, done: int) -> int:
        """``done``, the bytes a read put in ``view``; ``ChunkInvalidOffset`` if the read
        began past the file's end."""
        if done < len(view) and offset > os.fstat(fd).st_size:
            raise ChunkInvalidOffset(
                f"chunk {handle.name!r}: read at {offset} past its end",
                chunk=handle.name,
                offset=offset,
            )
        return done

    def close(self) -> None:
        """Drop the kept mappings (views handed out stay valid) and close the kept append
        descriptors. Idempotent; a later call opens what it needs again."""
        self._mappings.clear()
        self._appenders.close()
        self._syncs.close()

    def _do_read_view(self, handle: ChunkHandle, offset: int, length: int) -> memoryview:
        """A slice of the file's shared read-only mapping (``mapped_reads``); a copy when
        no mapping can be had."""
        with _translated(handle.name, self.url):
            try:
                view = self._mappings.view(handle.name, self._path(handle.name), offset, length)
            except ValueError as exc:
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: read at {offset} {exc}", chunk=handle.name, offset=offset
                ) from exc
        return view if view is not None else memoryview(self._do_read(handle, offset, length))

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        """One append, as ``_do_write_together`` does each (its sync a plain ``fdatasync``)."""
        append = ChunkAppend(handle, offset, data)
        with self._lock(handle.name), _translated(handle.name, self.url):
            fd = self._append_unsynced(append)
            try:
                os.fdatasync(fd)
            except BaseException:
                self._end_append(fd, append, synced=False)
                raise
            self._end_append(fd, append, synced=True)
        return len(data)

    def _do_write_together(self, appends: Sequence[ChunkAppend]) -> list[int | Exception]:
        """Every append through its chunk's kept descriptor (or by the path: module doc),
        under its name's stripe lock and ``flock``, checked and written; then their data
        syncs issued together (``SharedSyncs``); then each descriptor unlocked and kept,
        or, for an append whose write or sync failed, cut back and closed."""
        stripes = sorted({self._stripe(append.handle.name) for append in appends})
        results: list[int | Exception] = []
        written: list[tuple[int, int]] = []  # (position in appends, descriptor)
        for index in stripes:
            self._locks[index].acquire()
        try:
            try:
                for position, append in enumerate(appends):
                    try:
                        with _translated(append.handle.name, self.url):
                            written.append((position, self._append_unsynced(append)))
                        results.append(len(append.data))
                    except SltsError as error:
                        results.append(error)
                synced = self._syncs.sync_each([fd for _, fd in written])
            except BaseException:  # interrupted: nothing of this call stays written
                synced = [OSError(errno.EINTR, "interrupted")] * len(written)
                self._end_appends(appends, written, synced, results)
                raise
            self._end_appends(appends, written, synced, results)
        finally:
            for index in reversed(stripes):
                self._locks[index].release()
        return results

    def _end_appends(
        self,
        appends: Sequence[ChunkAppend],
        written: list[tuple[int, int]],
        synced: list[OSError | None],
        results: list[int | Exception],
    ) -> None:
        """End every written append (``written``: its position, its descriptor): kept if
        its sync succeeded, else cut back, closed and its result the typed error."""
        for (position, fd), failure in zip(written, synced, strict=True):
            append = appends[position]
            if failure is not None:
                results[position] = _typed(failure, append.handle.name, self.url)
            self._end_append(fd, append, synced=failure is None)

    def _append_unsynced(self, append: ChunkAppend) -> int:
        """``append``'s bytes written, not yet synced, through the chunk's kept descriptor,
        or by the path when none is kept or its file has no name left (deleted elsewhere);
        the descriptor returned holds the file's ``flock``. On an error nothing is left
        written, locked or open."""
        name = append.handle.name
        fd = self._appenders.take(name)
        if fd is not None and self._begin_append(fd, append, kept=True):
            return fd
        fd = os.open(self._path(name), os.O_WRONLY | os.O_APPEND)
        self._begin_append(fd, append, kept=False)
        return fd

    def _begin_append(self, fd: int, append: ChunkAppend, *, kept: bool) -> bool:
        """``flock`` ``fd``, check its file (one ``fstat``) and write ``append``'s bytes.
        False when ``fd`` was ``kept`` and its file has no name left (``fd`` closed,
        nothing written); on an error the bytes are cut back and ``fd`` closed."""
        done = False
        try:
            _lock_file(fd)
            try:
                st = os.fstat(fd)
                if kept and st.st_nlink == 0:
                    return False
                self._check_appendable(st, append.handle.name, append.offset)
                try:
                    _write_all(fd, append.data)
                except OSError:
                    # Best effort: a failed append (ENOSPC, EIO) leaves the chunk as it was.
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, append.offset)
                    raise
                done = True
            finally:
                if not done:
                    _unlock_file(fd)
        finally:
            if not done:
                os.close(fd)
        return True

    def _end_append(self, fd: int, append: ChunkAppend, *, synced: bool) -> None:
        """End ``_begin_append``'s append through ``fd``: if it was not ``synced``, cut the
        chunk back (best effort: the chunk as it was); release the ``flock``; keep ``fd``
        for the chunk's next append after a synced one, else close it."""
        kept = synced
        if not synced:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, append.offset)
        try:
            _unlock_file(fd)
        except OSError:
            kept = False
        if kept:
            self._appenders.keep(append.handle.name, fd)
        else:
            os.close(fd)

    def _check_appendable(self, st: os.stat_result, name: str, offset: int) -> None:
        """``st``, an open chunk's: still named (a delete may race an open by path),
        writable, ``offset`` long; the typed error otherwise."""
        if st.st_nlink == 0:
            raise ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=self.url)
        if not st.st_mode & stat.S_IWUSR:
            raise ChunkReadOnly(f"chunk {name!r} is read-only", chunk=name, binding=self.url)
        if st.st_size != offset:
            raise ChunkInvalidOffset(
                f"chunk {name!r}: write at {offset}, but its length is {st.st_size}",
                chunk=name,
                offset=offset,
            )

    def _do_list(self, prefix: str) -> Iterator[str]:
        with _translated(prefix, self.url):
            return iter(CODEC.names_below(self.root, prefix, _entries))

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        if self.exists(target):
            raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url)
        for source in sources:
            size = self._stat(source.name).st_size
            if source.offset + source.length > size:
                raise ChunkInvalidOffset(
                    f"concat source {source.name!r}: range {source.offset}+{source.length} "
                    f"past its end {size}",
                    chunk=source.name,
                    offset=source.offset,
                )

        def fill(fd: int) -> None:
            for source in sources:
                with _translated(source.name, self.url):
                    src = os.open(self._path(source.name), os.O_RDONLY)
                    try:
                        offset, remaining = source.offset, source.length
                        while remaining:
                            copied = _copy_range(src, fd, offset, remaining)
                            if copied == 0:
                                raise ChunkInvalidOffset(
                                    f"concat source {source.name!r} shrank while copying",
                                    chunk=source.name,
                                    offset=offset,
                                )
                            offset += copied
                            remaining -= copied
                    finally:
                        os.close(src)

        self._publish(target, fill)
        return ChunkInfo(target, sum(source.length for source in sources))

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        with self._open_for_change(handle, os.O_WRONLY) as (fd, st):
            if length > st.st_size:
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: cannot truncate to {length} > {st.st_size}",
                    chunk=handle.name,
                    offset=length,
                )
            os.ftruncate(fd, length)
            os.fsync(fd)

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        path = self._path(handle.name)
        with self._lock(handle.name):
            self._stat(handle.name)
            with _translated(handle.name, self.url):
                os.chmod(path, 0o444 if readonly else 0o644)
