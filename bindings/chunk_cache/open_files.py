"""Descriptors of the chunk cache's most recently read files, kept open between reads.

A hit costs an ``open`` and a ``close`` of its file (about 3 us together on the machine
measured, a twentieth of a 1 MiB hit) unless the descriptor is kept: ``OpenFiles`` keeps
those of the ``capacity`` files read last. A cache file never changes once it is in
``blocks/`` and its name is never used again (files.py), so a kept descriptor reads the
bytes the file was written with, even after the file is removed; what must not happen is
a removed file's space held by a forgotten descriptor, or a descriptor closed (and its
number reused for another file) while a read uses it.

Invariants (asserted; ``tests/chunk_cache/test_open_files.py``):

1. **Closed once unused.** ``forget(path)`` (the cache removes the file) closes its
   descriptor at once if no read holds it, else when the last one gives it back; no
   descriptor of a forgotten file is ever kept or handed out again.
2. **Never closed under a read.** A borrowed descriptor stays open until given back.
3. **Bounded.** At most ``capacity`` descriptors are kept while no read holds them;
   least recently borrowed go first.
4. **Only current files kept.** A descriptor is kept only if ``is_current(file)`` says the
   cache's index still holds the file, checked under the same lock ``forget`` takes, so a
   file removed while it was being opened is read once and closed.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable

from .files import CacheFile


class _Kept:
    """A kept descriptor and how many reads hold it now."""

    __slots__ = ("borrowed", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.borrowed = 1


class OpenFiles:
    """Open descriptors of up to ``capacity`` cache files (module doc); thread-safe."""

    def __init__(self, capacity: int, is_current: Callable[[CacheFile], bool]) -> None:
        assert capacity >= 0, capacity
        self.capacity = capacity
        self._is_current = is_current
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, _Kept] = OrderedDict()  # least recently borrowed first
        self._leaving: dict[int, int] = {}  # descriptors of forgotten files -> reads holding them
        self._closed = False

    def borrow(self, file: CacheFile) -> int:
        """A descriptor of ``file`` open for reading, to ``give_back`` after the read.
        ``FileNotFoundError`` if the file is gone (removed since the caller looked it up)."""
        with self._lock:
            kept = self._kept.get(file.path)
            if kept is not None:
                kept.borrowed += 1
                self._kept.move_to_end(file.path)
                return kept.fd
        fd = os.open(file.path, os.O_RDONLY)
        extra = -1
        with self._lock:
            kept = self._kept.get(file.path)
            if kept is not None:  # another read kept one meanwhile: use it, close this one
                kept.borrowed += 1
                fd, extra = kept.fd, fd
            elif not self._closed and self.capacity and self._is_current(file):
                self._kept[file.path] = _Kept(fd)
                self._trim()
            else:  # not kept: read once, closed when given back
                self._leaving[fd] = 1
        if extra >= 0:
            os.close(extra)
        return fd

    def give_back(self, file: CacheFile, fd: int) -> None:
        """The read of ``file`` through ``fd`` (from ``borrow``) ended."""
        close = False
        with self._lock:
            kept = self._kept.get(file.path)
            if kept is not None and kept.fd == fd:
                assert kept.borrowed > 0, (file.path, fd)
                kept.borrowed -= 1
                self._trim()
            else:
                left = self._leaving[fd] - 1  # a KeyError here is a descriptor never borrowed
                if left:
                    self._leaving[fd] = left
                else:
                    del self._leaving[fd]
                    close = True
        if close:
            os.close(fd)

    def forget(self, path: str) -> None:
        """The cache removes the file at ``path``: close its descriptor, now or when the
        last read holding it gives it back (invariant 1)."""
        with self._lock:
            kept = self._kept.pop(path, None)
            if kept is None:
                return
            if kept.borrowed:
                self._leaving[kept.fd] = kept.borrowed
                return
        os.close(kept.fd)

    def close(self) -> None:
        """Close every kept descriptor no read holds; later borrows are not kept."""
        with self._lock:
            self._closed = True
            idle = [path for path, kept in self._kept.items() if not kept.borrowed]
            fds = [self._kept.pop(path).fd for path in idle]
            for kept in self._kept.values():  # held by reads now: closed when given back
                self._leaving[kept.fd] = kept.borrowed
            self._kept.clear()
        for fd in fds:
            os.close(fd)

    def __len__(self) -> int:
        """How many descriptors are kept now."""
        with self._lock:
            return len(self._kept)

    def _trim(self) -> None:
        """Close the least recently borrowed idle descriptors beyond ``capacity`` (lock held)."""
        if len(self._kept) <= self.capacity:
            return
        for path in list(self._kept):
            if len(self._kept) <= self.capacity:
                break
            kept = self._kept[path]
            if not kept.borrowed:
                del self._kept[path]
                os.close(kept.fd)
        assert len(self._kept) <= self.capacity or all(kept.borrowed for kept in self._kept.values())
