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
it). So a marker is only *used* after checking, on the open environment, that the magic
number and format are the expected ones and that the id read there is the id ``info()``
gives; otherwise the caller keeps using ``info()``. A mismatch caused by a commit of
another process between the two reads only costs that speed-up.

**Never close a descriptor of the lock file while the environment is open.** LMDB holds
POSIX record locks on ``lock.mdb`` to tell other processes that the environment is in
use, and POSIX drops *all* of a process's record locks on a file when the process closes
*any* descriptor of it. A process that then opens the environment believes it is the
first, and initialises the lock file's mutexes again under this one (which then crashes
in its next transaction). So the marker keeps its descriptor and its mapping (which holds
a descriptor of its own) open, usable or not, until ``close``, which the store calls only
after closing the environment.
"""

from __future__ import annotations

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
_BYTES_MIN = _TXNID_OFFSET + _TXNID.size


class LockFileMarker:
    """A mapping of ``lock.mdb`` and the descriptor it was made from (both kept open until
    ``close``: see the module doc). ``usable``: the layout was vouched for at open."""

    def __init__(self, fd: int, mapping: mmap.mmap | None, usable: bool) -> None:
        assert usable <= (mapping is not None)
        self._fd = fd
        self._mapping = mapping
        self.usable = usable
        self._read: Callable[[mmap.mmap, int], tuple[int, ...]] = _TXNID.unpack_from

    def last_transaction(self) -> int:
        """The id of the last write transaction committed by any process (only when
        ``usable``). ``ValueError`` once closed (never a read of unmapped memory)."""
        assert self.usable and self._mapping is not None
        return self._read(self._mapping, _TXNID_OFFSET)[0]

    def close(self) -> None:
        """Unmap the lock file and close its descriptor: call only once the environment is
        closed (module doc). A later ``last_transaction`` raises ``ValueError``."""
        if self._mapping is not None:
            self._mapping.close()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_marker(folder: str, last_transaction: Callable[[], int]) -> LockFileMarker | None:
    """The lock file of the environment open on ``folder``, mapped: ``usable`` if it has the
    layout this module knows and the id it holds equals ``last_transaction()`` (the
    environment's ``info()``, read right after). None when there is no lock file of that
    size (no descriptor was opened then). The caller closes it after the environment."""
    path = os.path.join(folder, "lock.mdb")
    try:
        if os.stat(path).st_size < _BYTES_MIN:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return LockFileMarker(fd, None, usable=False)  # its descriptor too waits for close
    magic, lock_format = _HEADER.unpack_from(mapping, 0)
    known = magic == _MAGIC and lock_format in _LOCK_FORMATS and len(mapping) >= _BYTES_MIN
    marker = LockFileMarker(fd, mapping, usable=known)
    if known and marker.last_transaction() != last_transaction():
        marker.usable = False
    return marker
