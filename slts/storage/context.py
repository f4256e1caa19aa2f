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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from slts.bindings.base import ChunkStorage
from slts.config import StorageConfig
from slts.errors import MetadataCorrupted, SegmentNotFound, VersionConflict
from slts.gc import GarbageCollector
from slts.metadata.ownership import Ownership, ReadOnlyOwnership
from slts.metadata.records import ChunkRecord, DecodedRecords, SegmentRecord
from slts.metadata.schema import CHUNKS, SEGMENTS, name_key
from slts.metadata.store import MetadataStore, Versioned
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

    def add_read(self, length: int) -> None:
        """One read of ``length`` bytes (``add(reads=1, bytes_read=length)``, the hot path)."""
        with self.lock:
            self.reads += 1
            self.bytes_read += length


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

    def load(self, name: str, source: RecordReader | None = None) -> tuple[SegmentRecord, int]:
        """Segment ``name``'s record and version, from ``source`` (a snapshot's view) or
        the instance's store. Raises ``SegmentNotFound``."""
        key = name_key(name)
        stored = (self.store if source is None else source).get(SEGMENTS, key)
        if stored is None:
            raise SegmentNotFound(f"segment {name!r} does not exist", segment=name)
        return self.records.decode(SEGMENTS, key, stored.version, stored.value, SegmentRecord), stored.version

    def chunk(self, name: str, source: RecordReader | None = None) -> tuple[ChunkRecord, int]:
        """Chunk ``name``'s record and version, from ``source`` (a snapshot's view) or the
        instance's store. Raises ``MetadataCorrupted`` if missing (a segment's list names
        it: a layout read across a change, or a damaged store)."""
        key = name_key(name)
        stored = (self.store if source is None else source).get(CHUNKS, key)
        if stored is None:
            raise MetadataCorrupted(f"chunk record {name!r} is referenced but missing", chunk=name)
        return self.records.decode(CHUNKS, key, stored.version, stored.value, ChunkRecord), stored.version

    def version(self, name: str) -> int:
        """The version of segment ``name``'s record now; 0 if there is none. Every change
        of a segment's chunk list, lengths or offset index commits its record (a new
        version; versions are never reused), so a layout read between two equal versions
        is one committed layout."""
        stored = self.store.get(SEGMENTS, name_key(name))
        return 0 if stored is None else stored.version

    def layout(self, name: str) -> tuple[SegmentRecord, list[tuple[int, ChunkRecord]]]:
        """Segment ``name``'s record and chunk list ((start offset, record) pairs, from the
        head), read in one snapshot of the store: one committed layout, whatever commits
        meanwhile (a defrag, truncate, concat or GC in this or another process).

        O(chunks) in one read transaction: for inspection (``chunks``, verify, scrub,
        backup), not the read path. Raises ``SegmentNotFound``, and ``MetadataCorrupted``
        if the list is broken in that committed state (damage: no race can cause it)."""
        with self.store.snapshot() as view:
            record, _ = self.load(name, view)
            listed, problems = walk_chunks(view, record, self.records)
        if problems:
            raise MetadataCorrupted(problems[0], segment=name)
        return record, listed

    def still_listed(self, name: str, chunks: Iterable[str]) -> set[str]:
        """Those of ``chunks`` that segment ``name``'s layout lists now (none if the
        segment is gone). A check that planned from an earlier layout and then found a
        chunk missing on the chunk storage asks this before it reports damage: a chunk
        dropped by a defrag, truncate or delete since, and collected, is no damage."""
        try:
            _, listed = self.layout(name)
        except SegmentNotFound:
            return set()
        wanted = set(chunks)
        return {chunk.name for _, chunk in listed if chunk.name in wanted}


class RecordReader(Protocol):
    """Where records are read from: a ``ReadView`` (one committed state) or a store."""

    def get(self, table: str, key: bytes) -> Versioned | None: ...


def walk_chunks(
    source: RecordReader, record: SegmentRecord, records: DecodedRecords | None = None
) -> tuple[list[tuple[int, ChunkRecord]], list[str]]:
    """Segment ``record``'s chunk list read from ``source`` ((start offset, record) pairs,
    from the head) and what is wrong with it (empty: well formed): a chunk named but
    without a record, a list longer than ``chunk_count`` (a cycle), a count, end or last
    chunk that disagrees with the record. The walk stops at the first broken link.
    Read from one snapshot, a problem is damage; read across commits, it may be a race."""
    problems: list[str] = []
    listed: list[tuple[int, ChunkRecord]] = []
    name, start = record.first_chunk, record.first_chunk_start_offset
    while name is not None:
        if len(listed) > record.chunk_count:
            problems.append(
                f"{record.name}: chunk list longer than chunk_count {record.chunk_count} (cycle?)"
            )
            break
        key = name_key(name)
        stored = source.get(CHUNKS, key)
        if stored is None:
            problems.append(f"{record.name}: chunk {name!r} is referenced but has no record")
            break
        chunk = (
            ChunkRecord.decode(stored.value)
            if records is None
            else records.decode(CHUNKS, key, stored.version, stored.value, ChunkRecord)
        )
        listed.append((start, chunk))
        start += chunk.length
        name = chunk.next_chunk
    if not problems:
        if len(listed) != record.chunk_count:
            problems.append(
                f"{record.name}: {len(listed)} chunks listed, chunk_count says {record.chunk_count}"
            )
        if listed and start != record.length:
            problems.append(f"{record.name}: chunks end at {start}, length is {record.length}")
        if listed and (
            listed[-1][1].name != record.last_chunk or listed[-1][0] != record.last_chunk_start_offset
        ):
            problems.append(f"{record.name}: last_chunk / last_chunk_start_offset disagree with the list")
    return listed, problems
