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

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import crc32c

from slts.bindings.base import ChunkStorage, ConcatSource
from slts.config import CHECKSUM_BLOCK_BYTES_DEFAULT, StorageConfig
from slts.errors import ChunkCorrupted, ChunkNotFound, MetadataCorrupted, VersionConflict
from slts.limiter import TrafficClass, traffic_class
from slts.metadata import index
from slts.metadata.records import ChunkRecord, SegmentRecord
from slts.metadata.schema import CHUNKS, GC, SEGMENTS, name_key
from slts.metadata.store import Delete, Expect, MetadataStore, Operation, Put, ReadView
from slts.storage import block_checksums
from slts.transforms.frames import FrameMap

BLOCK_BYTES_DEFAULT = CHECKSUM_BLOCK_BYTES_DEFAULT


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
    blocks: bytes | None = None  # block checksums (``slts.storage.block_checksums``)
    #: A chunk of frames (its sources were transformed): the joined frame map, the bytes
    #: stored, the data keys of every source in order (docs/security.md).
    frames: bytes | None = None
    stored_length: int | None = None
    data_keys: tuple[tuple[str, bytes, str], ...] | None = None


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
        fits = (
            chunk is not None
            and small
            and run_bytes + chunk.record.length <= bytes_max
            and len(run) < config.defrag_run_chunks_max
            # a chunk is frames or plain bytes throughout: a run does not mix them
            and (not run or run[0].record.transformed == chunk.record.transformed)
        )
        if fits:
            assert chunk is not None
            run.append(chunk)
            run_bytes += chunk.record.length
            continue
        if len(run) >= 2:
            first = position - len(run)
            yield Run(
                record.name, record.segment_id, run[0].start, tuple(run), listed[first - 1] if first else None
            )
        run, run_bytes = ([chunk], chunk.record.length) if small and chunk is not None else ([], 0)


@dataclass(frozen=True, slots=True)
class Source:
    """One chunk of a run as a builder needs it: plain values, so batch tasks pickle."""

    name: str
    length: int
    checksum: int | None
    blocks: bytes | None = None
    #: A transformed chunk: its frame map, stored bytes and wrapped data keys.
    frames: bytes | None = None
    stored_length: int | None = None
    data_keys: tuple[tuple[str, bytes, str], ...] | None = None

    @property
    def stored(self) -> int:
        """The bytes the chunk storage holds of it (what a build moves)."""
        return self.stored_length if self.stored_length is not None else self.length


def run_sources(run: Run) -> tuple[Source, ...]:
    """The run's chunks as ``Source`` values, in order."""
    return tuple(
        Source(
            c.record.name,
            c.record.length,
            c.record.checksum,
            c.record.blocks,
            c.record.frames,
            c.record.stored_length,
            tuple(tuple(key) for key in c.record.data_keys) if c.record.data_keys else None,  # type: ignore[misc]
        )
        for c in run.chunks
    )


def build_chunk(
    binding: ChunkStorage, run: Run, new_name: str, *, checksums: bool, block_bytes: int = BLOCK_BYTES_DEFAULT
) -> BuiltChunk:
    """Create chunk ``new_name`` holding the run's bytes (recorded lengths only)."""
    return build_from_sources(
        binding, run_sources(run), new_name, checksums=checksums, block_bytes=block_bytes
    )


def build_from_sources(
    binding: ChunkStorage,
    sources: Sequence[Source],
    new_name: str,
    *,
    checksums: bool,
    reuse: bool = False,
    block_bytes: int = BLOCK_BYTES_DEFAULT,
) -> BuiltChunk:
    """Create chunk ``new_name`` holding the sources' recorded bytes, in order.

    Natively (``ChunkStorage.concat``) where the binding can, else read and create.
    With ``checksums``, its block checksums are the sources' lists one after the other
    (no byte read back), or cut from the bytes copied when a source has none.
    ``reuse``: if ``new_name`` already exists with exactly the run's length (an earlier
    attempt of the same task made it; creates are atomic), take it as built.
    Raises ``ChunkCorrupted`` if a source is shorter than recorded.
    """
    with traffic_class(TrafficClass.DEFRAG):  # every defrag path builds its chunks here
        return _build(binding, sources, new_name, checksums=checksums, reuse=reuse, block_bytes=block_bytes)


def _build(
    binding: ChunkStorage,
    sources: Sequence[Source],
    new_name: str,
    *,
    checksums: bool,
    reuse: bool,
    block_bytes: int,
) -> BuiltChunk:
    if sources and sources[0].frames is not None:
        return _build_frames(binding, sources, new_name, reuse=reuse)
    length = sum(source.length for source in sources)
    if reuse:
        with contextlib.suppress(ChunkNotFound):
            if binding.get_info(new_name).length == length:
                if not checksums:
                    return BuiltChunk(new_name, length, None, 0, 0)
                data = _read_whole(binding, new_name, length)
                return BuiltChunk(
                    new_name, length, crc32c.crc32c(data), 0, 0, _blocks(sources, data, block_bytes)
                )
    ranges = [ConcatSource(source.name, 0, source.length) for source in sources]
    if binding.supports_concat:
        copied = binding.concat_bytes_through_client(ranges)
        info = binding.concat(new_name, ranges)
        assert info.length == length, (info, length)
        checksum = _combined_checksum(sources) if checksums else None
        blocks = block_checksums.joined([source.blocks for source in sources]) if checksums else None
        return BuiltChunk(new_name, length, checksum, length - copied, copied, blocks)
    data = b"".join(binding.read(binding.open_read(r.name), r.offset, r.length) for r in ranges)
    if len(data) != length:
        raise ChunkCorrupted(f"a source chunk of {new_name!r} is shorter than recorded")
    binding.create(new_name, data)
    if not checksums:
        return BuiltChunk(new_name, length, None, 0, length)
    return BuiltChunk(new_name, length, crc32c.crc32c(data), 0, length, _blocks(sources, data, block_bytes))


def _build_frames(
    binding: ChunkStorage, sources: Sequence[Source], new_name: str, *, reuse: bool
) -> BuiltChunk:
    """``_build`` for chunks of frames: their stored bytes moved as they are (natively where
    the binding can), never decoded; the frame maps joined, each source's key indexes moved
    past the keys before it; the checksum of the stored bytes combined from the parts'."""
    assert all(source.frames is not None for source in sources), "a run does not mix frames and bytes"
    frames = FrameMap()
    keys: list[tuple[str, bytes, str]] = []
    for source in sources:
        frames = frames.then(FrameMap.unpack(source.frames or b""), key_offset=len(keys))
        keys.extend(source.data_keys or ())
    length = sum(source.length for source in sources)
    stored = sum(source.stored for source in sources)
    assert frames.logical_length == length and frames.stored_length == stored, (new_name, length, stored)
    checksum = _combined_checksum(sources)
    built = functools.partial(
        BuiltChunk, frames=frames.pack(), stored_length=stored, data_keys=tuple(keys) if keys else None
    )
    if reuse:
        with contextlib.suppress(ChunkNotFound):
            if binding.get_info(new_name).length == stored:
                return built(new_name, length, checksum, 0, 0)
    ranges = [ConcatSource(source.name, 0, source.stored) for source in sources]
    if binding.supports_concat:
        copied = binding.concat_bytes_through_client(ranges)
        info = binding.concat(new_name, ranges)
        assert info.length == stored, (info, stored)
        return built(new_name, length, checksum, stored - copied, copied)
    data = b"".join(binding.read(binding.open_read(r.name), r.offset, r.length) for r in ranges)
    if len(data) != stored:
        raise ChunkCorrupted(f"a source chunk of {new_name!r} is shorter than recorded")
    if checksum is not None and crc32c.crc32c(data) != checksum:
        raise ChunkCorrupted(f"the source chunks of {new_name!r} fail their CRC32C checksums")
    binding.create(new_name, data)
    return built(new_name, length, checksum, 0, stored)


def _blocks(sources: Sequence[Source], data: bytes, block_bytes: int) -> bytes:
    """The sources' block lists joined, or blocks cut from ``data`` if one has none."""
    joined = block_checksums.joined([source.blocks for source in sources])
    return joined if joined is not None else block_checksums.compute(data, block_bytes)


def _read_whole(binding: ChunkStorage, name: str, length: int) -> bytes:
    data = binding.read(binding.open_read(name), 0, length)
    if len(data) != length:
        raise ChunkCorrupted(f"chunk {name!r} is shorter than {length} bytes")
    return data


def _combined_checksum(sources: Sequence[Source]) -> int | None:
    """The CRC32C of the concatenation of the sources' stored bytes, from the parts' CRCs
    (None if one is unknown)."""
    value: int | None = None
    for source in sources:
        if source.checksum is None:
            return None
        value = source.checksum if value is None else crc32c_combine(value, source.checksum, source.stored)
    return value


def predecessor(store: MetadataStore, record: SegmentRecord, start: int) -> ListedChunk | None:
    """The chunk before the one starting at ``start`` (None at the head), found through
    the index: O(log n)."""
    if start <= record.first_chunk_start_offset:
        return None
    with store.snapshot() as view:
        name, previous_start = index.resolve(view, record.segment_id, start - 1)
        stored = view.get(CHUNKS, name_key(name))
    if stored is None:
        raise MetadataCorrupted(f"chunk record {name!r} is referenced but missing", chunk=name)
    return ListedChunk(ChunkRecord.decode(stored.value), stored.version, previous_start)


def swap_in(
    store: MetadataStore,
    commit: Callable[[Sequence[Operation], Sequence[Expect]], int],
    record: SegmentRecord,
    version: int,
    run: Run,
    built: BuiltChunk,
    *,
    epoch: int,
    intent_key: bytes,
    intent_version: int,
    dropped_entries: list[Put],
) -> bool:
    """Swap ``run`` for ``built`` in ``record`` (read fresh, at ``version``) with one
    ``commit``; False if the run is no longer there as planned or a version moved: the
    run is dropped, and its new chunk stays in the GC queue as an intent. The commit
    logic every defrag driver shares."""
    run = dataclasses.replace(run, predecessor=predecessor(store, record, run.start))
    with store.snapshot() as view:
        planned = commit_ops(
            view, record, version, run, built, epoch, intent_key, intent_version, dropped_entries
        )
    if planned is None:
        return False
    try:
        commit(*planned)
    except VersionConflict:
        return False
    return True


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
        name=built.name,
        index_id=record.segment_id,
        index_offset=run.start,
        length=built.length,
        next_chunk=last.record.next_chunk,
        epoch=epoch,
        checksum=built.checksum,
        blocks=built.blocks,
        frames=built.frames,
        stored_length=built.stored_length,
        data_keys=built.data_keys,
    )
    ops: list[Operation] = [Put(CHUNKS, name_key(new.name), new.encode()), Delete(GC, intent_key)]
    expect = [Expect(SEGMENTS, name_key(record.name), version), Expect(GC, intent_key, intent_version)]
    for chunk in run.chunks:
        ops.append(Delete(CHUNKS, name_key(chunk.record.name)))
        expect.append(Expect(CHUNKS, name_key(chunk.record.name), chunk.version))
    if run.predecessor is not None:
        previous = run.predecessor.record.replace(next_chunk=new.name)
        ops.append(Put(CHUNKS, name_key(previous.name), previous.encode()))
        expect.append(Expect(CHUNKS, name_key(previous.name), run.predecessor.version))
    if last.record.next_chunk is not None:
        ops.extend(index.split_ops(view, record.segment_id, run.end))
    # Every key serving the run's range goes, the run chunks' own entries (in whichever
    # namespace they were written) and the links that led there, at any depth.
    ops.extend(
        index.clear_ops(view, record.segment_id, run.start, run.end, index.clear_bound(len(run.chunks)))
    )
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
