"""Layout operations of ``ChunkedSegmentStorage``: concat, truncate, defrag.

A mixin of ``ChunkedSegmentStorage`` (slts/storage/chunked.py), kept in its own module:
these operations change a segment's chunk list without changing its bytes (concat
appends a sealed segment's list, truncate drops the head, defrag replaces runs) and
share the index rules of ``slts.metadata.index``. See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from slts.errors import (
    ConcatTooDeep,
    InvalidArgument,
    InvalidOffset,
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
from slts.metadata.store import Delete, Expect, Operation, Put
from slts.storage import defrag
from slts.storage.defrag import BuiltChunk, Run
from slts.storage.segment_names import check_segment_name, chunk_name
from slts.storage.types import DefragResult, SegmentHandle

_log = logging.getLogger("slts.storage")


class LayoutOperations:
    """concat, truncate and defrag; the state they use is ``ChunkedSegmentStorage``'s."""

    if TYPE_CHECKING:  # what the mixin uses of ChunkedSegmentStorage (mypy checks that it has it)
        from slts.bindings.base import ChunkStorage
        from slts.config import StorageConfig
        from slts.gc import GarbageCollector
        from slts.metadata.ownership import Ownership, ReadOnlyOwnership
        from slts.metadata.store import MetadataStore
        from slts.storage.types import SegmentInfo

        config: StorageConfig
        container_id: int
        chunk_storage: ChunkStorage
        epoch: int
        gc: GarbageCollector
        _store: MetadataStore
        _ownership: Ownership | ReadOnlyOwnership
        _tainted: set[str]
        _load: Callable[[str], tuple[SegmentRecord, int]]
        _chunk: Callable[[str], tuple[ChunkRecord, int]]
        _stripe: Callable[[str], threading.Lock]
        _stripes: Callable[..., contextlib.AbstractContextManager[None]]
        _now_ms: Callable[[], int]
        _check_offset: Callable[[object, str], None]
        info: Callable[[str], SegmentInfo]

        def _check_open(self, *, changes: bool = False) -> None: ...
        def _check_handle(self, handle: object, *, writable: bool) -> SegmentHandle: ...

    def concat(self, target: SegmentHandle, offset: int, source: str) -> None:
        """Append the sealed segment ``source`` to ``target`` at ``offset``; ``source`` is gone.

        Metadata only, one commit whose size does not depend on the number of chunks:
        the source's chunk list is spliced after the target's and one index link maps
        the new range to the source's index. Afterwards, if both chunks at the seam are
        small (``concat_merge_seam``), they are merged into one.

        Needs ``offset == target length``, a target that is not sealed, and a source that
        is sealed and not truncated (``start_offset == 0``). Raises ``InvalidOffset``,
        ``InvalidArgument`` (source is the target), ``SegmentNotFound``,
        ``SegmentSealed``, ``SegmentNotSealed``, ``SegmentTruncated``, ``ConcatTooDeep``
        (the source's index links are nested ``index.LINK_DEPTH_MAX`` deep already),
        ``Fenced``, ``MetadataError``: every error means nothing changed. Once the concat
        has committed, it has succeeded: the seam merge after it is best effort and
        never raises (a failure leaves two chunks, merged by the next defrag). An empty
        source simply disappears.
        """
        self._check_open()
        target = self._check_handle(target, writable=True)
        check_segment_name(source)
        self._check_offset(offset, target.name)
        if source == target.name:
            raise InvalidArgument(f"cannot concat segment {source!r} into itself", segment=source)
        with self._stripes(target.name, source):
            record, version = self._load(target.name)
            donor, donor_version = self._load(source)
            if record.sealed:
                raise SegmentSealed(f"concat target {target.name!r} is sealed", segment=target.name)
            if not donor.sealed:
                raise SegmentNotSealed(f"concat source {source!r} is not sealed", segment=source)
            if donor.start_offset > 0:
                raise SegmentTruncated(
                    f"concat source {source!r} is truncated (starts at {donor.start_offset})", segment=source
                )
            if offset != record.length:
                raise InvalidOffset(
                    f"concat into {target.name!r} at {offset}, but its length is {record.length}",
                    segment=target.name,
                    offset=offset,
                )
            ops: list[Operation] = [Delete(SEGMENTS, name_key(source))]
            expect = [Expect(SEGMENTS, name_key(source), donor_version)]
            seam: ChunkRecord | None = None
            if donor.chunk_count:
                assert donor.first_chunk_start_offset == 0 and donor.first_chunk is not None
                if record.last_chunk is not None:
                    seam, seam_version = self._chunk(record.last_chunk)
                    linked = seam.replace(next_chunk=donor.first_chunk)
                    ops.append(Put(CHUNKS, name_key(linked.name), linked.encode()))
                    expect.append(Expect(CHUNKS, name_key(linked.name), seam_version))
                ops.append(index.concat_link(record.segment_id, record.length, donor.segment_id, 0))
                depth = max(self._index_depth(record), self._index_depth(donor) + 1)
                if depth > index.LINK_DEPTH_MAX:
                    raise ConcatTooDeep(
                        f"concat of {source!r} into {target.name!r}: {source!r} holds concats nested "
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
                    "modified_ms": self._now_ms(),
                }
                if record.first_chunk is None:
                    changes["first_chunk"] = donor.first_chunk
                    changes["first_chunk_start_offset"] = record.length
                ops.append(Put(SEGMENTS, name_key(target.name), record.replace(**changes).encode()))
                expect.append(Expect(SEGMENTS, name_key(target.name), version))
            self._ownership.commit(ops, expect)
            if seam is not None and self.config.concat_merge_seam:
                try:
                    self._merge_seam(target.name, seam.name, record.last_chunk_start_offset)
                except SltsError:  # Fenced, MetadataError, ChunkStorageError...: the concat stands
                    _log.warning(
                        "concat into %r: merging the chunks at the seam failed", target.name, exc_info=True
                    )

    def _index_depth(self, record: SegmentRecord) -> int:
        """``record.index_depth``, or read from the index for an older record."""
        if record.index_depth is not None:
            return record.index_depth
        with self._store.snapshot() as view:
            return index.namespace_depth(view, record.segment_id)

    def _merge_seam(self, name: str, seam: str, start: int) -> None:
        """Merge the chunk ``seam`` (starting at ``start``) with its successor if both
        are small (lock held).

        Best effort: the concat has committed; a failure here leaves two chunks (the
        caller logs it: a committed concat never reports an error)."""
        record, version = self._load(name)
        left, left_version = self._chunk(seam)
        if left.next_chunk is None:
            return
        right, right_version = self._chunk(left.next_chunk)
        small = self.config.defrag_small_chunk_bytes
        if left.length >= small or right.length >= small:
            return
        if left.length + right.length > min(self.config.defrag_run_bytes_max, record.max_rolling_length):
            return
        before = self._predecessor(record, start)
        run = defrag.Run(
            name,
            record.segment_id,
            start,
            (
                defrag.ListedChunk(left, left_version, start),
                defrag.ListedChunk(right, right_version, start + left.length),
            ),
            before,
        )
        with contextlib.suppress(VersionConflict):  # the segment moved on: nothing to merge
            self._apply_run(run, record, version)

    def _predecessor(self, record: SegmentRecord, start: int) -> defrag.ListedChunk | None:
        """The chunk before the one starting at ``start`` (None at the head): O(log n)."""
        return defrag.predecessor(self._store, record, start)

    def truncate(self, handle: SegmentHandle, offset: int) -> None:
        """Make ``[0, offset)`` unreadable: the start offset moves up to ``offset``.

        Chunks wholly below the new start leave the list (to GC) in bounded batches of
        ``gc_batch_max`` chunks per commit; no data is ever rewritten. Works on sealed
        segments. ``offset`` at or below the current start is a no-op (except that it
        finishes dropping chunks an interrupted truncate left below the start). Once the
        first batch has committed the truncate has happened and returns normally: an error
        in a later batch leaves chunks below the start for the next truncate. Raises
        ``InvalidOffset`` (negative or past the length), ``SegmentNotFound``, ``Fenced``:
        every error means nothing changed.
        """
        self._check_open()
        handle = self._check_handle(handle, writable=True)
        self._check_offset(offset, handle.name)
        with self._stripe(handle.name):
            record, version = self._load(handle.name)
            if offset > record.length:
                raise InvalidOffset(
                    f"truncate {handle.name!r} at {offset}, past its length {record.length}",
                    segment=handle.name,
                    offset=offset,
                )
            new_start = max(record.start_offset, offset)
            for batch in range(record.chunk_count // self.config.gc_batch_max + 2):
                try:
                    ops, expect, record = self._truncate_batch(record, version, new_start)
                    if not ops:
                        if not batch:  # a no-op: still, only the owner may say it succeeded
                            self._ownership.check()
                        return
                    version = self._ownership.commit(ops, expect)
                except SltsError:
                    if not batch:
                        raise  # nothing changed
                    # The first batch moved the start: the truncate has happened. Chunks
                    # left below the start are dropped by the next truncate of the segment.
                    _log.warning(
                        "truncate of %r: dropping the chunks below its new start stopped after %d batches",
                        handle.name,
                        batch,
                        exc_info=True,
                    )
                    return
            raise AssertionError(f"truncate of {handle.name!r} did not converge")

    def _truncate_batch(
        self, record: SegmentRecord, version: int, new_start: int
    ) -> tuple[list[Operation], list[Expect], SegmentRecord]:
        """One bounded commit of a truncate: move the start, drop up to a batch of chunks."""
        dropped: list[tuple[ChunkRecord, int]] = []
        name, start = record.first_chunk, record.first_chunk_start_offset
        while name is not None and len(dropped) < self.config.gc_batch_max:
            chunk, chunk_version = self._chunk(name)
            if start + chunk.length > new_start:
                break
            dropped.append((chunk, chunk_version))
            start += chunk.length
            name = chunk.next_chunk
        if not dropped and new_start == record.start_offset:
            return [], [], record
        ops: list[Operation] = []
        expect = [Expect(SEGMENTS, name_key(record.name), version)]
        for chunk, chunk_version in dropped:
            ops.append(Delete(CHUNKS, name_key(chunk.name)))
            expect.append(Expect(CHUNKS, name_key(chunk.name), chunk_version))
            ops.append(self.gc.entry(chunk.name, GcReason.DROPPED))
            self._tainted.discard(chunk.name)
        if dropped:
            # Every key serving the dropped range goes (the chunks' own entries and the links
            # that led to them, at any depth); what stays readable keeps its keys (split).
            bound = index.clear_bound(len(dropped))
            with self._store.snapshot() as view:
                if name is not None:
                    ops.extend(index.split_ops(view, record.segment_id, start))
                    ops.extend(
                        index.clear_ops(
                            view, record.segment_id, record.first_chunk_start_offset, start, bound
                        )
                    )
                else:
                    ops.extend(
                        index.clear_ops(
                            view, record.segment_id, record.first_chunk_start_offset, record.length + 1, bound
                        )
                    )
        remaining = record.chunk_count - len(dropped)
        changes: dict[str, object] = {
            "start_offset": new_start,
            "chunk_count": remaining,
            "modified_ms": self._now_ms(),
        }
        if dropped:
            changes["first_chunk"] = name
            changes["first_chunk_start_offset"] = start if name is not None else new_start
            if name is None:
                changes["last_chunk"] = None
                changes["last_chunk_start_offset"] = new_start
        truncated = record.replace(**changes)
        ops.append(Put(SEGMENTS, name_key(record.name), truncated.encode()))
        return ops, expect, truncated

    def defrag(self, name: str) -> DefragResult:
        """Merge runs of consecutive small chunks of segment ``name`` (``slts.storage.defrag``).

        The segment's bytes never change; reads during a defrag return the right bytes
        (old chunks stay until GC). Each run is built outside the segment's lock and
        committed under it; a run whose chunks changed meanwhile is dropped and its new
        chunk collected. Raises ``SegmentNotFound``, ``Fenced``, ``ChunkStorageError``.
        """
        self._check_open(changes=True)
        check_segment_name(name)
        with self._stripe(name):
            record, _ = self._load(name)
            with self._store.snapshot() as view:
                listed = defrag.read_list(view, record)
        runs = list(defrag.plan_runs(record, listed, self.config))
        if not runs:  # nothing to do: still, only the owner may say it succeeded
            self._ownership.check()
        committed = native = copied = 0
        for run in runs:
            built = self._apply_run(run, None, None)
            if built is not None:
                committed += 1
                native += built.bytes_native
                copied += built.bytes_copied
        after = self.info(name).chunk_count
        return DefragResult(
            name, len(listed), after, len(runs), committed, len(runs) - committed, native, copied
        )

    def _apply_run(self, run: Run, record: SegmentRecord | None, version: int | None) -> BuiltChunk | None:
        """Build the run's new chunk and swap it in; None if the run was dropped.

        With ``record``/``version`` the caller holds the segment's lock (seam merge);
        otherwise the lock is taken for the commit only."""
        new_name = chunk_name(self.container_id, run.segment, self.epoch, run.start)
        intent = self.gc.entry(new_name, GcReason.INTENT)
        intent_version = self._ownership.commit([intent], [Expect(GC, intent.key, 0)])
        built = None
        try:
            built = self._swap_in_run(run, record, version, new_name, intent, intent_version)
        finally:
            if built is None:  # dropped or failed: a build that outlived gc_delay_s lost its intent
                self.gc.requeue_lost([intent], intent_version)
        return built

    def _swap_in_run(
        self,
        run: Run,
        record: SegmentRecord | None,
        version: int | None,
        new_name: str,
        intent: Put,
        intent_version: int,
    ) -> BuiltChunk | None:
        """Build the run's chunk under the registered ``intent``, then swap it in."""
        built = defrag.build_chunk(
            self.chunk_storage,
            run,
            new_name,
            checksums=self.config.checksums,
            block_bytes=self.config.checksum_block_bytes,
        )
        dropped = [self.gc.entry(chunk.record.name, GcReason.DROPPED) for chunk in run.chunks]
        lock = contextlib.nullcontext() if record is not None else self._stripe(run.segment)
        with lock:
            if record is None:
                try:
                    record, version = self._load(run.segment)
                except SegmentNotFound:
                    return None
            assert version is not None
            if not defrag.swap_in(
                self._store,
                self._ownership.commit,
                record,
                version,
                run,
                built,
                epoch=self.epoch,
                intent_key=intent.key,
                intent_version=intent_version,
                dropped_entries=dropped,
            ):
                return None
            for chunk in run.chunks:
                self._tainted.discard(chunk.record.name)
        return built
