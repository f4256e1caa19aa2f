"""Tiered log storage for Kafka-style stream engines (KIP-405) on SLTS (docs/remote.md).

* ``records``: remote log segment metadata, its states and legal transitions;
* ``rlmm``: the remote log metadata manager, on the container's metadata store;
* ``rsm``: the remote storage manager, log segments and indexes as SLTS segments;
* ``inspection``: the check of a rolled segment's files before it is tiered;
* ``manager``: the remote log manager's copy, fetch and retention tasks;
* ``local_log``: what those tasks know of the engine's local log;
* ``lineage``: the leader-epoch cache and which remote segments belong to its lineage;
* ``inspection``: the checks of a segment's files before it is copied;
* ``kafka_formats``: Kafka's on-disk formats (v2 record batches, offset and time
  indexes, the leader-epoch checkpoint), read and written exactly.
"""

from slts.remote.lineage import LeaderEpochCache
from slts.remote.local_log import LocalLog, LocalSegment, local_log
from slts.remote.manager import CopyReport, FetchResult, RemoteLogManager, RetentionReport
from slts.remote.records import (
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicPartition,
    new_segment_metadata,
)
from slts.remote.rlmm import RemoteLogMetadataManager
from slts.remote.rsm import IndexType, LogSegmentData, RemoteStorageManager

__all__ = [
    "CopyReport",
    "FetchResult",
    "IndexType",
    "LeaderEpochCache",
    "LocalLog",
    "LocalSegment",
    "LogSegmentData",
    "PartitionDeleteState",
    "RemoteLogManager",
    "RemoteLogMetadataManager",
    "RemoteLogSegmentMetadata",
    "RemoteStorageManager",
    "RetentionReport",
    "SegmentState",
    "TopicPartition",
    "local_log",
    "new_segment_metadata",
]
