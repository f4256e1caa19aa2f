"""Which tables a container's metadata store has, and how their keys are built.

=========== ============================================ ===========================
table       key                                          value
=========== ============================================ ===========================
container   ``b"container"``                             ``ContainerRecord``
segments    segment name (UTF-8)                         ``SegmentRecord`` (live)
chunks      chunk name (UTF-8)                           ``ChunkRecord``
index       segment_id (u64 BE) + chunk start (u64 BE)   chunk name (UTF-8, raw)
deleted     segment_id (u64 BE)                          ``SegmentRecord`` tombstone
gc          queued time ms (u64 BE) + chunk name         ``GcEntry``
remote_*    tiered log storage (``slts.remote``): remote log segments, per-epoch offset
            maps, per-partition records; keys in ``slts/remote/keys.py``
offload_*   Pulsar-style offload (``slts.offload``)
usage       container id (u64 BE) + traffic class name   ``UsageRecord`` (``slts.usage``)
=========== ============================================ ===========================

The ``index`` table is derived data written in the same transaction as the chunk list
it mirrors: the chunk holding offset ``o`` of segment ``id`` is the ``floor`` of
``index_key(id, o)`` within ``index_prefix(id)``: O(log n), never a list walk.
Keys are bytewise-ordered, so big-endian integers sort numerically.
"""

from __future__ import annotations

import struct

CONTAINER = "container"
SEGMENTS = "segments"
CHUNKS = "chunks"
INDEX = "index"
DELETED = "deleted"
GC = "gc"

#: Tiered log storage (KIP-405, ``slts.remote``): clients of the segment store keep their
#: metadata in the container's store, so its commits are fenced and its durable copy has it.
REMOTE_SEGMENTS = "remote_segments"
REMOTE_EPOCHS = "remote_epochs"
REMOTE_OFFSETS = "remote_offsets"
REMOTE_PARTITIONS = "remote_partitions"
REMOTE_TABLES: tuple[str, ...] = (REMOTE_SEGMENTS, REMOTE_EPOCHS, REMOTE_OFFSETS, REMOTE_PARTITIONS)

#: Pulsar-style ledger offload (PIP-17, ``slts.offload``): one record per offload attempt
#: (ledger id + uid), recorded before the attempt writes anything.
OFFLOAD_LEDGERS = "offload_ledgers"
#: Streaming offload (PIP-76): per managed ledger, its segments (sequence -> record) and
#: its ledgers' offload contexts (ledger id -> record).
OFFLOAD_STREAM_SEGMENTS = "offload_stream_segments"
OFFLOAD_STREAM_LEDGERS = "offload_stream_ledgers"
OFFLOAD_TABLES: tuple[str, ...] = (OFFLOAD_LEDGERS, OFFLOAD_STREAM_SEGMENTS, OFFLOAD_STREAM_LEDGERS)

#: The tables of the segment store's clients: a write may commit operations on them in its
#: own transaction (``ChunkedSegmentStorage.write(..., also=...)``); the engine's tables never.
CLIENT_TABLES: tuple[str, ...] = (*REMOTE_TABLES, *OFFLOAD_TABLES)

#: What each container asked of the chunk storage (``slts.usage``): requests by kind and
#: bytes, per traffic class; key: container id (u64 BE) + the class's name.
USAGE = "usage"

TABLES: tuple[str, ...] = (
    CONTAINER,
    SEGMENTS,
    CHUNKS,
    INDEX,
    DELETED,
    GC,
    *REMOTE_TABLES,
    *OFFLOAD_TABLES,
    USAGE,
)

CONTAINER_KEY = b"container"

_U64 = struct.Struct(">Q")
_U64_PAIR = struct.Struct(">QQ")


def name_key(name: str) -> bytes:
    """Key of a segment or chunk record."""
    return name.encode("utf-8", "surrogatepass")


def key_name(key: bytes) -> str:
    """Inverse of ``name_key``."""
    return key.decode("utf-8", "surrogatepass")


def segment_id_key(segment_id: int) -> bytes:
    """Key of a tombstone in ``deleted``; also the prefix of the segment's index keys."""
    return _U64.pack(segment_id)


def index_prefix(segment_id: int) -> bytes:
    """All index keys of one segment start with this."""
    return _U64.pack(segment_id)


def index_key(segment_id: int, start_offset: int) -> bytes:
    """Index key of the chunk of ``segment_id`` that starts at ``start_offset``."""
    return _U64_PAIR.pack(segment_id, start_offset)


def index_key_offset(key: bytes) -> int:
    """The chunk start offset encoded in an index key."""
    return _U64_PAIR.unpack(key)[1]


def gc_key(queued_ms: int, chunk: str) -> bytes:
    """GC queue key: ordered by the time the chunk was queued, then chunk name. The
    delay is applied when collecting, so a changed ``gc_delay_s`` applies to old entries."""
    return _U64.pack(queued_ms) + name_key(chunk)


def gc_queued_stop(queued_ms: int) -> bytes:
    """Scan bound: every GC key queued at or before ``queued_ms`` sorts below it."""
    return _U64.pack(queued_ms + 1)
