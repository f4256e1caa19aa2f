"""In-memory chunk storage: the reference binding for tests and simulation.

Everything lives in a dict guarded by one lock; every operation is atomic and "durable"
for the life of the process. Instances built from the same ``memory://NAME`` URL share
their chunks (see ``slts.bindings.from_url``), so a test can reopen a container on the
same storage. Fault injection is a separate wrapper (``slts.bindings.faulty``) that
works on any binding.

Every capability is on by default; the constructor (or a subclass, as a class attribute)
can turn any of them off, so the engine's code paths for a binding without append or
concat (S3-like) run on memory too. ``ChunkStorage`` refuses an optional operation whose
flag is off (and checks every argument) before the hooks here run; without append,
``_do_write`` accepts only an empty chunk at offset 0.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkReadOnly,
)

from .base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource


class _Chunk:
    __slots__ = ("data", "readonly")

    def __init__(self, data: bytes) -> None:
        self.data = bytearray(data)
        self.readonly = False


class MemoryChunkStorage(ChunkStorage):
    """Chunks in a dict. Supports append, concat, truncate and read-only unless told not to."""

    supports_append = True
    supports_concat = True
    supports_truncate = True
    supports_readonly = True

    def __init__(
        self,
        url: str = "memory://",
        *,
        supports_append: bool | None = None,
        supports_concat: bool | None = None,
        supports_truncate: bool | None = None,
        supports_readonly: bool | None = None,
    ) -> None:
        """Every capability flag left at ``None`` keeps the class's value (subclasses may
        turn flags off as class attributes)."""
        self.url = url
        flags = {
            "supports_append": supports_append,
            "supports_concat": supports_concat,
            "supports_truncate": supports_truncate,
            "supports_readonly": supports_readonly,
        }
        for flag, value in flags.items():
            if value is not None:
                setattr(self, flag, bool(value))
        self._lock = threading.Lock()
        self._chunks: dict[str, _Chunk] = {}

    def _get(self, name: str) -> _Chunk:
        chunk = self._chunks.get(name)
        if chunk is None:
            raise ChunkNotFound(f"chunk {name!r} not found", chunk=name, binding=self.url)
        return chunk

    # -- hooks (arguments checked by ChunkStorage) ------------------------------------------

    def _do_exists(self, name: str) -> bool:
        with self._lock:
            return name in self._chunks

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        with self._lock:
            if name in self._chunks:
                raise ChunkExists(f"chunk {name!r} exists", chunk=name, binding=self.url)
            self._chunks[name] = _Chunk(data)
        return ChunkHandle(name, readonly=False)

    def _do_delete(self, handle: ChunkHandle) -> None:
        with self._lock:
            self._get(handle.name)
            del self._chunks[handle.name]

    def _do_open_read(self, name: str) -> ChunkHandle:
        with self._lock:
            self._get(name)
        return ChunkHandle(name, readonly=True)

    def _do_open_write(self, name: str) -> ChunkHandle:
        with self._lock:
            if self._get(name).readonly:
                raise ChunkReadOnly(f"chunk {name!r} is read-only", chunk=name, binding=self.url)
        return ChunkHandle(name, readonly=False)

    def _do_get_info(self, name: str) -> ChunkInfo:
        with self._lock:
            return ChunkInfo(name, len(self._get(name).data))

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        with self._lock:
            data = self._get(handle.name).data
            if offset > len(data):
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: read at {offset} past its end {len(data)}",
                    chunk=handle.name,
                    offset=offset,
                )
            return bytes(data[offset : offset + length])

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        with self._lock:
            chunk = self._get(handle.name)
            if chunk.readonly:
                raise ChunkReadOnly(f"chunk {handle.name!r} is read-only", chunk=handle.name)
            if offset != len(chunk.data):
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: write at {offset}, but its length is {len(chunk.data)}",
                    chunk=handle.name,
                    offset=offset,
                )
            if chunk.data and not self.supports_append:
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: {self.url} has no append (only an empty chunk at 0)",
                    chunk=handle.name,
                    offset=offset,
                )
            chunk.data += data
        return len(data)

    def _do_list(self, prefix: str) -> Iterator[str]:
        with self._lock:
            names = sorted(name for name in self._chunks if name.startswith(prefix))
        return iter(names)

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        with self._lock:
            if target in self._chunks:
                raise ChunkExists(f"chunk {target!r} exists", chunk=target, binding=self.url)
            pieces = []
            for source in sources:
                data = self._get(source.name).data
                if source.offset + source.length > len(data):
                    raise ChunkInvalidOffset(
                        f"concat source {source.name!r}: range {source.offset}+{source.length} "
                        f"past its end {len(data)}",
                        chunk=source.name,
                        offset=source.offset,
                    )
                pieces.append(bytes(data[source.offset : source.offset + source.length]))
            self._chunks[target] = _Chunk(b"".join(pieces))
            return ChunkInfo(target, len(self._chunks[target].data))

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        with self._lock:
            chunk = self._get(handle.name)
            if chunk.readonly:
                raise ChunkReadOnly(f"chunk {handle.name!r} is read-only", chunk=handle.name)
            if length > len(chunk.data):
                raise ChunkInvalidOffset(
                    f"chunk {handle.name!r}: cannot truncate to {length} > {len(chunk.data)}",
                    chunk=handle.name,
                    offset=length,
                )
            del chunk.data[length:]

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        with self._lock:
            self._get(handle.name).readonly = bool(readonly)
