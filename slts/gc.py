"""Garbage collection of chunks: a durable queue in the metadata store (DESIGN.md §7).

Two sources of garbage:

* **Queue entries** (table ``gc``, keyed by the time queued, then chunk name). A writer puts an
  ``intent`` entry *before* it creates a chunk and deletes the entry in the same commit
  that makes the chunk part of a segment; changes that drop chunks from a layout put
  ``dropped`` entries in the commit that drops them (a truncate batch puts one entry
  for its whole run, ``GcEntry.more``: one record however many chunks it drops). So a
  chunk on the storage is always either referenced by a chunk record or named by a
  queue entry: leak-free by construction, whatever crashes when.
* **Tombstones** (table ``deleted``): a deleted segment's header, kept until the
  collector has walked its chunk list, in bounded batches.

The verdict comes from metadata, never from the queue's reason: a queued chunk that
has a record is kept (it leaves its entry), anything else is deleted. Deleting is a
two-step protocol so that it can never race a writer's commit: the collector first
*claims* the entry (a commit expecting the entry unchanged and the chunk record
absent), and only then deletes the chunk; the writer's commit expects its intent entry
unchanged, so exactly one of the two wins. A crash after the claim leaves a claimed
entry that the next run finishes (deletes are idempotent).

The collector works in batches of due entries holding up to ``gc_batch_max`` chunks
(at least one entry, whatever its run's length): one commit claims them all (each
claim keeps its own expectations; if the commit conflicts, it is split in halves down
to the single entries that conflict, which are left for a later pass: an entry of a run
waits as a whole, see ``_collect_due``), one
``barrier`` makes the claims durable on tier-2, the chunks are deleted in parallel (at
most ``delete_threads`` at once), and one commit removes the entries. A tombstone
batch is one barrier, parallel deletes and one commit. So a batch costs two commits and
at most one flush of the metadata log, whatever its size.

An intent can be collected before its chunk exists: the collector claims an intent
once it is ``gc_delay_s`` old, whether or not its creator is still at work (a stalled
writer, a long defrag batch). A chunk created after the collector's delete is then
covered by nothing. Every creator whose commit failed therefore calls
``requeue_lost_intents``: a chunk whose intent is no longer as registered is queued
again, *after* its creation ended, so the old entry or the new one sees it.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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

    chunks_deleted: int = 0  # removed from the chunk storage by this pass (found gone: not counted)
    entries_kept: int = 0  # queued chunks found with a record: kept, and out of the queue (counts chunks)
    tombstones_finished: int = 0
    errors: int = 0  # chunks not deleted (the chunk storage or the barrier failed): a later pass retries
    index_keys_deleted: int = 0  # of deleted segments' namespaces (after their chunks)
    chunks_gone: int = 0  # collected, but already gone (never created, or deleted by a pass that crashed)

    @property
    def progressed(self) -> bool:
        """Did the pass change anything (so another pass may find more to do)?"""
        return bool(
            self.chunks_deleted
            or self.entries_kept
            or self.tombstones_finished
            or self.index_keys_deleted
            or self.chunks_gone
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
        #: Most chunk deletes a batch has in flight at once (``gc_delete_threads``, >= 1;
        #: threads of a pool that lives for the batch: enough to hide an object store's
        #: latency, few enough for a small machine). 1 deletes them one after another in the
        #: calling thread: what a deterministic simulation needs.
        self.delete_threads = config.gc_delete_threads

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

    def run_entry(self, chunks: Sequence[str], reason: GcReason) -> Put:
        """One queue entry for all of ``chunks`` (at least one; a run a commit drops, at
        most ``gc_batch_max``), queued now: one record however long the run."""
        assert chunks, "a run entry needs a chunk"
        return queue_entry(chunks[0], reason, int(self._clock() * 1000), tuple(chunks[1:]))

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

        A batch of queue entries costs two commits (claim, removal), one barrier and
        the chunk deletes, up to ``delete_threads`` at once (see ``_collect_due``).
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
            deleted, kept, errors, gone = self._collect_due(due_ms)
            finished = keys = 0
            for _, stored in self._store.scan(DELETED, limit=self._config.gc_batch_max):
                tombstone = SegmentRecord.decode(stored.value)
                if tombstone.modified_ms > due_ms:  # deleted less than gc_delay_s ago
                    continue
                count, cleared, done, failed, missing = self._collect_tombstone_batch(
                    tombstone, stored.version
                )
                deleted += count
                gone += missing
                errors += failed
                keys += cleared
                finished += done
            result = GcStatistics(deleted, kept, finished, errors, keys, gone)
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
                    totals.chunks_gone + gone,
                )
            return result

    def _collect_due(self, due_ms: int) -> tuple[int, int, int, int]:
        """One batch of the due queue entries: (chunks deleted, chunks kept, errors,
        chunks found gone).

        1. One snapshot reads due entries, up to ``gc_batch_max`` chunks (an entry of a run
           counts its chunks; the first entry is taken whatever its length: a truncate
           made it at most ``gc_batch_max`` long, as configured then), and, for each
           chunk of an unclaimed entry, whether it has a record.
        2. One commit (``_commit_split``) drops the entries whose chunks all have a record
           (kept) and claims the others, each expecting its entry unchanged and its
           claimed chunks' records absent (an entry of a run whose chunks are partly
           recorded is rewritten to the others). An entry whose expectation fails (a
           writer committed, another collector moved first) is left out; the others
           still commit.
        3. One ``barrier`` for the newest claim; then the claimed chunks (newly claimed,
           and claimed by an earlier pass that did not finish) are deleted in parallel.
        4. One commit removes the entries whose chunks are all deleted, and narrows an
           entry of a run some of whose deletes failed to those chunks (still claimed):
           a later pass deletes only them (deletes are idempotent; a chunk found gone
           counts as gone). If that commit fails or does not happen, the claims stay
           as they were and a later pass deletes their chunks again.

        An entry of a run is claimed or left out as a whole: if anything it expects
        changed under the batch (a record appeared for one of its chunks, the entry was
        rewritten), none of its chunks is claimed by this pass. The next pass reads the
        entry again and decides afresh (a chunk with a record leaves the entry, the
        others are claimed), so a run waits at most for the next pass after its
        writers stop racing it, and never loses a chunk.

        A crash anywhere leaves claimed entries, or none: the next pass finishes them.
        """
        batch_max = self._config.gc_batch_max
        with self._store.snapshot() as view:
            due: list[_Due] = []
            chunks = 0
            for key, stored in view.scan(GC, b"", gc_queued_stop(due_ms), limit=batch_max):
                entry = GcEntry.decode(stored.value)
                if due and chunks + len(entry.chunks) > batch_max:
                    break  # the next batch takes it
                due.append(_Due(key, stored.version, entry))
                chunks += len(entry.chunks)
            recorded = {
                name
                for item in due
                if not item.entry.claimed
                for name in item.entry.chunks
                if view.get(CHUNKS, name_key(name))
            }
        # Claimed by a pass that did not finish: deleted with this batch's.
        claimed = [_Claim(item.key, item.version, item.entry) for item in due if item.entry.claimed]
        decisions = [_decide(item, recorded) for item in due if not item.entry.claimed]
        kept = 0
        for change, sequence in self._commit_split(decisions):
            kept += change.kept
            if change.claim is not None:
                claimed.append(_Claim(change.key, sequence, change.claim))
        if not claimed:
            return 0, kept, 0, 0
        # The claims prove the chunks unreferenced; tier-2's copy of the metadata must know it too.
        try:
            self.barrier(max(claim.version for claim in claimed))
        except ChunkStorageError:
            _log.warning("GC: the metadata copy on tier-2 is behind; deleting later", exc_info=True)
            return 0, kept, sum(len(claim.chunks) for claim in claimed), 0
        failed, missing = self._delete_chunks([name for claim in claimed for name in claim.chunks])
        self._commit_split(
            [_finish(claim, failed) for claim in claimed if not failed.issuperset(claim.chunks)]
        )
        # An entry another collector removed or narrowed first is left out: its chunks
        # are gone either way, or claimed still.
        total = sum(len(claim.chunks) for claim in claimed)
        return total - len(failed) - missing, kept, len(failed), missing

    def _commit_split(self, changes: Sequence[_Change]) -> list[tuple[_Change, int]]:
        """Commit every change in one commit; if it conflicts, each half on its own,
        down to single changes. A single change whose expectations fail is left out.

        Returns the changes committed, each with its commit's sequence. At most
        ``2 * k * log2(len(changes)) + 1`` commits for ``k`` conflicting changes; one
        when none conflicts. Raises what ``Ownership.commit`` raises but
        ``VersionConflict`` (``Fenced``: nothing more is committed).
        """
        if not changes:
            return []
        ops = [op for change in changes for op in change.ops]
        expect = [expectation for change in changes for expectation in change.expect]
        try:
            sequence = self._ownership.commit(ops, expect)
        except VersionConflict:
            if len(changes) == 1:
                return []
            middle = len(changes) // 2
            return self._commit_split(changes[:middle]) + self._commit_split(changes[middle:])
        return [(change, sequence) for change in changes]

    def _delete_chunks(self, names: Sequence[str]) -> tuple[set[str], int]:
        """Delete the chunks ``names`` from the chunk storage, up to ``delete_threads``
        at once, each in the caller's traffic class (and context). A chunk already gone
        is done (deletes are idempotent) but not counted: an intent whose chunk was never
        created (a write that failed first, an intent registered ahead and never used),
        or a delete a crash interrupted after it took effect. Returns the names whose
        delete failed with a ``ChunkStorageError``, and how many chunks were already
        gone; any other error is raised once every delete has ended."""
        pending: queue.SimpleQueue[str] = queue.SimpleQueue()
        for name in names:
            pending.put(name)
        gone: list[str] = []  # list.append is atomic: the drains share it

        def drain() -> dict[str, ChunkStorageError]:
            failed: dict[str, ChunkStorageError] = {}
            while True:
                try:
                    name = pending.get_nowait()
                except queue.Empty:
                    return failed
                try:
                    self._binding.delete(ChunkHandle(name, readonly=False))
                except ChunkNotFound:
                    gone.append(name)
                except ChunkStorageError as exc:
                    failed[name] = exc

        assert self.delete_threads >= 1, self.delete_threads
        workers = min(self.delete_threads, len(names))
        failed: dict[str, ChunkStorageError] = {}
        if workers <= 1:
            failed = drain()
        else:
            with ThreadPoolExecutor(workers, thread_name_prefix="slts-gc-delete") as pool:
                drains = [pool.submit(contextvars.copy_context().run, drain) for _ in range(workers)]
            for future in drains:
                failed.update(future.result())
        if failed:
            name, error = next(iter(failed.items()))
            _log.warning("GC could not delete %d chunk(s), retrying later; %r: %s", len(failed), name, error)
        return set(failed), len(gone)

    def _collect_tombstone_batch(
        self, tombstone: SegmentRecord, version: int
    ) -> tuple[int, int, int, int, int]:
        """Delete up to ``gc_batch_max`` chunks from the head of a deleted segment's list
        (in parallel, see ``_delete_chunks``), then its index namespaces, in one commit.

        Returns (chunks deleted, index keys deleted of its namespaces, 1 if the tombstone
        is finished else 0, chunks that could not be deleted, chunks found gone). If a delete or the barrier
        failed, nothing is committed and a later pass does the batch again (deletes are
        idempotent)."""
        batch: list[ChunkRecord] = []
        name, offset = tombstone.first_chunk, tombstone.first_chunk_start_offset
        with self._store.snapshot() as view:
            while name is not None and len(batch) < self._config.gc_batch_max:
                stored = view.get(CHUNKS, name_key(name))
                assert stored is not None, f"tombstone of {tombstone.name!r} names missing chunk {name!r}"
                record = ChunkRecord.decode(stored.value)
                batch.append(record)
                offset += record.length
                name = record.next_chunk
        self._ownership.check()  # only chunks of a deleted segment, yet a fenced owner deletes nothing
        try:
            self.barrier(version)  # the deletion of the segment is in tier-2's copy before its chunks go
        except ChunkStorageError:
            _log.warning("GC: the metadata copy on tier-2 is behind; deleting later", exc_info=True)
            return 0, 0, 0, len(batch), 0
        failed, missing = self._delete_chunks([record.name for record in batch])
        if failed:  # the others are gone (counted); the batch is done again by a later pass
            return len(batch) - len(failed) - missing, 0, 0, len(failed), missing
        ops: list[Put | Delete] = []
        for record in batch:
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
        return len(batch) - missing, len(keys), int(finished), 0, missing


@dataclass(frozen=True, slots=True)
class _Due:
    """A due queue entry as read: its key, its version, its value."""

    key: bytes
    version: int
    entry: GcEntry


@dataclass(frozen=True, slots=True)
class _Claim:
    """A claimed queue entry: its key, the version its claim gave it, the entry."""

    key: bytes
    version: int
    entry: GcEntry

    @property
    def chunks(self) -> tuple[str, ...]:
        return self.entry.chunks


@dataclass(frozen=True, slots=True)
class _Change:
    """One queue entry's part of a batch commit: its operations and what they expect;
    the claimed entry it writes (None: the entry goes, or is not claimed by it) and how
    many of its chunks are kept."""

    key: bytes
    claim: GcEntry | None
    kept: int
    ops: tuple[Operation, ...]
    expect: tuple[Expect, ...]


def _decide(item: _Due, recorded: set[str]) -> _Change:
    """The verdict on an unclaimed entry, chunk by chunk: a chunk with a record is kept
    (it leaves the entry), the others are claimed, expecting the entry unchanged and
    their records still absent. Every chunk kept: the entry is dropped."""
    current = Expect(GC, item.key, item.version)
    names = item.entry.chunks
    free = tuple(name for name in names if name not in recorded)
    kept = len(names) - len(free)
    if not free:
        return _Change(item.key, None, kept, (Delete(GC, item.key),), (current,))
    entry = item.entry.replace(claimed=True, chunk=free[0], more=free[1:])
    absent = tuple(Expect(CHUNKS, name_key(name), 0) for name in free)
    return _Change(item.key, entry, kept, (Put(GC, item.key, entry.encode()),), (current, *absent))


def _finish(claim: _Claim, failed: set[str]) -> _Change:
    """After the deletes of ``claim``'s chunks (``failed``: those that failed, not all
    of its chunks): remove the entry, or narrow it to its failed chunks, still claimed
    (an entry of a run). Either expects the entry as claimed."""
    current = (Expect(GC, claim.key, claim.version),)
    left = tuple(name for name in claim.chunks if name in failed)
    if not left:
        return _Change(claim.key, None, 0, (Delete(GC, claim.key),), current)
    narrowed = claim.entry.replace(chunk=left[0], more=left[1:])
    return _Change(claim.key, None, 0, (Put(GC, claim.key, narrowed.encode()),), current)


def queue_entry(chunk: str, reason: GcReason, queued_ms: int, more: tuple[str, ...] = ()) -> Put:
    """The queue entry for ``chunk`` (and the ``more`` chunks of its run) as an
    operation, keyed by ``queued_ms`` and the first chunk: it becomes due ``gc_delay_s``
    after that (a lease queues an intent in the future)."""
    return Put(GC, gc_key(queued_ms, chunk), GcEntry(chunk, reason, queued_ms, False, more).encode())


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
