"""The chunk cache: chunk bytes read from a remote chunk storage (S3, HDFS) kept on local
disk, up to a size limit, least recently used out first, shared by the readers of a
process, checked by their own CRC32C on every serve (docs/chunk_cache.md).

Modules, each with one job:

=============== ==============================================================
``files``       the cache files on disk: write (temporary, rename), checked reads, restart scan
``index``       which files exist, LRU order, strict byte accounting, invalidation
``filler``      background fills, bounded in threads and bytes
``cache``       ``ChunkCache``: the three together, and its statistics
``shared``      one cache per folder per process, reference-counted
``wrapper``     ``CachedChunkStorage``: a binding read through a cache
=============== ==============================================================

Like every binding module it imports nothing of the core but ``slts.errors``.
"""

from __future__ import annotations

from .cache import ChunkCache, ChunkCacheStatistics
from .shared import acquire, release
from .wrapper import CachedChunkStorage

__all__ = ["CachedChunkStorage", "ChunkCache", "ChunkCacheStatistics", "acquire", "release"]
