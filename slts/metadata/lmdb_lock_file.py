"""LMDB's last committed transaction id, read from its lock file without the map.

Every read through the metadata cache asks the store whether any process committed
since the cache last looked (``MetadataStore.change_marker``). ``Environment.info()``
answers from the meta pages, which live in the data file's map: the store must hold its
gate against a concurrent ``set_mapsize`` (which remaps it) around that call, and the
gate's entry and exit cost more than the read itself.

LMDB also records the id in the lock file's shared table, beside its magic number and
format ("recorded here only for convenience": ``mtb_txnid`` of ``MDB_txbody`` in
``mdb.c``), updated by every process's commit under the writer mutex. That file is mapped
once, at a fixed size, and never remapped, so this module reads it through a mapping of
its own, with no gate.

The field's offset depends on how LMDB was built (the size of the reader mutex before
it). So a reader is only made (``open_marker``) after checking, on the open environment,
that the magic number and format are the expected ones and that the id read there is the
id ``info()`` gives; otherwise the caller keeps using ``info()``. A mismatch caused by a
commit of another process between the two reads only costs that speed-up.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Callable

#: ``MDB_MAGIC`` and the lock file's ``MDB_LOCK_FORMAT`` of the LMDB 0.9 series.
_MAGIC = 0xBEEFC0DE
_LOCK_FORMATS = frozenset({0x10001})
#: Where ``mtb_txnid`` sits: after magic and format (4 bytes each) and the reader mutex
#: (a 40-byte ``pthread_mutex_t`` on 64-bit Linux with glibc).
_TXNID_OFFSET = 48
_HEADER = struct.Struct("=II")
_TXNID = struct.Struct("=Q")


class LockFileMarker:
    """Reads the last committed transaction id from a mapping of ``lock.mdb``."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._mapping = mapping
        self._read: Callable[[mmap.mmap, int], tuple[int, ...]] = _TXNID.unpack_from

    def last_transaction(self) -> int:
        """The id of the last write transaction committed by any process. ``ValueError``
        once closed (the mapping is gone; never a read of unmapped memory)."""
        return self._read(self._mapping, _TXNID_OFFSET)[0]

    def close(self) -> None:
        """Unmap the lock file (a later ``last_transaction`` raises ``ValueError``)."""
        self._mapping.close()


def open_marker(folder: str, last_transaction: Callable[[], int]) -> LockFileMarker | None:
    """A reader of ``folder/lock.mdb``'s transaction id, if that file has the layout this
    module knows and the id it holds equals ``last_transaction()`` (the environment's
    ``info()``, read right after); None otherwise (no lock file, another layout, or a
    commit in between)."""
    path = os.path.join(folder, "lock.mdb")
    try:
        with open(path, "rb") as file:
            mapping = mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)
    except (OSError, ValueError):  # no lock file (MDB_NOLOCK), or an empty one
        return None
    marker = LockFileMarker(mapping)
    try:
        if len(mapping) >= _TXNID_OFFSET + _TXNID.size:
            magic, lock_format = _HEADER.unpack_from(mapping, 0)
            if magic == _MAGIC and lock_format in _LOCK_FORMATS:
                read = marker.last_transaction()
                if read == last_transaction():
                    return marker
    except ValueError:
        pass
    with contextlib.suppress(ValueError):
        marker.close()
    return None
