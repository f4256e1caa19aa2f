"""Key layout of the remote-log tables (``slts.metadata.schema.REMOTE_TABLES``).

================== ================================================== ===============================
table              key                                                value
================== ================================================== ===============================
remote_segments    segment id (16 bytes)                              ``RemoteLogSegmentMetadata``
remote_epochs      partition + epoch (u32 BE) + epoch start (u64 BE)  segment id (16 bytes)
remote_offsets     partition + start offset (u64 BE) + segment id     ``b""``
remote_partitions  partition                                          ``RemotePartitionRecord``
================== ================================================== ===============================

*partition* is the topic's UTF-8 bytes, a zero byte (never in a topic name, so no key of
one topic is a prefix of another's) and the partition number (u32 BE). ``remote_epochs``
holds Kafka's per-epoch offset map of COPY_SEGMENT_FINISHED segments: the segment holding
offset ``o`` under epoch ``e`` is the ``floor`` of ``epoch_key(p, e, o)`` within
``epoch_prefix(p, e)``, O(log n). ``remote_offsets`` lists every segment not yet
DELETE_SEGMENT_FINISHED in start-offset order, for listings.
"""

from __future__ import annotations

import struct

from slts.remote.records import TopicPartition

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ID_BYTES = 16


def partition_key(tp: TopicPartition) -> bytes:
    """The prefix of every key of ``tp``."""
    return tp.topic.encode("ascii") + b"\x00" + _U32.pack(tp.partition)


def partition_of(key: bytes) -> TopicPartition:
    """Inverse of ``partition_key`` (the key may carry more after the partition)."""
    topic, _, rest = key.partition(b"\x00")
    return TopicPartition(topic.decode("ascii"), _U32.unpack_from(rest)[0])


def epoch_prefix(tp: TopicPartition, epoch: int) -> bytes:
    """All offset-map keys of ``epoch`` of ``tp`` start with this."""
    return partition_key(tp) + _U32.pack(epoch)


def epoch_key(tp: TopicPartition, epoch: int, offset: int) -> bytes:
    """The offset-map key of a segment whose ``epoch`` starts at ``offset``."""
    return epoch_prefix(tp, epoch) + _U64.pack(offset)


def epoch_key_offset(key: bytes) -> int:
    """The epoch start offset in an offset-map key."""
    return _U64.unpack_from(key, len(key) - 8)[0]


def offsets_key(tp: TopicPartition, start_offset: int, segment_id: bytes) -> bytes:
    """The listing key of a segment of ``tp`` starting at ``start_offset``."""
    assert len(segment_id) == _ID_BYTES
    return partition_key(tp) + _U64.pack(start_offset) + segment_id


def offsets_key_id(key: bytes) -> bytes:
    """The segment id in a listing key."""
    return key[-_ID_BYTES:]
