"""``slts.open``: a container instance from a chunk storage URL and a metadata location."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slts.bindings import ChunkStorage, from_url
from slts.config import StorageConfig
from slts.errors import InvalidConfig, StoreNotFound
from slts.limiter import PriorityLimiter
from slts.metadata.schema import TABLES
from slts.metadata.store import MetadataStore
from slts.storage.chunked import ChunkedSegmentStorage
from slts.transforms.keys import KeyRing

if TYPE_CHECKING:  # the cache's module loads only where a cache is asked for
    from slts.bindings.chunk_cache import ChunkCache

_log = logging.getLogger("slts.storage")

#: ``metadata=`` value that selects the in-memory store (tests, simulation).
MEMORY_METADATA = ":memory:"


def open_metadata(
    metadata: str | os.PathLike[str] | MetadataStore, *, check: str = "changed"
) -> MetadataStore:
    """The metadata store named by ``metadata``: a store object (used as is), the string
    ``":memory:"`` (a new in-memory store) or a folder path (an LMDB environment, its
    data file checked as ``check`` says: ``LmdbMetadataStore``)."""
    if isinstance(metadata, MetadataStore):
        return metadata
    if metadata == MEMORY_METADATA:
        from slts.metadata.memory_store import MemoryMetadataStore

        return MemoryMetadataStore(TABLES)
    if isinstance(metadata, (str, os.PathLike)) and str(metadata):
        from slts.metadata.lmdb_store import LmdbMetadataStore

        return LmdbMetadataStore(os.fspath(metadata), TABLES, check=check)
    raise InvalidConfig(
        f"metadata must be a folder path, {MEMORY_METADATA!r} or a MetadataStore, got {metadata!r}"
    )


def check_key_ring(settings: StorageConfig, key_ring: KeyRing | None) -> None:
    """``InvalidConfig`` if ``settings`` encrypt new chunks and there is no ``key_ring``:
    checked before anything is opened or created."""
    if settings.encryption and key_ring is None:
        raise InvalidConfig("encryption is on: open the store with a key ring (slts keys create)")


def open(
    url: str,
    *,
    metadata: str | os.PathLike[str] | MetadataStore | None = None,
    epoch: int | None = None,
    container_id: int = 0,
    clock: Callable[[], float] | None = None,
    read_only: bool = False,
    limiter: PriorityLimiter | None = None,
    key_ring: KeyRing | None = None,
    **config: Any,
) -> ChunkedSegmentStorage:
    """Start container ``container_id`` on the chunk storage at ``url``.

    ``metadata`` is required except for ``memory://`` URLs, which default to an
    in-memory store. ``epoch=None`` takes the next epoch after the recorded one.
    ``read_only=True`` observes without taking the container over (no epoch, fences
    nobody, every change raises ``ReadOnlyInstance``). ``limiter``: every chunk storage
    call of the container goes through it (``slts.limiter``; share one limiter among the
    instances that use one chunk storage). ``key_ring``: the keys that wrap the data keys
    of encrypted chunks (``slts.transforms.keys``; required with ``encryption=True``, and to
    read a store's encrypted chunks).
    Remaining keyword arguments are ``StorageConfig`` fields. The returned instance
    owns the binding and the store it opened and closes them on ``close`` (a store
    object passed as ``metadata`` stays the caller's: it is never closed here).
    Every argument is checked before anything is written.

    Raises ``InvalidConfig`` (bad URL, unknown option, a metadata path that cannot be a
    folder), ``InvalidArgument`` (epoch or container id out of range), ``StoreNotFound``
    (``read_only`` and no store there: nothing is created), ``MetadataCorrupted`` (a
    damaged metadata file), ``Fenced`` (epoch not newer).
    """
    settings = StorageConfig.from_mapping(config)
    check_key_ring(settings, key_ring)
    if metadata is None:
        if not isinstance(url, str) or not url.startswith("memory://"):
            raise InvalidConfig("metadata= (an LMDB folder) is required for this chunk storage URL")
        metadata = MEMORY_METADATA
    if read_only and isinstance(metadata, (str, os.PathLike)) and metadata != MEMORY_METADATA:
        _check_existing(os.fspath(metadata))
    binding = with_chunk_cache(from_url(url), settings)
    try:
        store = open_metadata(metadata, check="changed" if settings.metadata_check else "never")
    except BaseException:
        binding.close()
        raise
    caller_store = isinstance(metadata, MetadataStore)  # the caller's to close, not ours
    extra = {} if clock is None else {"clock": clock}
    try:
        storage = ChunkedSegmentStorage(
            container_id,
            epoch,
            binding,
            store,
            settings,
            owns_resources=True,
            owns_store=not caller_store,
            read_only=read_only,
            limiter=limiter,
            key_ring=key_ring,
            **extra,
        )
    except BaseException:
        if not caller_store:
            store.close()
        binding.close()
        raise
    _log.info(
        "container %d %s on %s",
        container_id,
        "observed read-only" if read_only else f"started at epoch {storage.epoch}",
        url,  # the log handler's filter removes credentials from URLs
        extra={"container": container_id, "epoch": storage.epoch, "read_only": read_only},
    )
    return storage


def acquire_chunk_cache(settings: StorageConfig) -> ChunkCache:
    """The process's chunk cache in ``settings.chunk_cache_dir`` with the settings' size,
    blocks and fills (``chunk_cache.acquire``: give it back with ``chunk_cache.release``).
    ``InvalidConfig`` as ``acquire`` raises it."""
    from slts.bindings import chunk_cache

    assert settings.chunk_cache_dir and settings.chunk_cache_bytes > 0, settings  # StorageConfig checks it
    return chunk_cache.acquire(
        settings.chunk_cache_dir,
        settings.chunk_cache_bytes,
        settings.chunk_cache_block_bytes,
        settings.chunk_cache_fill_threads,
        settings.chunk_cache_fill_bytes_max,
        direct_fills=settings.chunk_cache_direct_fills,
    )


def with_chunk_cache(binding: ChunkStorage, settings: StorageConfig) -> ChunkStorage:
    """``binding`` read through the process's chunk cache in ``chunk_cache_dir``
    (``slts.bindings.chunk_cache``, docs/chunk_cache.md) when ``chunk_cache_bytes`` > 0
    and the binding's reads are remote (``high_latency_reads``: S3, HDFS); else
    ``binding`` itself (a cache asked for on a local binding is ignored, and a log line
    says why: its reads cost what a cache's would). On ``InvalidConfig`` (the folder
    cannot be used, another process has it, or this process has it open with other
    settings) ``binding`` is closed."""
    if not settings.chunk_cache_bytes:
        return binding
    if not binding.high_latency_reads:
        _log.info(
            "chunk cache off for %s: its reads are local, a cache would only copy them",
            binding.url,
            extra={"chunk_cache_dir": settings.chunk_cache_dir},
        )
        return binding
    from slts.bindings import chunk_cache

    try:
        cache = acquire_chunk_cache(settings)
    except BaseException:
        binding.close()
        raise
    return chunk_cache.CachedChunkStorage(binding, cache, shared=True)


def _check_existing(folder: str) -> None:
    """``StoreNotFound`` unless ``folder`` holds a metadata store: looking never creates."""
    if not os.path.isfile(os.path.join(folder, "data.mdb")):
        raise StoreNotFound(f"no metadata store at {folder!r} (a read-only open creates none)", path=folder)
