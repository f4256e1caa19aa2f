"""Metadata stores: ordered tables of versioned records with atomic conditional commits.

The contract is ``slts.metadata.store``; implementations: ``MemoryMetadataStore``
(reference), ``LmdbMetadataStore`` (durable, default) and ``CachedMetadataStore``
(bounded write-through cache in front of either). Every store can capture its commits
(``Change``) for the metadata log and ``replicate`` them back (``replicate_rows`` in
bulk). Nothing here imports the engine.
"""

from __future__ import annotations

from slts.metadata.cache import CachedMetadataStore
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.store import (
    KEY_BYTES_MAX,
    SCAN_LIMIT_DEFAULT,
    SEQUENCE_MAX,
    Change,
    CommitOp,
    Delete,
    DeleteKeys,
    DeleteRange,
    Expect,
    MetadataStore,
    Operation,
    Put,
    ReadView,
    Row,
    StoreStatistics,
    Versioned,
    prefix_stop,
)

__all__ = [
    "KEY_BYTES_MAX",
    "SCAN_LIMIT_DEFAULT",
    "SEQUENCE_MAX",
    "CachedMetadataStore",
    "Change",
    "CommitOp",
    "Delete",
    "DeleteKeys",
    "DeleteRange",
    "Expect",
    "LmdbMetadataStore",
    "MemoryMetadataStore",
    "MetadataStore",
    "Operation",
    "Put",
    "ReadView",
    "Row",
    "StoreStatistics",
    "Versioned",
    "prefix_stop",
]
