"""Bindings read through a chunk cache, for the cache's tests and the conformance suite.

``RemoteMemoryChunkStorage`` is the memory binding announcing ``high_latency_reads`` (as
S3 and HDFS do), so the engine reads ahead on it and ``slts.open``'s rule would cache it;
``cached(inner, folder, ...)`` wraps a binding in a ``CachedChunkStorage`` on a new cache
in ``folder`` (closed with the wrapper).
"""

from __future__ import annotations

import os
from pathlib import Path

from slts.bindings.base import ChunkStorage
from slts.bindings.chunk_cache import CachedChunkStorage, acquire
from slts.bindings.memory import MemoryChunkStorage

from tests.support.conformance import BindingUnderTest

KiB = 1 << 10


class RemoteMemoryChunkStorage(MemoryChunkStorage):
    """The memory binding, flagged as a binding whose reads are remote."""

    high_latency_reads = True


def cached(
    inner: ChunkStorage,
    folder: str | os.PathLike[str],
    *,
    capacity_bytes: int = 1 << 20,
    block_bytes: int = 64 * KiB,
    fill_threads: int = 2,
    fill_bytes_max: int = 64 << 20,  # no fill dropped in a test, however slow the machine
    direct_fills: bool = False,
) -> CachedChunkStorage:
    """``inner`` read through the process's cache in ``folder`` (``shared.acquire``:
    released, and closed with the last user, when the wrapper closes)."""
    cache = acquire(
        os.fspath(folder),
        capacity_bytes,
        block_bytes,
        fill_threads,
        fill_bytes_max,
        direct_fills=direct_fills,
    )
    return CachedChunkStorage(inner, cache, shared=True)


def cached_memory_binding(workdir: Path) -> BindingUnderTest:
    """The conformance suite's entry: a cache over a fresh memory binding."""
    from tests.conformance.conftest import MemoryRaw

    inner = RemoteMemoryChunkStorage("memory://conformance-cached")
    storage = cached(inner, workdir / "cache", capacity_bytes=4 << 20, block_bytes=16 * KiB)
    return BindingUnderTest("cached-memory", storage, MemoryRaw(inner), reopen=lambda: storage)
