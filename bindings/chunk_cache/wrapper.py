"""``CachedChunkStorage``: a binding wrapper that reads through a ``ChunkCache``.

Reads (``read``, ``read_view``) are served from the cache when it holds every byte asked
for; otherwise from the inner binding, exactly as without the cache (same request, same
errors), and the bytes received are offered to the cache, which writes them in the
background. Every other call goes to the inner binding; those that may change a chunk's
bytes or end its life invalidate the chunk in the cache *after* the inner call (also when
it raised: a lost answer may hide a done change): ``create``, ``write``, ``truncate``,
``delete``, a ``concat`` target, and any call that finds the chunk missing. Capability
flags are the inner binding's, ``high_latency_reads`` included, so the engine keeps reading
ahead for sequential readers, and those reads fill the cache with the chunks that follow
(the prefetch of the next chunk).

``read_into(..., verified_by_caller=True)`` (the engine, which checks the bytes against
its block checksums) is served from the cache without the cache's own CRC32C: one check
per byte, not two; when the caller's check fails it calls ``distrust``, which drops the
cache's files for those bytes, and reads again, from the inner binding this time.

A zero-length read goes to the inner binding (it decides between ``b""`` and an offset
past the end). A read is never served past what a file of the cache holds, so a read
clipped at a chunk's end always goes to the inner binding: the cache need not know any
chunk's length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from slts.errors import ChunkNotFound

from .. import checked_reads
from ..base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource, WrappedChunkStorage
from .cache import ChunkCache, ChunkCacheStatistics
from .shared import release

T = TypeVar("T")


#: Chunk names whose cache keys a wrapper remembers (a dict of them is dropped whole when full).
KEYS_KEPT = 4096


class CachedChunkStorage(WrappedChunkStorage):
    """``inner`` read through ``cache`` (see the module doc). ``close`` closes ``inner``
    and gives back this wrapper's reference to a shared cache (``shared.acquire``) when
    ``shared`` is true; otherwise the cache stays the caller's to close."""

    def __init__(self, inner: ChunkStorage, cache: ChunkCache, *, shared: bool = False) -> None:
        super().__init__(inner)
        self.holds_locally = True  # ``holds``: the cache's copies
        self.checks_as_it_reads = checked_reads.NATIVE is not None  # hits: one compiled pass
        self.cache = cache
        self._shared = shared
        self._released = False
        self._keys: dict[str, bytes] = {}  # chunk name -> cache key (``_key``)

    def _key(self, name: str) -> bytes:
        """The cache key of chunk ``name`` (``ChunkCache.key_of``), remembered for the
        ``KEYS_KEPT`` names asked last: a hit then costs no digest."""
        key = self._keys.get(name)
        if key is None:
            key = self.cache.key_of(self.url, name)
            if len(self._keys) >= KEYS_KEPT:
                self._keys.clear()
            self._keys[name] = key
        return key

    def around_caches(self) -> ChunkStorage:
        """The inner binding's ``around_caches``: reads of the storage, not of this cache."""
        return self.inner.around_caches()

    def chunk_cache_statistics(self) -> ChunkCacheStatistics:
        """The cache's counters (shared by every wrapper on it)."""
        return self.cache.statistics()

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            if self._shared and not self._released:
                self._released = True
                release(self.cache)

    # -- reads ---------------------------------------------------------------------------------

    def _do_read(self, handle: ChunkHandle, offset: int, length: int) -> bytes:
        if length == 0:
            return self.inner.read(handle, offset, length)
        key = self._key(handle.name)
        data = self.cache.read(key, offset, length)
        if data is not None:
            return data
        fetched = self._fetch(key, lambda: self.inner.read(handle, offset, length), offset)
        assert isinstance(fetched, bytes)
        return fetched

    def _do_read_view(self, handle: ChunkHandle, offset: int, length: int) -> memoryview:
        if length == 0:
            return self.inner.read_view(handle, offset, length)
        key = self._key(handle.name)
        data = self.cache.read(key, offset, length)
        if data is not None:
            return memoryview(data)
        view = self._fetch(key, lambda: self.inner.read_view(handle, offset, length), offset)
        assert isinstance(view, memoryview)
        return view

    def _do_read_into(self, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        if len(view) == 0:
            return self.inner.read_into(handle, offset, view)
        key = self._key(handle.name)
        if self.cache.read_into(key, offset, view):
            return len(view)
        return self._fetch_into(key, handle, offset, view)

    def _do_read_into_verified_by_caller(self, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        """A hit is served without the cache's own CRC32C (the caller checks the bytes and
        ``distrust``s them if they fail); a miss is ``_do_read_into``'s."""
        if len(view) == 0:
            return self.inner.read_into(handle, offset, view)
        key = self._key(handle.name)
        if self.cache.read_into(key, offset, view, checked=False):
            return len(view)
        return self._fetch_into(key, handle, offset, view)

    def _do_read_into_checked(self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes) -> int:
        """A hit is read and checked against the caller's blocks in one pass (a copy that
        fails is dropped: a miss); a miss reads the inner binding, then checks."""
        if len(view) == 0:
            return self.inner.read_into_checked(handle, offset, view, blocks)
        key = self._key(handle.name)
        if self.cache.read_into_blocks(key, offset, view, blocks):
            return len(view)
        done = self._fetch_into(key, handle, offset, view)
        bad = checked_reads.first_bad(view[:done], blocks)
        if bad >= 0:
            raise checked_reads.corrupted(handle.name, offset, blocks, bad)
        return done

    def _do_read_held_into_checked(
        self, handle: ChunkHandle, offset: int, view: memoryview, blocks: bytes
    ) -> int | None:
        """A hit, read and checked in one pass; None for a miss or a copy that failed
        (dropped), neither counted as a miss: the caller's read then asks again."""
        if len(view) == 0:
            return None
        key = self._key(handle.name)
        return len(view) if self.cache.read_into_blocks(key, offset, view, blocks, count_miss=False) else None

    def _fetch_into(self, key: bytes, handle: ChunkHandle, offset: int, view: memoryview) -> int:
        """A miss: the inner binding's bytes copied into ``view`` (and offered to the cache)."""
        data = self._fetch(key, lambda: self.inner.read(handle, offset, len(view)), offset)
        view[: len(data)] = data
        return len(data)

    def _do_distrust(self, name: str, offset: int, length: int) -> bool:
        """The cache's files holding any of the bytes are dropped (True if one was): the
        caller's read again goes to the inner binding."""
        return self.cache.distrust(self._key(name), offset, length)

    def _do_holds(self, name: str, offset: int, length: int) -> bool:
        """Whether the cache holds chunk ``name``'s bytes ``[offset, offset+length)`` now."""
        return self.cache.holds(self._key(name), offset, length)

    def _fetch(self, key: bytes, read: Callable[[], T], offset: int) -> T:
        """``read()`` from the inner binding, its bytes offered to the cache."""
        token = self.cache.begin()
        try:
            data = read()
        except ChunkNotFound:
            self.cache.end(token)
            self.cache.invalidate(key)
            raise
        except BaseException:
            self.cache.end(token)
            raise
        if len(data) == 0:  # type: ignore[arg-type]
            self.cache.end(token)
        else:
            self.cache.offer(key, token, offset, data)  # type: ignore[arg-type]
        return data

    # -- everything else: the inner binding; changes invalidate ------------------------------------

    def _invalidating(self, name: str, call: Callable[[], T]) -> T:
        try:
            return call()
        finally:
            self.cache.invalidate(self._key(name))

    def _probing(self, name: str, call: Callable[[], T]) -> T:
        """A call that tells whether the chunk exists: a missing one leaves the cache."""
        try:
            return call()
        except ChunkNotFound:
            self.cache.invalidate(self._key(name))
            raise

    def _do_exists(self, name: str) -> bool:
        found = self.inner.exists(name)
        if not found:
            self.cache.invalidate(self._key(name))
        return found

    def _do_create(self, name: str, data: bytes) -> ChunkHandle:
        return self._invalidating(name, lambda: self.inner.create(name, data))

    def _do_delete(self, handle: ChunkHandle) -> None:
        self._invalidating(handle.name, lambda: self.inner.delete(handle))

    def _do_open_read(self, name: str) -> ChunkHandle:
        return self._probing(name, lambda: self.inner.open_read(name))

    def _do_open_write(self, name: str) -> ChunkHandle:
        return self._probing(name, lambda: self.inner.open_write(name))

    def _do_get_info(self, name: str) -> ChunkInfo:
        return self._probing(name, lambda: self.inner.get_info(name))

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        return self._invalidating(handle.name, lambda: self.inner.write(handle, offset, data))

    def _do_list(self, prefix: str) -> Iterator[str]:
        return self.inner.list(prefix)

    def _do_concat(self, target: str, sources: Sequence[ConcatSource]) -> ChunkInfo:
        return self._invalidating(target, lambda: self.inner.concat(target, sources))

    def _do_truncate(self, handle: ChunkHandle, length: int) -> None:
        self._invalidating(handle.name, lambda: self.inner.truncate(handle, length))

    def _do_set_readonly(self, handle: ChunkHandle, readonly: bool) -> None:
        self._probing(handle.name, lambda: self.inner.set_readonly(handle, readonly))
