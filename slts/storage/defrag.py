"""Defrag: replace runs of consecutive small chunks by one chunk (PDP-34 "Defrag").

Three steps, kept apart so that the same logic serves the in-process driver
(``ChunkedSegmentStorage.defrag``) and batch drivers that execute runs elsewhere:

1. ``plan_runs``: from a segment's chunk list (read in one snapshot, with versions),
   the runs worth merging: at least two consecutive chunks, each smaller than
   ``defrag_small_chunk_bytes``, together at most ``defrag_run_bytes_max`` (and the
   segment's ``max_rolling_length``) bytes and ``defrag_run_chunks_max`` chunks. The
   last chunk of an unsealed segment is left out: a writer may be appending to it.
2. ``build_chunk``: produce the new chunk from the run's chunks on the chunk storage:
   natively (``ChunkStorage.concat``; no bytes through this process) where the binding
   can, else by reading and creating. Only the recorded lengths are used.
3. ``commit_ops``: one conditional commit swaps the run for the new chunk: it expects
   the segment, the run's chunks and the chunk before the run at the versions planned,
   so a run that changed meanwhile is dropped (its new chunk stays in the GC queue as
   an ``intent`` and is collected). The run's chunks go to GC as ``dropped``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

from slts.bindings.base import ChunkStorage, ConcatSource
from slts.config import StorageConfig
from slts.metadata.layout import CHUNKS, GC, SEGMENTS, name_key
from slts.metadata.records import ChunkRecord, SegmentRecord
from slts.metadata.store import Delete, Expect, Operation, Put, ReadView
from slts.storage import index


@dataclass(frozen=True, slots=True)
class ListedChunk:
    """A chunk of a segment's list as read for planning: record, version, segment offset."""

    record: ChunkRecord
    version: int
    start: int


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive chunks to merge into one, with what the commit will expect."""

    segment: str
    segment_id: int
    start: int  # segment offset of the first chunk of the run
    chunks: tuple[ListedChunk, ...]
    #: The chunk before the run as planned (None: the run is the head). It may have been
    #: replaced since (by the previous run of the same plan): committers look it up again.
    predecessor: ListedChunk | None

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def length(self) -> int:
        return sum(chunk.record.length for chunk in self.chunks)


@dataclass(frozen=True, slots=True)
class BuiltChunk:
    """What ``build_chunk`` made: the new chunk's length, checksum and how bytes moved."""

    name: str
    length: int
    checksum: int | None
    bytes_native: int
    bytes_copied: int


def read_list(view: ReadView, record: SegmentRecord) -> list[ListedChunk]:
    """The segment's chunk list with versions, from one consistent view. O(chunks)."""
    listed: list[ListedChunk] = []
    name, start = record.first_chunk, record.first_chunk_start_offset
    while name is not None:
        assert len(listed) < record.chunk_count, f"chunk list of {record.name!r} longer than recorded"
        stored = view.get(CHUNKS, name_key(name))
        assert stored is not None, f"chunk {name!r} of {record.name!r} has no record"
        chunk = ChunkRecord.decode(stored.value)
        listed.append(ListedChunk(chunk, stored.version, start))
        start += chunk.length
        name = chunk.next_chunk
    assert len(listed) == record.chunk_count, (record.name, len(listed), record.chunk_count)
    return listed


def plan_runs(record: SegmentRecord, listed: list[ListedChunk], config: StorageConfig) -> Iterator[Run]:
    """The runs of ``listed`` worth merging (see module doc), in list order."""
    bytes_max = min(config.defrag_run_bytes_max, record.max_rolling_length)
    candidates = listed if record.sealed else listed[:-1]
    run: list[ListedChunk] = []
    run_bytes = 0
    for position, chunk in enumerate([*candidates, None]):
        small = chunk is not None and chunk.record.length < config.defrag_small_chunk_bytes
        fits = small and run_bytes + chunk.record.length <= bytes_max and len(run) < config.defrag_run_chunks_max
        if fits:
            assert chunk is not None
            run.append(chunk)
            run_bytes += chunk.record.length
            continue
        if len(run) >= 2:
            first = position - len(run)
            yield Run(record.name, record.segment_id, run[0].start, tuple(run), listed[first - 1] if first else None)
        run, run_bytes = ([chunk], chunk.record.length) if small and chunk is not None else ([], 0)


def build_chunk(binding: ChunkStorage, run: Run, new_name: str, *, checksums: bool) -> BuiltChunk:
    """Create chunk ``new_name`` holding the run's bytes (recorded lengths only)."""
    sources = [ConcatSource(chunk.record.name, 0, chunk.record.length) for chunk in run.chunks]
    if binding.supports_concat:
        copied = binding.concat_bytes_through_client(sources)
        info = binding.concat(new_name, sources)
        assert info.length == run.length, (info, run.length)
        checksum = _combined_checksum(run) if checksums else None
        return BuiltChunk(new_name, run.length, checksum, run.length - copied, copied)
    parts = [binding.read(binding.open_read(s.name), s.offset, s.length) for s in sources]
    data = b"".join(parts)
    if len(data) != run.length:
        from slts.errors import ChunkCorrupted

        raise ChunkCorrupted(f"a chunk of the run at {run.start} of {run.segment!r} is shorter than recorded")
    binding.create(new_name, data)
    return BuiltChunk(new_name, run.length, crc32c.crc32c(data) if checksums else None, 0, run.length)


def _combined_checksum(run: Run) -> int | None:
    """The CRC32C of the concatenation, from the parts' CRCs (None if one is unknown)."""
    value: int | None = None
    for chunk in run.chunks:
        if chunk.record.checksum is None:
            return None
        value = chunk.record.checksum if value is None else crc32c_combine(value, chunk.record.checksum, chunk.record.length)
    return value


def commit_ops(
    view: ReadView,
    record: SegmentRecord,
    version: int,
    run: Run,
    built: BuiltChunk,
    epoch: int,
    intent_key: bytes,
    intent_version: int,
    dropped_entries: list[Put],
) -> tuple[list[Operation], list[Expect]] | None:
    """The commit that swaps ``run`` for ``built`` in ``record`` (read at ``version``), or
    None if the segment no longer has the run where planned (the run is dropped)."""
    last, first = run.chunks[-1], run.chunks[0].record.name
    head = run.predecessor is None
    if head and record.first_chunk != first:
        return None
    if not head and run.predecessor.record.next_chunk != first:  # type: ignore[union-attr]
        return None
    new = ChunkRecord(
        name=built.name, index_id=record.segment_id, index_offset=run.start, length=built.length,
        next_chunk=last.record.next_chunk, epoch=epoch, checksum=built.checksum,
    )  # fmt: skip
    ops: list[Operation] = [Put(CHUNKS, name_key(new.name), new.encode()), Delete(GC, intent_key)]
    expect = [Expect(SEGMENTS, name_key(record.name), version), Expect(GC, intent_key, intent_version)]
    for chunk in run.chunks:
        ops.append(Delete(CHUNKS, name_key(chunk.record.name)))
        expect.append(Expect(CHUNKS, name_key(chunk.record.name), chunk.version))
        if chunk.record.index_id != record.segment_id:
            ops.append(index.chunk_entry_delete(chunk.record))
    if run.predecessor is not None:
        previous = run.predecessor.record.replace(next_chunk=new.name)
        ops.append(Put(CHUNKS, name_key(previous.name), previous.encode()))
        expect.append(Expect(CHUNKS, name_key(previous.name), run.predecessor.version))
    if last.record.next_chunk is not None:
        ops.extend(index.split_ops(view, record.segment_id, run.end))
    ops.extend(index.clear_ops(view, record.segment_id, run.start, run.end, 2 * len(run.chunks) + 2))
    ops.append(index.chunk_entry(new))
    ops.extend(dropped_entries)
    changes: dict[str, object] = {"chunk_count": record.chunk_count - len(run.chunks) + 1}
    if head:
        changes["first_chunk"] = new.name
    if record.last_chunk == last.record.name:
        changes["last_chunk"] = new.name
        changes["last_chunk_start_offset"] = run.start
    ops.append(Put(SEGMENTS, name_key(record.name), record.replace(**changes).encode()))
    return ops, expect


# -- CRC32C combination (zlib's crc32_combine, for the Castagnoli polynomial) ---------------------

_CASTAGNOLI_REVERSED = 0x82F63B78


def _gf2_times(matrix: list[int] | tuple[int, ...], vector: int) -> int:
    total, i = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: list[int] | tuple[int, ...]) -> list[int]:
    return [_gf2_times(matrix, row) for row in matrix]


@functools.cache
def _zeros_operator(power: int) -> tuple[int, ...]:
    """The GF(2) matrix that advances a CRC32C register over ``2**power`` zero bytes."""
    if power == 0:
        one_bit = [_CASTAGNOLI_REVERSED] + [1 << i for i in range(31)]
        two_bits = _gf2_square(one_bit)
        four_bits = _gf2_square(two_bits)
        return tuple(_gf2_square(four_bits))  # eight bits: one byte
    return tuple(_gf2_square(_zeros_operator(power - 1)))


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """CRC32C of ``a + b`` from ``crc(a)``, ``crc(b)`` and ``len(b)``: advance ``crc(a)``
    over ``len(b)`` zero bytes (one cached operator per bit of the length), then xor."""
    assert length_b >= 0
    power = 0
    while length_b:
        if length_b & 1:
            crc_a = _gf2_times(_zeros_operator(power), crc_a)
        length_b >>= 1
        power += 1
    return crc_a ^ crc_b
