"""The public value types of the segment storage API (frozen, slotted dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass

from slts.storage.leaks import LeakReport


@dataclass(frozen=True, slots=True)
class SegmentHandle:
    """A segment opened for reading (``read_only``) or for writing by this instance."""

    name: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What ``info`` tells about a segment."""

    name: str
    length: int
    start_offset: int
    sealed: bool
    chunk_count: int
    max_rolling_length: int
    owner_epoch: int
    created_ms: int
    modified_ms: int


@dataclass(frozen=True, slots=True)
class StorageStatistics:
    """Counters of one instance since it started."""

    epoch: int
    writes: int
    bytes_written: int
    appends: int
    chunks_created: int
    reads: int
    bytes_read: int
    commit_retries: int
    write_failures: int
    #: The last ``check_leaks()`` report (None: no check yet): the leak gauge.
    leaks: LeakReport | None = None


@dataclass(frozen=True, slots=True)
class DefragResult:
    """What ``defrag`` did to one segment."""

    segment: str
    chunks_before: int
    chunks_after: int
    runs_planned: int
    runs_committed: int
    runs_dropped: int
    bytes_native: int  # moved by the chunk storage itself (native concat)
    bytes_copied: int  # read and written through this process
