"""Layout changes: concat, truncate, defrag.

These operations change a segment's chunk list without changing its bytes (concat
appends a sealed segment's list, truncate drops the head, defrag replaces runs) and
share the index rules of ``slts.metadata.index``. Each receives the instance's
``EngineContext`` (``slts.storage.context``) and arguments that
``ChunkedSegmentStorage`` has already checked (an open, writable instance; a valid
segment name and offset). See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import logging

from slts.errors import (
    ConcatTooDeep,
    InvalidArgument,
    InvalidOffset,
    MetadataCorrupted,
    SegmentNotFound,
    SegmentNotSealed,
    SegmentSealed,
    SegmentTruncated,
    SltsError,
    VersionConflict,
)
from slts.metadata import index
from slts.metadata.records import ChunkRecord, GcReason, SegmentRecord
from slts.metadata.schema import CHUNKS, GC, SEGMENTS, name_key
from slts.metadata.store import CommitOp, Delete, DeleteKeys, Expect, Operation, Put
from slts.storage import defrag as defrag_runs
from slts.storage.context import EngineContext
from slts.storage.segment_names import chunk_name
from slts.storage.types import DefragResult

_log = logging.getLogger("slts.storage")


def concat(ctx: EngineContext, target: str, offset: int, source: str) -> None:
    """``ChunkedSegmentStorage.concat`` (its docstring is the contract)."""
    if source == target:
        raise InvalidArgument(f"cannot concat segment {source!r} into itself", segment=source)
    with ctx.locks.exclusive(target, source):
        seam = ctx.retry_conflicts(lambda: _concat_once(ctx, target, offset, source))
        if seam is not None and ctx.config.concat_merge_seam:
            try:
                _merge_seam(ctx, target, *seam)
            except SltsError:  # Fenced, MetadataError, ChunkStorageError...: the concat stands
                _log.warning("concat into %r: merging the chunks at the seam failed", target, exc_info=True)


def _concat_once(ctx: EngineContext, target: str, offset: int, source: str) -> tuple[str, int] | None:
    """One attempt of ``concat`` (locks held; see ``EngineContext.retry_conflicts``):
    the seam (the target's last chunk before, and its start) if both had chunks."""
    record, version = ctx.load(target)
    donor, donor_version = ctx.load(source)
    if record.sealed:
        raise SegmentSealed(f"concat target {target!r} is sealed", segment=target)
    if not donor.sealed:
        raise SegmentNotSealed(f"concat source {source!r} is not sealed", segment=source)
    if donor.start_offset > 0:
        raise SegmentTruncated(
            f"concat source {source!r} is truncated (starts at {donor.start_offset})", segment=source
        )
    if offset != record.length:
        raise InvalidOffset(
            f"concat into {target!r} at {offset}, but its length is {record.length}",
            segment=target,
            offset=offset,
        )
    ops: list[Operation] = [Delete(SEGMENTS, name_key(source))]
    expect = [Expect(SEGMENTS, name_key(source), donor_version)]
    seam: ChunkRecord | None = None
    if donor.chunk_count:
        assert donor.first_chunk_start_offset == 0 and donor.first_chunk is not None
        if record.last_chunk is not None:
            seam, seam_version = ctx.chunk(record.last_chunk)
            linked = seam.replace(next_chunk=donor.first_chunk)
            ops.append(Put(CHUNKS, name_key(linked.name), linked.encode()))
            expect.append(Expect(CHUNKS, name_key(linked.name), seam_version))
        ops.append(index.concat_link(record.segment_id, record.length, donor.segment_id, 0))
        depth = max(_index_depth(ctx, record), _index_depth(ctx, donor) + 1)
        if depth > index.LINK_DEPTH_MAX:
            raise ConcatTooDeep(
                f"concat of {source!r} into {target!r}: {source!r} holds concats nested "
                f"{depth - 1} deep, one more passes the index's limit of {index.LINK_DEPTH_MAX}; "
                f"copy {source!r} into a new segment and concat that",
                segment=source,
            )
        changes: dict[str, object] = {
            "index_depth": depth,
            "length": record.length + donor.length,
            "last_chunk": donor.last_chunk,
            "last_chunk_start_offset": record.length + donor.last_chunk_start_offset,
            "chunk_count": record.chunk_count + donor.chunk_count,
            "modified_ms": ctx.now_ms(),
        }
        if record.first_chunk is None:
            changes["first_chunk"] = donor.first_chunk
            changes["first_chunk_start_offset"] = record.length
        ops.append(Put(SEGMENTS, name_key(target), record.replace(**changes).encode()))
        expect.append(Expect(SEGMENTS, name_key(target), version))
    ctx.ownership.commit(ops, expect)
    return None if seam is None else (seam.name, record.last_chunk_start_offset)


def _index_depth(ctx: EngineContext, record: SegmentRecord) -> int:
    """``record.index_depth``, or read from the index for an older record."""
    if record.index_depth is not None:
        return record.index_depth
    with ctx.store.snapshot() as view:
        return index.namespace_depth(view, record.segment_id)


def _merge_seam(ctx: EngineContext, name: str, seam: str, start: int) -> None:
    """Merge the chunk ``seam`` (starting at ``start``) with its successor if both
    are small (lock held).

    Best effort: the concat has committed; a failure here leaves two chunks (the
    caller logs it: a committed concat never reports an error)."""
    record, version = ctx.load(name)
    left, left_version = ctx.chunk(seam)
    if left.next_chunk is None:
        return
    right, right_version = ctx.chunk(left.next_chunk)
    small = ctx.config.defrag_small_chunk_bytes
    if left.length >= small or right.length >= small:
        return
    if left.length + right.length > min(ctx.config.defrag_run_bytes_max, record.max_rolling_length):
        return
    before = defrag_runs.predecessor(ctx.store, record, start)  # O(log n)
    run = defrag_runs.Run(
        name,
        record.segment_id,
        start,
        (
            defrag_runs.ListedChunk(left, left_version, start),
            defrag_runs.ListedChunk(right, right_version, start + left.length),
        ),
        before,
    )
    with contextlib.suppress(VersionConflict):  # the segment moved on: nothing to merge
        _apply_run(ctx, run, record, version)


def truncate(ctx: EngineContext, name: str, offset: int) -> None:
    """``ChunkedSegmentStorage.truncate`` (its docstring is the contract)."""
    with ctx.locks.exclusive(name):
        record, _ = ctx.load(name)
        if offset > record.length:
            raise InvalidOffset(
                f"truncate {name!r} at {offset}, past its length {record.length}",
                segment=name,
                offset=offset,
            )
        # Only this instance moves the start or the length (lock held); a defrag batch
        # beside it may change the list, so each batch reads the segment afresh.
        new_start = max(record.start_offset, offset)
        for batch in range(record.chunk_count // ctx.config.gc_batch_max + 2):
            try:
                if not ctx.retry_conflicts(lambda: _truncate_batch(ctx, name, new_start)):
                    if not batch:  # a no-op: still, only the owner may say it succeeded
                        ctx.ownership.check()
                    return
            except SltsError:
                if not batch:
                    raise  # nothing changed
                # The first batch moved the start: the truncate has happened. Chunks
                # left below the start are dropped by the next truncate of the segment.
                _log.warning(
                    "truncate of %r: dropping the chunks below its new start stopped after %d batches",
                    name,
                    batch,
                    exc_info=True,
                )
                return
        raise AssertionError(f"truncate of {name!r} did not converge")


def _truncate_batch(ctx: EngineContext, name: str, new_start: int) -> bool:
    """One bounded commit of a truncate (lock held; see ``EngineContext.retry_conflicts``):
    move the start, drop up to ``gc_batch_max`` chunks. False if there was nothing to do.

    The dropped run is read from the offset index (``index.head_walk``: names and starts,
    no chunk record decoded) and dropped as a range: the index keys that served it by one
    ``DeleteRange`` per namespace stretch, the chunk records by one ``DeleteKeys``, and one
    GC queue entry for the whole run. Everything is read in one snapshot and the commit expects the
    segment record as read: every change to a segment's chunk list (write, concat,
    defrag, truncate) commits its segment record, so that one expectation pins the list
    and the index the snapshot showed (the dropped chunks' records need none of their
    own: a chunk of the dropped run changed by anything else than a list change, such as
    a re-wrap of its data keys, is dropped all the same)."""
    key = name_key(name)
    limit = ctx.config.gc_batch_max
    with ctx.store.snapshot() as view:
        record, version = ctx.load(name, view)
        dropped: list[tuple[int, str]] = []
        kept: str | None = None
        start = record.first_chunk_start_offset
        ops: list[CommitOp] = []
        if record.first_chunk is not None and start <= new_start:
            walked, spans = index.head_walk(view, record.segment_id, start, new_start, limit + 1)
            dropped, kept, start = _head_run(record, walked, new_start, limit)
            if dropped:
                # Every key serving the dropped range goes (the chunks' own entries and the
                # links that led to them, at any depth); what stays readable keeps its keys
                # (split first, as index.split_ops requires).
                if kept is not None:
                    ops.extend(index.split_ops(view, record.segment_id, start))
                end = start if kept is not None else record.length + 1
                ops.extend(index.clear_range_ops(spans, record.first_chunk_start_offset, end))
        if not dropped and new_start == record.start_offset:
            return False
    names = [chunk for _, chunk in dropped]
    if names:
        ops.append(DeleteKeys(CHUNKS, tuple([name_key(chunk) for chunk in names])))
        ops.append(ctx.gc.run_entry(names, GcReason.DROPPED))
    changes: dict[str, object] = {
        "start_offset": new_start,
        "chunk_count": record.chunk_count - len(dropped),
        "modified_ms": ctx.now_ms(),
    }
    if dropped:
        changes["first_chunk"] = kept
        changes["first_chunk_start_offset"] = start if kept is not None else new_start
        if kept is None:
            changes["last_chunk"] = None
            changes["last_chunk_start_offset"] = new_start
    ops.append(Put(SEGMENTS, key, record.replace(**changes).encode()))
    ctx.ownership.commit(ops, [Expect(SEGMENTS, key, version)])
    ctx.tainted.difference_update(names)
    return True


def _head_run(
    record: SegmentRecord, walked: list[tuple[int, str]], new_start: int, limit: int
) -> tuple[list[tuple[int, str]], str | None, int]:
    """From ``walked`` (``index.head_walk``: the chunks starting in
    ``[first_chunk_start_offset, new_start]``, at most ``limit + 1``): the chunks at the
    head of the list that end at or below ``new_start``, at most ``limit``; then the first
    chunk that stays (None: no chunk is left) and the offset it starts at.

    A chunk ends where the next one starts, so every walked chunk but the last is
    dropped; the last is dropped too only if it is the segment's last chunk and
    ``new_start`` is the segment's length. What the index says is checked against the
    segment record (its first chunk, its chunk count): ``MetadataCorrupted`` if they
    disagree, and nothing is dropped."""
    if not walked or walked[0] != (record.first_chunk_start_offset, record.first_chunk):
        raise MetadataCorrupted(
            f"segment {record.name!r}: the offset index does not start its list at chunk "
            f"{record.first_chunk!r} (offset {record.first_chunk_start_offset})",
            segment=record.name,
        )
    kept: str | None
    dropped, kept, start = walked[:-1], walked[-1][1], walked[-1][0]
    if len(walked) > limit:
        dropped, kept, start = walked[:limit], walked[limit][1], walked[limit][0]
    elif kept == record.last_chunk and new_start == record.length:
        dropped, kept, start = walked, None, new_start
    if (len(dropped) == record.chunk_count) != (kept is None) or len(dropped) > record.chunk_count:
        raise MetadataCorrupted(
            f"segment {record.name!r}: its offset index lists {len(walked)} chunk(s) below "
            f"{new_start}, its record counts {record.chunk_count} in all",
            segment=record.name,
        )
    return dropped, kept, start


def defrag(ctx: EngineContext, name: str) -> DefragResult:
    """``ChunkedSegmentStorage.defrag`` (its docstring is the contract)."""
    with ctx.locks.exclusive(name):
        record, _ = ctx.load(name)
        with ctx.store.snapshot() as view:
            listed = defrag_runs.read_list(view, record)
    runs = list(defrag_runs.plan_runs(record, listed, ctx.config))
    if not runs:  # nothing to do: still, only the owner may say it succeeded
        ctx.ownership.check()
    committed = native = copied = 0
    for run in runs:
        built = _apply_run(ctx, run, None, None)
        if built is not None:
            committed += 1
            native += built.bytes_native
            copied += built.bytes_copied
    after = ctx.load(name)[0].chunk_count
    return DefragResult(name, len(listed), after, len(runs), committed, len(runs) - committed, native, copied)


def _apply_run(
    ctx: EngineContext, run: defrag_runs.Run, record: SegmentRecord | None, version: int | None
) -> defrag_runs.BuiltChunk | None:
    """Build the run's new chunk and swap it in; None if the run was dropped.

    With ``record``/``version`` the caller holds the segment's lock (seam merge);
    otherwise the lock is taken for the commit only."""
    opaque = run.segment_id if ctx.config.encryption else None
    new_name = chunk_name(ctx.container_id, run.segment, ctx.epoch, run.start, opaque)
    intent = ctx.gc.entry(new_name, GcReason.INTENT)
    intent_version = ctx.ownership.commit([intent], [Expect(GC, intent.key, 0)])
    built = None
    try:
        built = _swap_in_run(ctx, run, record, version, new_name, intent, intent_version)
    finally:
        if built is None:  # dropped or failed: a build that outlived gc_delay_s lost its intent
            ctx.gc.requeue_lost([intent], intent_version)
    return built


def _swap_in_run(
    ctx: EngineContext,
    run: defrag_runs.Run,
    record: SegmentRecord | None,
    version: int | None,
    new_name: str,
    intent: Put,
    intent_version: int,
) -> defrag_runs.BuiltChunk | None:
    """Build the run's chunk under the registered ``intent``, then swap it in."""
    built = defrag_runs.build_chunk(
        ctx.binding,
        run,
        new_name,
        checksums=ctx.config.checksums,
        block_bytes=ctx.config.checksum_block_bytes,
    )
    dropped = [ctx.gc.entry(chunk.record.name, GcReason.DROPPED) for chunk in run.chunks]
    lock = contextlib.nullcontext() if record is not None else ctx.locks.exclusive(run.segment)
    with lock:
        if record is None:
            try:
                record, version = ctx.load(run.segment)
            except SegmentNotFound:
                return None
        assert version is not None
        if not defrag_runs.swap_in(
            ctx.store,
            ctx.ownership.commit,
            record,
            version,
            run,
            built,
            epoch=ctx.epoch,
            intent_key=intent.key,
            intent_version=intent_version,
            dropped_entries=dropped,
        ):
            return None
        for chunk in run.chunks:
            ctx.tainted.discard(chunk.record.name)
    return built
