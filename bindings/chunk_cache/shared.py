"""One ``ChunkCache`` per folder in a process, shared by every binding that uses it.

``acquire`` opens the cache of a folder on first use and hands the same object to later
callers (their settings must match: ``InvalidConfig`` otherwise); ``release`` gives a
reference back and closes the cache with the last one. So every container of a process
on one store shares one cache, one size limit and one set of fill threads, and a second
process is refused by the cache's own folder lock.
"""

from __future__ import annotations

import os
import threading

from slts.errors import InvalidConfig

from .cache import ChunkCache

_lock = threading.Lock()
_caches: dict[str, tuple[ChunkCache, int]] = {}


def acquire(
    root: str,
    capacity_bytes: int,
    block_bytes: int,
    fill_threads: int,
    fill_bytes_max: int,
    *,
    direct_fills: bool = False,
) -> ChunkCache:
    """The process's cache in folder ``root``, opened if it is not yet (see ``ChunkCache``
    for its errors); ``InvalidConfig`` if it is open with another capacity or block size.
    The fill settings (threads, bytes, ``direct_fills``) are the first opener's."""
    path = os.path.realpath(root)
    with _lock:
        if path in _caches:
            cache, references = _caches[path]
            if (cache.capacity_bytes, cache.block_bytes) != (capacity_bytes, block_bytes):
                raise InvalidConfig(
                    f"chunk cache {path!r} is open in this process with capacity {cache.capacity_bytes} "
                    f"and blocks of {cache.block_bytes} bytes; asked for {capacity_bytes} and {block_bytes}"
                )
            _caches[path] = (cache, references + 1)
            return cache
        cache = ChunkCache(
            path,
            capacity_bytes,
            block_bytes,
            fill_threads=fill_threads,
            fill_bytes_max=fill_bytes_max,
            direct_fills=direct_fills,
        )
        _caches[path] = (cache, 1)
        return cache


def release(cache: ChunkCache) -> None:
    """Give back one reference to ``cache``; the last one closes it."""
    with _lock:
        held, references = _caches[cache.root]
        assert held is cache and references > 0, (cache.root, references)
        if references > 1:
            _caches[cache.root] = (cache, references - 1)
            return
        del _caches[cache.root]
    cache.close()
