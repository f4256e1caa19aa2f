"""Filesystem chunk storage (local disks, NFS): one file per chunk below a root folder.

Name mapping (``chunk_relpath``): a chunk name is split on ``/``; every component is
percent-encoded so only ``[A-Za-z0-9._-]`` and ``%XX`` remain, a component made only of
dots (``.``, ``..``) has its dots encoded, folders get the suffix ``%`` and an empty last
component becomes ``%2F``. A component whose encoding does not fit in one file name
(255 bytes) has all its dots encoded and is cut into pieces: every piece but the last
becomes a folder with the suffix ``~``. Encoded names never contain ``~`` and never end
in a lone ``%``, so a path parses back uniquely (``~`` folder: the component goes on;
``%`` folder: the component ends; file: the last component), no part is ``.``/``..``,
no name can reach outside the root, and the chunk ``a`` and the chunk ``a/b`` never
collide (file ``a`` vs. folder ``a%``). The folder ``%tmp`` below the root is reserved for
chunks being created; ``list`` reports only files whose path is the canonical path of
the name they decode to, so temporary and foreign files are never chunks.

Durability: ``create`` and ``concat`` write a temporary file, fsync it, hard-link it
under its final name (the link fails if the name exists: that is the exclusive create)
and fsync the folder; readers never see a partial chunk. ``write`` checks the length and
appends with ``O_APPEND`` under a per-name lock (threads) and ``flock`` (processes), then
``fdatasync``: of two writers at one offset exactly one wins. New folders are fsynced
into their parents.

Read-only is the file's mode bits, checked explicitly (root ignores them in the kernel).
Every ``OSError`` becomes a typed error in ``_translated``; typed errors pass through it.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
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

from .base import (
    CHUNK_NAME_BYTES_MAX,
    ChunkHandle,
    ChunkInfo,
    ChunkStorage,
    ConcatSource,
    check_concat_sources,
    check_name,
    check_range,
)

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_DIR_SUFFIX = "%"
_CONTINUED_SUFFIX = "~"
_EMPTY_FILE = "%2F"
_TMP_DIR = "%tmp"
_FILE_NAME_BYTES_MAX = 255
_PIECE_BYTES_MAX = _FILE_NAME_BYTES_MAX - 1  # room for one suffix character
_COPY_BYTES = 8 << 20
_LOCK_STRIPES = 64
_LINK_ATTEMPTS_MAX = 16
#: Temporary files older than this are debris of a crash and are removed at start.
TMP_AGE_S_MAX = 3600.0

_RETRYABLE_ERRNOS = {errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE, errno.EBUSY}
#: copy_file_range cannot serve these files: copy through user space instead.
_NO_COPY_RANGE_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP}


def _percent_encode(component: str) -> str:
    return "".join(
        ch if ch in _SAFE else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        for ch in component
    )


def _component_parts(component: str, folder: bool) -> list[str]:
    """The path parts of one ``/``-separated component (see module doc)."""
    if not component and not folder:
        return [_EMPTY_FILE]
    suffix = _DIR_SUFFIX if folder else ""
    encoded = _percent_encode(component)
    if encoded and encoded.strip(".") == "":
        encoded = encoded.replace(".", "%2E")
    if len(encoded) + len(suffix) <= _FILE_NAME_BYTES_MAX:
        return [encoded + suffix]
    # Too long for one file name. With every dot encoded no piece can be "." or "..".
    encoded = encoded.replace(".", "%2E")
    pieces = [encoded[i : i + _PIECE_BYTES_MAX] for i in range(0, len(encoded), _PIECE_BYTES_MAX)]
    return [piece + _CONTINUED_SUFFIX for piece in pieces[:-1]] + [pieces[-1] + suffix]


def _decode_component(encoded: str) -> str:
    return unquote(encoded, encoding="utf-8", errors="surrogatepass")


def _folder_parts(folders: Sequence[str]) -> list[str]:
    return [part for folder in folders for part in _component_parts(folder, folder=True)]


def chunk_relpath(name: str) -> str:
    """The path of chunk ``name`` relative to the root (see module doc)."""
    *folders, last = check_name(name).split("/")
    parts = _folder_parts(folders) + _component_parts(last, folder=False)
    for part in parts:
        assert part not in ("", ".", "..") and len(part) <= _FILE_NAME_BYTES_MAX, (name, part)
    return os.path.join(*parts)


@contextlib.contextmanager
def _translated(name: str, binding: str) -> Iterator[None]:
    """The one place where OS errors become typed chunk storage errors."""
    try:
        yield
    except SltsError:
        raise  # already typed (ChunkNotFound and ChunkReadOnly are OSErrors too)
    except OSError as exc:
        code = exc.errno
        if code == errno.ENOENT:
            raise ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=binding) from exc
        if code == errno.EEXIST:
            raise ChunkExists(f"chunk {name!r} exists", chunk=name, binding=binding) from exc
        if code in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ChunkReadOnly(f"chunk {name!r}: {exc.strerror}", chunk=name, binding=binding) from exc
        if code == errno.ENAMETOOLONG:
            raise ChunkNameInvalid(f"chunk name too long: {name[:60]!r}", chunk=name) from exc
        error = StorageUnavailable if code in _RETRYABLE_ERRNOS else ChunkStorageError
        raise error(f"chunk {name!r}: {exc.strerror} (errno {code})", chunk=name, binding=binding) from exc


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

    def __init__(self, root: str, url: str | None = None) -> None:
        if not root:
            raise InvalidConfig("filesystem binding needs a root folder")
        self.root = os.path.abspath(root)
        self.url = url or f"file://{self.root}"
        self._tmp = os.path.join(self.root, _TMP_DIR)
        # Writers of one chunk in this process take the same stripe (flock alone is per
        # process on NFS); the check of the length and the append happen under it.
        self._locks = tuple(threading.Lock() for _ in range(_LOCK_STRIPES))
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
        path = os.path.join(self.root, chunk_relpath(name))
        assert os.path.commonpath([self.root, path]) == self.root, (name, path)
        return path

    def _lock(self, name: str) -> threading.Lock:
        return self._locks[zlib.crc32(name.encode("utf-8", "surrogatepass")) % _LOCK_STRIPES]

    @contextlib.contextmanager
    def _open_for_change(self, handle: ChunkHandle, flags: int) -> Iterator[tuple[int, os.stat_result]]:
        """Open ``handle``'s file for a change, locked against other writers of it.

        Yields the descriptor and its stat; refuses read-only handles and chunks.
        """
        if handle.readonly:
            raise ChunkReadOnly(f"handle to {handle.name!r} is read-only", chunk=handle.name)
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
        cutoff = time.time() - TMP_AGE_S_MAX
        with contextlib.suppress(OSError):
            for entry in os.scandir(self._tmp):
                with contextlib.suppress(OSError):
                    if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(entry.path)

    def _publish(self, name: str, fill) -> ChunkHandle:  # noqa: ANN001 - fill(fd) -> None
        """Write a temporary file with ``fill``, then link it as ``name`` (exclusive)."""
        path = self._path(name)
        tmp = os.path.join(self._tmp, uuid.uuid4().hex)
        with _translated(name, self.url):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
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

    # -- contract -------------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        path = self._path(name)
        with _translated(name, self.url):
            try:
                return stat.S_ISREG(os.stat(path).st_mode)
            except (FileNotFoundError, NotADirectoryError):
                return False

    def create(self, name: str, data: bytes = b"") -> ChunkHandle:
        return self._publish(name, lambda fd: _write_all(fd, data))

    def delete(self, handle: ChunkHandle) -> None:
        path = self._path(handle.name)
        with _translated(handle.name, self.url):
            os.unlink(path)
        self._prune_folders(os.path.dirname(path))

    def _prune_folders(self, folder: str) -> None:
        """Remove ``folder`` and its parents below the root while they are empty.

        Not fsynced: an empty folder that reappears after a crash is harmless. A create
        racing with this retries its link (``_publish``).
        """
        while folder != self.root and os.path.commonpath([self.root, folder]) == self.root:
            try:
                os.rmdir(folder)
            except OSError:
                return  # not empty (or gone): its parents are not empty either
            folder = os.path.dirname(folder)

    def _stat(self, name: str) -> os.stat_result:
        with _translated(name, self.url):
            try:
                st = os.stat(self._path(name))
            except NotADirectoryError as exc:
                raise FileNotFoundError(errno.ENOENT, "not found") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=self.url)
        return st

    def open_read(self, name: str) -> ChunkHandle:
        self._stat(name)
        return ChunkHandle(name, readonly=True)

    def open_write(self, name: str) -> ChunkHandle:
        if not self._stat(name).st_mode & stat.S_IWUSR:
            raise ChunkReadOnly(f"chunk {name!r} is read-only", chunk=name, binding=self.url)
        return ChunkHandle(name, readonly=False)

    def get_info(self, name: str) -> ChunkInfo:
        return ChunkInfo(name, self._stat(name).st_size)

    def read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        check_range(handle.name, offset, length)
        with _translated(handle.name, self.url):
            fd = os.open(self._path(handle.name), os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if offset > size:
                    raise ChunkInvalidOffset(
                        f"chunk {handle.name!r}: read at {offset} past its end {size}",
                        chunk=handle.name,
                        offset=offset,
                    )
                want = min(length, size - offset)
                pieces = []
                while want > 0:
                    piece = os.pread(fd, want, offset)
                    if not piece:
                        break
                    pieces.append(piece)
                    offset += len(piece)
                    want -= len(piece)
                return pieces[0] if len(pieces) == 1 else b"".join(pieces)
            finally:
                os.close(fd)

    def write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        check_range(handle.name, offset, len(data))
        with self._open_for_change(handle, os.O_WRONLY | os.O_APPEND) as (fd, st):
            if st.st_size != offset:
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: write at {offset}, but its length is {st.st_size}",
                    chunk=handle.name,
                    offset=offset,
                )
            try:
                _write_all(fd, data)
                os.fdatasync(fd)
            except OSError:
                # Best effort: a failed append (ENOSPC, EIO) leaves the chunk as it was.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, offset)
                raise
        return len(data)

    def list(self, prefix: str = "") -> Iterator[str]:
        if "\x00" in prefix or len(prefix.encode("utf-8", "surrogatepass")) > CHUNK_NAME_BYTES_MAX:
            return iter(())  # no chunk name can start with it
        *folders, _ = prefix.split("/")
        start = os.path.join(self.root, *_folder_parts(folders))
        base = "/".join(folders) + "/" if folders else ""
        with _translated(prefix, self.url):
            names = self._collect(start, base, prefix)
        return iter(sorted(names))

    def _collect(self, start: str, base: str, prefix: str) -> builtins.list[str]:
        """Names of the chunks below folder ``start`` (whose names begin with ``base``).

        Iterative: a 1024-byte name can be 1024 folders deep.
        """
        out: builtins.list[str] = []
        stack = [(start, base, "")]  # (folder, name so far, pending encoded pieces)
        while stack:
            folder, base, pending = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name.endswith(_CONTINUED_SUFFIX):
                        stack.append((entry.path, base, pending + entry.name[:-1]))
                    elif entry.name.endswith(_DIR_SUFFIX):
                        sub = base + _decode_component(pending + entry.name[:-1]) + "/"
                        if sub.startswith(prefix) or prefix.startswith(sub):
                            stack.append((entry.path, sub, ""))
                elif entry.is_file(follow_symlinks=False):
                    encoded = pending + entry.name
                    name = base + ("" if encoded == _EMPTY_FILE else _decode_component(encoded))
                    if name.startswith(prefix) and self._is_canonical(name, entry.path):
                        out.append(name)
        return out

    def _is_canonical(self, name: str, path: str) -> bool:
        """True if ``path`` is where chunk ``name`` lives (temporary and foreign files are not)."""
        try:
            return os.path.join(self.root, chunk_relpath(name)) == path
        except ChunkStorageError:
            return False

    def concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        check_name(target)
        check_concat_sources(sources)
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

    def truncate(self, handle: ChunkHandle, length: int) -> None:
        check_range(handle.name, 0, length)
        with self._open_for_change(handle, os.O_WRONLY) as (fd, st):
            if length > st.st_size:
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: cannot truncate to {length} > {st.st_size}",
                    chunk=handle.name,
                    offset=length,
                )
            os.ftruncate(fd, length)
            os.fsync(fd)

    def set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        path = self._path(handle.name)
        with self._lock(handle.name):
            self._stat(handle.name)
            with _translated(handle.name, self.url):
                os.chmod(path, 0o444 if readonly else 0o644)
