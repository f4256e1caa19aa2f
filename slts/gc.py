"""Garbage collection of chunks: a durable queue in the metadata store (DESIGN.md §7).

Two sources of garbage:

* **Queue entries** (table ``gc``, keyed by the time queued, then chunk name). A writer puts an
  ``intent`` entry *before* it creates a chunk and deletes the entry in the same commit
  that makes the chunk part of a segment; changes that drop chunks from a layout put
  ``dropped`` entries in the commit that drops them. So a chunk on the storage is
  always either referenced by a chunk record or named by a queue entry: leak-free by
  construction, whatever crashes when.
* **Tombstones** (table ``deleted``): a deleted segment's header, kept until the
  collector has walked its chunk list, in bounded batches.

The verdict comes from metadata, never from the queue's reason: an entry whose chunk
has a record is kept (the entry is dropped), anything else is deleted. Deleting is a
two-step protocol so that it can never race a writer's commit: the collector first
*claims* the entry (a commit expecting the entry unchanged and the chunk record
absent), and only then deletes the chunk; the writer's commit expects its intent entry
unchanged, so exactly one of the two wins. A crash after the claim leaves a claimed
entry that the next run finishes (deletes are idempotent).

An intent can be collected before its chunk exists: the collector claims an intent
once it is ``gc_delay_s`` old, whether or not its creator is still at work (a stalled
writer, a long defrag batch). A chunk created after the collector's delete is then
covered by nothing. Every creator whose commit failed therefore calls
``requeue_lost_intents``: a chunk whose intent is no longer as registered is queued
again, *after* its creation ended, so the old entry or the new one sees it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.config import StorageConfig
from slts.errors import ChunkNotFound, ChunkStorageError, Fenced, ReadOnlyInstance, SltsError, VersionConflict
from slts.limiter import TrafficClass, traffic_class
from slts.metadata import index
from slts.metadata.ownership import Ownership, ReadOnlyOwnership
from slts.metadata.records import ChunkRecord, GcEntry, GcReason, SegmentRecord
from slts.metadata.schema import CHUNKS, DELETED, GC, INDEX, gc_key, gc_queued_stop, name_key, segment_id_key
from slts.metadata.store import Delete, Expect, MetadataStore, Operation, Put

_log = logging.getLogger("slts.gc")


@dataclass(frozen=True, slots=True)
class GcStatistics:
    """What one ``run_once`` did."""

    chunks_deleted: int = 0
    entries_kept: int = 0
    tombstones_finished: int = 0
    errors: int = 0
    index_keys_deleted: int = 0  # of deleted segments' namespaces (after their chunks)

    @property
    def progressed(self) -> bool:
        """Did the pass change anything (so another pass may find more to do)?"""
        return bool(
            self.chunks_deleted or self.entries_kept or self.tombstones_finished or self.index_keys_deleted
        )


class GarbageCollector:
    """Deletes due garbage chunks of one container instance.

    ``run_once`` does one bounded pass; ``start`` runs passes in a background thread
    every ``interval_s`` until ``stop`` (or until the instance is fenced).
    ``statistics`` sums every pass so far.
    """

    def __init__(
        self,
        store: MetadataStore,
        binding: ChunkStorage,
        ownership: Ownership | ReadOnlyOwnership,
        config: StorageConfig,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._binding = binding
        self._ownership = ownership
        self._config = config
        self._clock = clock
        self._totals = GcStatistics()
        self._totals_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: Called with a store sequence before any chunk is deleted; returns once the
        #: tier-2 copy of the metadata includes that sequence (DESIGN.md §5 invariant 5:
        #: tier-2 alone must stay restorable). The owner sets it to its ``DurableCopy``'s.
        self.barrier: Callable[[int], None] = lambda sequence: None

    # -- background worker -----------------------------------------------------------------------

    def start(self, interval_s: float) -> None:
        """Run ``run_once`` every ``interval_s`` seconds in a daemon thread. Idempotent."""
        assert interval_s > 0, interval_s
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name="slts-gc", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the background thread (waits for a pass in progress). Idempotent."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self, interval_s: float) -> None:
        while not self._stopping.wait(interval_s):
            try:
                while not self._stopping.is_set() and self.run_once().progressed:
                    pass  # work was done: keep going
            except Fenced:
                _log.warning("garbage collector stops: the container was fenced")
                return
            except (SltsError, OSError):
                _log.exception("garbage collection pass failed; retrying in %s s", interval_s)

    def statistics(self) -> GcStatistics:
        """Totals of every pass since this collector was made."""
        with self._totals_lock:
            return self._totals

    # -- feeding the queue ----------------------------------------------------------------------

    def entry(self, chunk: str, reason: GcReason) -> Put:
        """The queue entry for ``chunk``, queued now, as an operation. It becomes due
        ``gc_delay_s`` (as configured when collecting) after that."""
        return queue_entry(chunk, reason, int(self._clock() * 1000))

    def lost(self, intents: Sequence[Put], version: int) -> list[str]:
        """``lost_intents`` for intents made by ``entry`` and committed at ``version``."""
        return lost_intents(self._store, _intent_pairs(intents), version)

    def requeue_lost(self, intents: Sequence[Put], version: int) -> list[str]:
        """``requeue_lost_intents`` for intents made by ``entry`` and committed at
        ``version``, through the owner's commit. Best effort: a failure to queue is
        logged (the orphan reconciler is the backstop), never raised, so the creator's
        own error stays the one its caller sees."""
        pairs = _intent_pairs(intents)
        try:
            return requeue_lost_intents(
                self._store, self._ownership.commit, pairs, version, int(self._clock() * 1000)
            )
        except SltsError:
            _log.warning("could not check %d GC intent(s) after a failed commit", len(pairs), exc_info=True)
            return []

    # -- collecting -------------------------------------------------------------------------------

    def run_once(self) -> GcStatistics:
        """Handle up to ``gc_batch_max`` due queue entries and one batch of tombstones.

        Raises ``ReadOnlyInstance`` on a read-only instance and ``Fenced`` once a newer
        epoch owns the container (before deleting anything).
        """
        with traffic_class(TrafficClass.GC):  # what GC asks of the chunk storage is GC traffic
            if self._ownership.read_only:
                raise ReadOnlyInstance(
                    "garbage collection needs the container's owner, not a read-only instance"
                )
            self._ownership.check()
            due_ms = int(self._clock() * 1000) - int(self._config.gc_delay_s * 1000)
            deleted = kept = errors = finished = keys = 0
            due = self._store.scan(GC, b"", gc_queued_stop(due_ms), limit=self._config.gc_batch_max)
            for key, stored in due:
                try:
                    outcome = self._collect_entry(key, stored.version, GcEntry.decode(stored.value))
                except ChunkStorageError:
                    errors += 1
                    continue
                deleted += outcome == "deleted"
                kept += outcome == "kept"
            for _, stored in self._store.scan(DELETED, limit=self._config.gc_batch_max):
                tombstone = SegmentRecord.decode(stored.value)
                if tombstone.modified_ms > due_ms:  # deleted less than gc_delay_s ago
                    continue
                try:
                    count, cleared, done = self._collect_tombstone_batch(tombstone, stored.version)
                except ChunkStorageError:
                    errors += 1
                    continue
                deleted += count
                keys += cleared
                finished += done
            result = GcStatistics(deleted, kept, finished, errors, keys)
            if deleted or finished or errors:
                _log.info(
                    "GC pass: %d chunk(s) deleted, %d segment(s) finished, %d error(s)",
                    deleted,
                    finished,
                    errors,
                    extra={"chunks_deleted": deleted, "tombstones_finished": finished, "gc_errors": errors},
                )
            with self._totals_lock:
                totals = self._totals
                self._totals = GcStatistics(
                    totals.chunks_deleted + deleted,
                    totals.entries_kept + kept,
                    totals.tombstones_finished + finished,
                    totals.errors + errors,
                    totals.index_keys_deleted + keys,
                )
            return result

    def _collect_entry(self, key: bytes, version: int, entry: GcEntry) -> str:
        if not entry.claimed:
            with self._store.snapshot() as view:
                record = view.get(CHUNKS, name_key(entry.chunk))
            try:
                if record is not None:
                    self._ownership.commit([Delete(GC, key)], [Expect(GC, key, version)])
                    return "kept"
                version = self._ownership.commit(
                    [Put(GC, key, entry.replace(claimed=True).encode())],
                    [Expect(GC, key, version), Expect(CHUNKS, name_key(entry.chunk), 0)],
                )
            except VersionConflict:
                return "raced"  # a writer committed or another collector moved first
        # The claim proves the chunk unreferenced at ``version``; tier-2's copy must know it too.
        self.barrier(version)
        with contextlib.suppress(ChunkNotFound):
            self._binding.delete(ChunkHandle(entry.chunk, readonly=False))
        with contextlib.suppress(VersionConflict):
            self._ownership.commit([Delete(GC, key)], [Expect(GC, key, version)])
        return "deleted"

    def _collect_tombstone_batch(self, tombstone: SegmentRecord, version: int) -> tuple[int, int, int]:
        """Delete up to ``gc_batch_max`` chunks from the head of a deleted segment's list
        (then its index namespaces); returns (chunks deleted, index keys deleted of its
        namespaces, 1 if the tombstone is finished else 0)."""
        batch: list[tuple[ChunkRecord, int]] = []
        name, offset = tombstone.first_chunk, tombstone.first_chunk_start_offset
        with self._store.snapshot() as view:
            while name is not None and len(batch) < self._config.gc_batch_max:
                stored = view.get(CHUNKS, name_key(name))
                assert stored is not None, f"tombstone of {tombstone.name!r} names missing chunk {name!r}"
                record = ChunkRecord.decode(stored.value)
                batch.append((record, offset))
                offset += record.length
                name = record.next_chunk
        self._ownership.check()  # only chunks of a deleted segment, yet a fenced owner deletes nothing
        self.barrier(version)  # the deletion of the segment is in tier-2's copy before its chunks go
        for record, _ in batch:
            with contextlib.suppress(ChunkNotFound):
                self._binding.delete(ChunkHandle(record.name, readonly=False))
        ops: list[Put | Delete] = []
        for record, _ in batch:
            ops.append(Delete(CHUNKS, name_key(record.name)))
            ops.append(index.chunk_entry_delete(record))
        key = segment_id_key(tombstone.segment_id)
        remaining = tombstone.chunk_count - len(batch)
        finished, keys = False, list[bytes]()
        if name is None:
            assert remaining == 0, (tombstone, len(batch))
            # The chunks are gone; what is left of the index are links. Clear them, and the
            # namespaces they lead to (spliced in by concat), in bounded batches, deepest first.
            with self._store.snapshot() as view:
                keys, finished = index.namespace_tree_keys(
                    view, tombstone.segment_id, self._config.gc_batch_max
                )
            ops.extend(Delete(INDEX, key_) for key_ in keys)
            if finished:
                ops.append(Delete(DELETED, key))
            else:
                rest = tombstone.replace(
                    first_chunk=None, last_chunk=None, chunk_count=0, start_offset=tombstone.length
                )
                ops.append(Put(DELETED, key, rest.encode()))
        else:
            rest = tombstone.replace(
                first_chunk=name,
                first_chunk_start_offset=offset,
                start_offset=max(tombstone.start_offset, offset),
                chunk_count=remaining,
            )
            ops.append(Put(DELETED, key, rest.encode()))
        self._ownership.commit(ops, [Expect(DELETED, key, version)])
        return len(batch), len(keys), int(finished)


def queue_entry(chunk: str, reason: GcReason, queued_ms: int) -> Put:
    """The queue entry for ``chunk`` as an operation, keyed by ``queued_ms``: it becomes
    due ``gc_delay_s`` after that (a lease queues an intent in the future)."""
    return Put(GC, gc_key(queued_ms, chunk), GcEntry(chunk, reason, queued_ms, False).encode())


def lost_intents(store: MetadataStore, intents: Sequence[tuple[bytes, str]], version: int) -> list[str]:
    """The chunks among ``intents`` (queue key, chunk name; registered at ``version``)
    whose intent is gone or claimed: GC no longer holds them for their creator."""
    with store.snapshot() as view:
        return [
            chunk
            for key, chunk in intents
            if (stored := view.get(GC, key)) is None or stored.version != version
        ]


def requeue_lost_intents(
    store: MetadataStore,
    commit: Callable[[Sequence[Operation], Sequence[Expect]], int],
    intents: Sequence[tuple[bytes, str]],
    version: int,
    now_ms: int,
) -> list[str]:
    """Queue again, as ``dropped``, every chunk whose intent is no longer as registered.

    ``intents``: (queue key, chunk name) of the intents a creator registered at
    ``version``; ``commit``: the creator's fenced commit. Call it after the creator's
    commit failed and after every create it started has ended. An intent that is gone
    or claimed no longer covers its chunk (see module doc); an intent still at
    ``version`` does, and is left alone. Returns the chunks queued again. Raises what
    ``commit`` raises (``Fenced``: then the orphan reconciler is the backstop).
    """
    lost = lost_intents(store, intents, version)
    if lost:
        commit([queue_entry(chunk, GcReason.DROPPED, now_ms) for chunk in lost], [])
        _log.warning(
            "queued %d chunk(s) again whose GC intent was collected before they were committed: %s",
            len(lost),
            ", ".join(lost[:5]),
        )
    return lost


def _intent_pairs(intents: Sequence[Put]) -> list[tuple[bytes, str]]:
    """(queue key, chunk name) of queue entries made by ``GarbageCollector.entry``."""
    return [(op.key, GcEntry.decode(op.value).chunk) for op in intents]
