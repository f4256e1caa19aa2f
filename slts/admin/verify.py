"""Checks of DESIGN.md §5's invariants on a live store (tests, and later ``slts verify``).

``verify_segment`` checks one segment: its record's invariants, a well-formed chunk
list (count, offsets, no cycle), every chunk present on the chunk storage with at least
its recorded length (invariant 2), and the offset index resolving each chunk's first
and last byte to that chunk. ``verify_container`` does that for every segment and then
checks that no chunk of the container lies on storage unaccounted for: each is
referenced by a live list, by a deleted segment's list awaiting GC, or by a GC queue
entry (invariant 5/6: leak-free), and no index entry or chunk record is left that
nothing reaches (``slts.storage.leaks``; its report is ``ContainerReport.leaks``, also
the leak gauge of ``statistics()``); and it checks the tier-2 copy of the metadata
(``slts.journal.restore.verify_copy``: the journal replays, the system segments are
whole, a restore from tier-2 alone succeeds, no stale system chunk). Both return a list
of problems; empty means healthy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import crc32c

from slts.bindings.base import ChunkStorage
from slts.errors import ChunkNotFound, SegmentNotFound
from slts.journal.restore import verify_copy
from slts.journal.system_names import system_prefix
from slts.metadata import index
from slts.metadata.records import ChunkRecord, GcEntry, SegmentRecord
from slts.metadata.schema import CHUNKS, DELETED, GC, SEGMENTS, name_key
from slts.metadata.store import ReadView
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.context import walk_chunks
from slts.storage.leaks import LeakReport
from slts.storage.segment_names import chunk_prefix


@dataclass
class ContainerReport:
    """What ``verify_container`` found."""

    segments: int = 0
    chunks: int = 0
    copy_sequence: int | None = None  # the sequence a restore from tier-2 reaches (None: no copy)
    leaks: LeakReport | None = None  # metadata nothing reaches (its index and chunk leaks are problems)
    problems: list[str] = field(default_factory=list)


def verify_segment(storage: ChunkedSegmentStorage, name: str, *, checksums: bool = False) -> list[str]:
    """Problems found in segment ``name`` (empty list: healthy). With ``checksums`` every
    chunk that has a recorded CRC32C is read whole and its bytes checked against it.
    ``SegmentNotFound`` if the segment does not exist."""
    return _verify_segment(storage, name, checksums)[1]


def _verify_segment(
    storage: ChunkedSegmentStorage, name: str, checksums: bool
) -> tuple[list[tuple[int, ChunkRecord]], list[str]]:
    """(the chunk list checked, the problems found) of segment ``name``.

    The record, its chunk list and the offset index are read in one snapshot (one
    committed layout); the chunks are then checked on the chunk storage, and a chunk found
    missing or short there is reported only if the segment's layout still lists it: a
    defrag, truncate or delete beside the check may have dropped it and GC collected it,
    which is no damage."""
    context = storage.context
    key = name_key(name)
    with context.store.snapshot() as view:
        stored = view.get(SEGMENTS, key)
        if stored is None:
            raise SegmentNotFound(f"segment {name!r} does not exist", segment=name)
        record = SegmentRecord.decode(stored.value)
        listed, problems = walk_chunks(view, record)
        problems += _index_problems(view, record, listed)
    binding = storage.chunk_storage
    suspects: dict[str, str] = {}  # chunk -> its problem on the chunk storage
    for _, chunk in listed:
        try:
            stored_length = binding.get_info(chunk.name).length
        except ChunkNotFound:
            suspects[chunk.name] = f"{name}: chunk {chunk.name!r} is missing from the chunk storage"
            continue
        if stored_length < chunk.stored:
            suspects[chunk.name] = (
                f"{name}: chunk {chunk.name!r} holds {stored_length} bytes, {chunk.stored} recorded"
            )
        elif checksums and chunk.checksum is not None:
            try:
                if _checksum(binding, chunk) != chunk.checksum:
                    problems.append(
                        f"{name}: chunk {chunk.name!r} fails its CRC32C (its bytes are not the ones written)"
                    )
            except ChunkNotFound:
                suspects[chunk.name] = f"{name}: chunk {chunk.name!r} is missing from the chunk storage"
    still = context.still_listed(name, suspects) if suspects else set()
    return listed, problems + [problem for chunk, problem in suspects.items() if chunk in still]


def _index_problems(
    view: ReadView, record: SegmentRecord, listed: list[tuple[int, ChunkRecord]]
) -> list[str]:
    """Offsets where the index (read in ``view``) and the list disagree: each chunk's
    first readable and last byte must resolve to that chunk."""
    problems: list[str] = []
    for start, chunk in listed:
        if chunk.length == 0 or start + chunk.length <= record.start_offset:
            continue  # empty, or wholly below the start (an interrupted truncate leaves such)
        for offset in sorted({max(start, record.start_offset), start + chunk.length - 1}):
            if offset < record.start_offset or offset >= record.length:
                continue
            found, found_start = index.resolve(view, record.segment_id, offset)
            if (found, found_start) != (chunk.name, start):
                problems.append(
                    f"{record.name}: index maps offset {offset} to {found!r}@{found_start}, list says "
                    f"{chunk.name!r}@{start}"
                )
    return problems


def _checksum(binding: ChunkStorage, chunk: ChunkRecord, piece_bytes: int = 8 << 20) -> int:
    """CRC32C of the chunk's recorded bytes as stored (a chunk of frames: its frames), read
    in pieces."""
    handle, value, offset = binding.open_read(chunk.name), 0, 0
    while offset < chunk.stored:
        data = binding.read(handle, offset, min(piece_bytes, chunk.stored - offset))
        assert data, "a chunk shorter than its checked length"
        value = crc32c.crc32c(data, value)
        offset += len(data)
    return value


def verify_container(storage: ChunkedSegmentStorage, *, checksums: bool = False) -> ContainerReport:
    """Every segment healthy (``checksums``: chunk bytes checked too), every chunk on
    storage accounted for, and the tier-2 copy of the metadata restorable."""
    report = ContainerReport()
    referenced: set[str] = set()
    for name in storage.list():
        try:
            listed, problems = _verify_segment(storage, name, checksums)
        except SegmentNotFound:
            continue  # deleted meanwhile
        report.segments += 1
        report.problems.extend(problems)
        referenced.update(chunk.name for _, chunk in listed)
    store = storage.context.store
    for _, stored in store.iterate(DELETED):
        tombstone = SegmentRecord.decode(stored.value)
        referenced.update(chunk.name for _, chunk in walk_chunks(store, tombstone)[0])
    queued = {name for _, stored in store.iterate(GC) for name in GcEntry.decode(stored.value).chunks}
    report.chunks = len(referenced)
    system = system_prefix(storage.container_id)
    unaccounted = [
        chunk
        for chunk in storage.chunk_storage.list(chunk_prefix(storage.container_id))
        if chunk not in referenced and chunk not in queued and not chunk.startswith(system)
    ]
    # Gathered before the listing, the references miss chunks created since (each
    # registered with GC before its creation): a chunk is a leak only if, after the
    # listing, it has neither a record nor a GC entry.
    queued_now = (
        {name for _, s in store.iterate(GC) for name in GcEntry.decode(s.value).chunks}
        if unaccounted
        else set()
    )
    for chunk in unaccounted:
        if store.get(CHUNKS, name_key(chunk)) is None and chunk not in queued_now:
            report.problems.append(
                f"chunk {chunk!r} is on the chunk storage but nothing references it (leak)"
            )
    report.leaks = storage.check_leaks()
    report.problems.extend(report.leaks.problems(gc=False))
    # The durable copy is checked where it is, on the chunk storage: a chunk cache's copy of
    # it would prove nothing about the loss of the machine (and the scan would flush it).
    copy = verify_copy(
        storage.chunk_storage.around_caches(), storage.container_id, storage.transforms.record_seal
    )
    report.problems.extend(copy.problems)
    report.copy_sequence = copy.sequence if copy.exists else None
    return report
