"""``slts.open``: a container instance from a chunk storage URL and a metadata location."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from slts.bindings import from_url
from slts.config import StorageConfig
from slts.errors import InvalidConfig
from slts.metadata.layout import TABLES
from slts.metadata.store import MetadataStore
from slts.storage.chunked import ChunkedSegmentStorage

#: ``metadata=`` value that selects the in-memory store (tests, simulation).
MEMORY_METADATA = ":memory:"


def open_metadata(metadata: str | os.PathLike[str] | MetadataStore) -> MetadataStore:
    """The metadata store named by ``metadata``: a store object (used as is), the string
    ``":memory:"`` (a new in-memory store) or a folder path (an LMDB environment)."""
    if isinstance(metadata, MetadataStore):
        return metadata
    if metadata == MEMORY_METADATA:
        from slts.metadata.memory_store import MemoryMetadataStore

        return MemoryMetadataStore(TABLES)
    if isinstance(metadata, (str, os.PathLike)) and str(metadata):
        from slts.metadata.lmdb_store import LmdbMetadataStore

        return LmdbMetadataStore(os.fspath(metadata), TABLES)
    raise InvalidConfig(f"metadata must be a folder path, {MEMORY_METADATA!r} or a MetadataStore, got {metadata!r}")


def open(  # noqa: A001 - the public name the design gives it: slts.open(url, ...)
    url: str,
    *,
    metadata: str | os.PathLike[str] | MetadataStore | None = None,
    epoch: int | None = None,
    container_id: int = 0,
    clock: Callable[[], float] | None = None,
    read_only: bool = False,
    **config: Any,
) -> ChunkedSegmentStorage:
    """Start container ``container_id`` on the chunk storage at ``url``.

    ``metadata`` is required except for ``memory://`` URLs, which default to an
    in-memory store. ``epoch=None`` takes the next epoch after the recorded one.
    ``read_only=True`` observes without taking the container over (no epoch, fences
    nobody, every change raises ``ReadOnlyInstance``).
    Remaining keyword arguments are ``StorageConfig`` fields. The returned instance
    owns the binding and the store it opened and closes them on ``close``.

    Raises ``InvalidConfig`` (bad URL, unknown option), ``Fenced`` (epoch not newer).
    """
    settings = StorageConfig.from_mapping(config)
    if metadata is None:
        if not isinstance(url, str) or not url.startswith("memory://"):
            raise InvalidConfig("metadata= (an LMDB folder) is required for this chunk storage URL")
        metadata = MEMORY_METADATA
    binding = from_url(url)
    store = open_metadata(metadata)
    extra = {} if clock is None else {"clock": clock}
    try:
        return ChunkedSegmentStorage(
            container_id, epoch, binding, store, settings, owns_resources=True, read_only=read_only, **extra
        )
    except BaseException:
        store.close()
        binding.close()
        raise
