"""The one place every chunk storage call of a container passes through the limiter.

``LimitedChunkStorage`` wraps the container's binding when a ``PriorityLimiter`` is given
(``slts.open(..., limiter=...)``): the engine, its GC, the system journal and the metadata
copy, defrag, the offloaders and the remote log all hold this wrapper, so no caller paces
itself. Each call first waits for the limiter, as the class its caller set with
``slts.limiter.traffic_class`` (GC, defrag, offload, scrub set theirs); a call outside any
class is a tail write if it changes something and a read if it does not. Bytes counted: the
data of a read, write or create, the sources' lengths of a native concat (the storage moves
them); every call is one request. Capability flags and errors are the inner binding's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from slts.bindings.base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource, WrappedChunkStorage
from slts.limiter import PriorityLimiter, TrafficClass, current_traffic_class


class LimitedChunkStorage(WrappedChunkStorage):
    """``inner`` with every call paid for through ``limiter`` first."""

    def __init__(self, inner: ChunkStorage, limiter: PriorityLimiter) -> None:
        assert not isinstance(inner, LimitedChunkStorage), "one limiter per chunk storage"
        super().__init__(inner)
        self.limiter = limiter

    def _pay(self, changes: bool, nbytes: int = 0) -> None:
        kind = current_traffic_class(TrafficClass.TAIL_WRITE if changes else TrafficClass.READ)
        self.limiter.acquire(kind, nbytes)

    # -- hooks: ChunkStorage checked the arguments; the inner binding checks them again -----

    def _do_exists(self, name: str) -> bool:
        self._pay(False)
        return self.inner.exists(name)

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        self._pay(True, len(data))
        return self.inner.create(name, data)

    def _do_delete(self, handle: ChunkHandle) -> None:
        self._pay(True)
        self.inner.delete(handle)

    def _do_open_read(self, name: str) -> ChunkHandle:
        return self.inner.open_read(name)  # a handle costs no request on any binding

    def _do_open_write(self, name: str) -> ChunkHandle:
        return self.inner.open_write(name)

    def _do_get_info(self, name: str) -> ChunkInfo:
        self._pay(False)
        return self.inner.get_info(name)

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        self._pay(False, length)
        return self.inner.read(handle, offset, length)

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        self._pay(True, len(data))
        return self.inner.write(handle, offset, data)

    def _do_list(self, prefix: str) -> Iterator[str]:
        self._pay(False)
        return self.inner.list(prefix)

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        self._pay(True, sum(source.length for source in sources))
        return self.inner.concat(target, sources)

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        self._pay(True)
        self.inner.truncate(handle, length)

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        self._pay(True)
        self.inner.set_readonly(handle, readonly)
