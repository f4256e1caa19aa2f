"""What the operations of one container instance share: ``EngineContext``.

``ChunkedSegmentStorage`` builds one when it starts and hands it to the modules that
implement its operations (``layout_changes``: concat, truncate, defrag) and to the admin
and repair features layered on it (verify, backup, rolling headers, the orphan
reconciler), as Pravega's ``*Operation`` classes receive their ``ChunkedSegmentStorage``.
The context is frozen: its parts are fixed for the instance's life (the objects they
point to keep their own state: the store caches, the ownership fences, the GC queues).

Rules for its users: every change goes through ``ownership.commit`` (conditional and
epoch-fenced); ``store`` is for reads (the instance's cached view of the metadata); a
segment's records change only under its lock (``locks``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from slts.bindings.base import ChunkStorage
from slts.config import StorageConfig
from slts.errors import MetadataCorrupted, SegmentNotFound, VersionConflict
from slts.gc import GarbageCollector
from slts.metadata.ownership import Ownership, ReadOnlyOwnership
from slts.metadata.records import ChunkRecord, DecodedRecords, SegmentRecord
from slts.metadata.schema import CHUNKS, SEGMENTS, name_key
from slts.metadata.store import MetadataStore
from slts.storage.segment_locks import SegmentLocks

Result = TypeVar("Result")

#: Segment ids are ``epoch * SEGMENT_IDS_PER_EPOCH + n``: unique across epochs.
SEGMENT_IDS_PER_EPOCH = 1 << 32


@dataclass
class Counters:
    """The instance's operation counters (``StorageStatistics``); ``add`` is thread-safe."""

    writes: int = 0
    bytes_written: int = 0
    appends: int = 0
    chunks_created: int = 0
    reads: int = 0
    bytes_read: int = 0
    commit_retries: int = 0
    write_failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, **deltas: int) -> None:
        with self.lock:
            for key, delta in deltas.items():
                setattr(self, key, getattr(self, key) + delta)


class SegmentIds:
    """Fresh segment ids of one epoch (thread-safe)."""

    def __init__(self, epoch: int) -> None:
        self._epoch = epoch
        self._lock = threading.Lock()
        self._next = 1

    def new(self) -> int:
        with self._lock:
            number = self._next
            self._next += 1
        assert number < SEGMENT_IDS_PER_EPOCH, "segment ids of this epoch exhausted"
        return self._epoch * SEGMENT_IDS_PER_EPOCH + number


@dataclass(frozen=True, eq=False)
class EngineContext:
    """The parts of one container instance (see module doc)."""

    container_id: int
    epoch: int
    config: StorageConfig
    binding: ChunkStorage
    store: MetadataStore
    ownership: Ownership | ReadOnlyOwnership
    gc: GarbageCollector
    clock: Callable[[], float]
    records: DecodedRecords
    segment_ids: SegmentIds
    locks: SegmentLocks = field(default_factory=SegmentLocks)
    counters: Counters = field(default_factory=Counters)
    #: Chunks this instance must not append to any more (a failed append left them in doubt).
    tainted: set[str] = field(default_factory=set)

    def now_ms(self) -> int:
        """The instance's clock, in milliseconds (record timestamps, GC due times)."""
        return int(self.clock() * 1000)

    def retry_conflicts(self, attempt: Callable[[], Result]) -> Result:
        """``attempt()``, run again (at most ``commit_retries_max`` more times) while it
        raises ``VersionConflict``.

        For an owner's change of a segment that a non-owner may change too: a defrag
        batch driver (``slts.storage.batch_defrag``) fences nobody and commits new
        layouts beside the live owner, so the records an owner read may have moved by the
        time it commits, and its change is still as valid as before. ``attempt`` must read
        what it needs afresh (``load``, ``chunk``: the store's cache evicts the keys of a
        conflicting commit and drops everything when another process committed), check
        its preconditions again, and change nothing before its one conditional commit;
        so each run is the whole operation, decided anew. ``Fenced`` (a newer owner) and
        every other error pass through at once. Raises the last ``VersionConflict`` if
        the records kept moving: nothing changed then.
        """
        for retry in range(self.config.commit_retries_max + 1):
            try:
                return attempt()
            except VersionConflict:
                if retry == self.config.commit_retries_max:
                    raise
                self.counters.add(commit_retries=1)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def new_segment_id(self) -> int:
        """An id no segment of the container ever had."""
        return self.segment_ids.new()

    def load(self, name: str) -> tuple[SegmentRecord, int]:
        """Segment ``name``'s record and version. Raises ``SegmentNotFound``."""
        key = name_key(name)
        stored = self.store.get(SEGMENTS, key)
        if stored is None:
            raise SegmentNotFound(f"segment {name!r} does not exist", segment=name)
        return self.records.decode(SEGMENTS, key, stored.version, stored.value, SegmentRecord), stored.version

    def chunk(self, name: str) -> tuple[ChunkRecord, int]:
        """Chunk ``name``'s record and version. Raises ``MetadataCorrupted`` if missing
        (a segment's list names it: a stale cached layout, or a damaged store)."""
        key = name_key(name)
        stored = self.store.get(CHUNKS, key)
        if stored is None:
            raise MetadataCorrupted(f"chunk record {name!r} is referenced but missing", chunk=name)
        return self.records.decode(CHUNKS, key, stored.version, stored.value, ChunkRecord), stored.version
