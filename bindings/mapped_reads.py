"""Zero-copy reads of files: read-only views of a file's pages, shared by every read of it.

``FileMappings.view(name, path, offset, length)`` answers a read of ``[offset,
offset+length)`` of the file at ``path`` (clipped at its end) with a slice of one
read-only shared mapping of the whole file: no copy, and no memory of the process's own
(the pages are the page cache's). The mapping of a file is made once and shared by every
view of it, while any lives, and the ``kept_max`` mappings used last are kept a while
longer (a reader that comes back, or a new read handle of the same object, finds the
pages mapped already: setting up their page table entries costs a mapping's first
reader about as much as its checksums); a mapping is unmapped (and its descriptor
closed) once no view of it lives and it left the kept ones, or its chunk was deleted
through the binding.

Why the bytes of a view never change: a chunk's file only grows (appends at its end, and
a failed append cut back to where it began), so the bytes below a length once seen stay
as they are; a deleted file stays mapped (its pages live while mapped). A view is only
ever cut from bytes below the file's current length, and a mapping is used for a name
only while the name still leads to the mapped file (device and inode checked per read),
so a chunk deleted and created again under its name is mapped anew.

What mapping costs a process, and the bounds kept: one descriptor and one mapping per
file with live views or kept, at most ``mappings_max`` of them (beyond it a read copies,
as ``read`` does); address space, not memory. A kept mapping of a file deleted by another
process holds its disk space until it leaves the kept ones (at most ``kept_max`` files).

The risks taken, as with the metadata store's own mapped LMDB file: a mapped file
shortened behind the binding's back (SLTS never does) or a disk error under a mapped
page ends the process with SIGBUS where a copying read would raise an ``OSError``; and a
view's checksums are verified when it is made (``ChunkedSegmentStorage.read_view``): a
page the kernel reclaims and reads back in later, while the view lives, is not verified
again. ``read_mapped = false`` turns mapped reads off: views of private copies.
"""

from __future__ import annotations

import collections
import mmap
import os
import threading
import weakref

#: Files with live mapped views, at most (each holds one descriptor).
MAPPINGS_MAX_DEFAULT = 256
#: Mappings kept after their last view went, the ones used last.
KEPT_MAX_DEFAULT = 16


class _FileMapping(mmap.mmap):
    """A read-only shared mapping of a whole file, with the file's identity."""

    device: int
    inode: int


class FileMappings:
    """Read-only mappings of files, one per name while its views live. Thread-safe."""

    def __init__(self, mappings_max: int = MAPPINGS_MAX_DEFAULT, kept_max: int = KEPT_MAX_DEFAULT) -> None:
        assert 0 <= kept_max < mappings_max, (kept_max, mappings_max)
        self._lock = threading.Lock()
        self._by_name: weakref.WeakValueDictionary[str, _FileMapping] = weakref.WeakValueDictionary()
        #: The mappings used last, by name, least recently used first.
        self._kept: collections.OrderedDict[str, _FileMapping] = collections.OrderedDict()
        self._kept_max = kept_max
        self._slots = threading.BoundedSemaphore(mappings_max)

    def clear(self) -> None:
        """Keep no mapping any longer (each goes with its last view)."""
        with self._lock:
            self._kept.clear()

    def forget(self, name: str) -> None:
        """Stop keeping ``name``'s mapping (its chunk was deleted): it goes with its last view."""
        with self._lock:
            self._kept.pop(name, None)

    def view(self, name: str, path: str, offset: int, length: int) -> memoryview | None:
        """A read-only view of ``[offset, offset+length)`` of the file at ``path`` (``name``:
        the key its mapping is shared under), clipped at the file's end; ``None`` when no
        mapping can be had (all ``mappings_max`` in use, or the system refused one): the
        caller reads by copy. Raises the ``OSError`` of ``stat`` (a missing file) and
        ``ValueError`` for ``offset`` past the file's end."""
        status = os.stat(path)
        size = status.st_size
        if offset > size:
            raise ValueError(f"past its end {size}")
        end = min(size, offset + length)
        if end == offset:
            return memoryview(b"")
        with self._lock:
            mapping = self._by_name.get(name)
            if (
                mapping is None
                or (mapping.device, mapping.inode) != (status.st_dev, status.st_ino)
                or len(mapping) < end
            ):
                mapping = self._map(path)
                if mapping is None:
                    return None
                self._by_name[name] = mapping
            self._kept[name] = mapping
            self._kept.move_to_end(name)
            if len(self._kept) > self._kept_max:
                self._kept.popitem(last=False)
        if len(mapping) < end:  # the file was replaced, or shrank, between the stat and the mapping
            return None
        return memoryview(mapping)[offset:end]

    def _map(self, path: str) -> _FileMapping | None:
        """A new mapping of the whole file at ``path`` (None: no slot, or refused)."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            self._slots.release()
            raise
        try:
            status = os.fstat(descriptor)
            if status.st_size == 0:
                self._slots.release()
                return None
            mapping = _FileMapping(descriptor, status.st_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except OSError:  # ENOMEM (too many mappings), ENODEV (a file system that cannot map)
            self._slots.release()
            return None
        finally:
            os.close(descriptor)
        mapping.device, mapping.inode = status.st_dev, status.st_ino
        weakref.finalize(mapping, self._slots.release)
        return mapping
