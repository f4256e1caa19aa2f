"""GC in batches (``slts.gc`` module doc, DESIGN.md §7).

A batch of due queue entries costs one claim commit, one barrier (one flush of the
metadata log to tier-2), the chunk deletes in parallel (at most ``gc_delete_threads``
at once) and one removal commit; a tombstone batch costs one barrier, the deletes and
one commit. An entry that changed under the batch (a writer committed its chunk, the
entry was queued again) is left out without sinking the batch, and its chunk is kept.
A failure or a crash between the claim and the removal leaks nothing: the claimed
entries stay, and the next pass (of this owner or the next) finishes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from slts.bindings.base import ChunkHandle
from slts.bindings.faulty import FaultyChunkStorage

from slts.admin.verify import verify_container
from slts.limiter import TrafficClass
from slts.metadata.delegating import DelegatingStore
from slts.metadata.records import ChunkRecord, GcEntry
from slts.metadata.schema import CHUNKS, GC, name_key
from slts.metadata.store import Delete, Expect, MetadataStore, Operation, Put
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import BINDINGS, STORES, Env, segment_chunks

PAIRS = [("memory", "memory"), ("filesystem", "lmdb"), ("s3", "lmdb")]


class Crash(BaseException):
    """The process dies here (nothing in the engine catches a ``BaseException``)."""


class WatchedStore(DelegatingStore):
    """Delegates to ``inner``; keeps every applied commit (its ops and sequence) and runs
    ``before`` (once, when set) ahead of the next commit it matches: a racing writer
    committing to ``inner`` first, or a crash."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self.applied: list[tuple[int, tuple[Operation, ...]]] = []
        self.before: tuple[Callable[[Sequence[Operation]], bool], Callable[[], None]] | None = None

    def commit(self, ops: Sequence[Operation], expect: Sequence[Expect] = ()) -> int:
        if self.before is not None and self.before[0](ops):
            action = self.before[1]
            self.before = None
            action()
        sequence = self.inner.commit(ops, expect)
        self.applied.append((sequence, tuple(ops)))
        return sequence


@pytest.fixture(params=PAIRS, ids=[f"{b}+{s}" for b, s in PAIRS])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    """An ``Env`` whose binding injects faults and whose store is watched."""
    binding_name, store_name = request.param
    environment = Env(
        FaultyChunkStorage(BINDINGS[binding_name](tmp_path), seed=17),
        WatchedStore(STORES[store_name](tmp_path)),
    )
    yield environment
    for instance in environment.instances:
        instance.close()
    environment.store.close()
    environment.binding.close()


def is_claim(ops: Sequence[Operation]) -> bool:
    """Is this the claim commit of a batch (it marks queue entries claimed)?"""
    return any(isinstance(op, Put) and op.table == GC and GcEntry.decode(op.value).claimed for op in ops)


def is_removal(ops: Sequence[Operation]) -> bool:
    """Is this the removal commit of a batch (queue entries deleted, nothing else)?"""
    return bool(ops) and all(isinstance(op, Delete) and op.table == GC for op in ops)


def queue(env: Env) -> dict[str, GcEntry]:
    """The GC queue, by chunk name (every chunk of an entry of a run maps to the entry)."""
    entries = map(GcEntry.decode, (v.value for v in env.store.dump()[GC].values()))
    return {name: entry for entry in entries for name in entry.chunks}


def settle(env: Env, storage: ChunkedSegmentStorage) -> None:
    """Collect what the writes left queued (on an object store, the intent registered one
    write ahead: ``slts.storage.ahead_intents``), so that the queue starts empty."""
    env.clock.advance(storage.config.gc_delay_s + 1)
    while storage.gc.run_once().progressed:
        pass
    assert queue(env) == {}


def drop_chunks(env: Env, storage: ChunkedSegmentStorage, count: int) -> list[str]:
    """A segment of ``count + 1`` one-byte chunks truncated to its last one: ``count``
    chunks queued as ``dropped`` (and nothing else), due now. Their names, in list order."""
    storage.create("s", max_rolling_length=1)
    handle = storage.open_write("s")
    storage.write(handle, 0, bytes(range(count + 1)))
    names = [chunk.name for _, chunk in storage.chunks("s")][:count]
    settle(env, storage)
    storage.truncate(handle, count)
    env.clock.advance(storage.config.gc_delay_s + 1)
    assert sorted(queue(env)) == sorted(names)
    return names


def mark(env: Env) -> int:
    """How many commits the store has applied so far (for ``commits_since``)."""
    assert isinstance(env.store, WatchedStore)
    return len(env.store.applied)


def commits_since(env: Env, start: int) -> list[tuple[int, tuple[Operation, ...]]]:
    """The commits applied since ``mark`` returned ``start``: (sequence, ops) each."""
    assert isinstance(env.store, WatchedStore)
    return env.store.applied[start:]


def clean(env: Env, storage: ChunkedSegmentStorage) -> None:
    """Nothing leaked: exactly the referenced chunks on storage, the queue empty, verify clean."""
    referenced = {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}
    assert set(segment_chunks(env.binding)) == referenced
    assert queue(env) == {}
    assert verify_container(storage).problems == []


def test_a_batch_costs_two_commits_one_barrier_and_one_flush(env: Env) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20)
    barriers: list[int] = []
    flush = storage.gc.barrier

    def barrier(sequence: int) -> None:
        barriers.append(sequence)
        flush(sequence)

    storage.gc.barrier = barrier
    assert storage.durable is not None
    flushes, start = storage.durable.statistics().flushes, mark(env)
    stats = storage.gc.run_once()
    assert stats.chunks_deleted == 20 and stats.errors == 0
    (claim, claim_ops), (_, removal_ops) = commits_since(env, start)
    assert is_claim(claim_ops) and len(claim_ops) == 20, "one commit claims the batch"
    assert is_removal(removal_ops) and len(removal_ops) == 20, "one commit removes it"
    assert barriers == [claim], "one barrier, for the claim"
    assert storage.durable.statistics().flushes - flushes == 1, "one flush of the metadata log"
    assert not any(env.binding.exists(name) for name in names)
    clean(env, storage)


def test_batches_stay_within_gc_batch_max(env: Env) -> None:
    storage = env.open(gc_batch_max=7)
    drop_chunks(env, storage, 20)
    start = mark(env)
    runs = [storage.gc.run_once().chunks_deleted for _ in range(4)]
    assert runs == [7, 7, 6, 0]
    commits = [ops for _, ops in commits_since(env, start)]
    assert [len(ops) for ops in commits] == [7, 7, 7, 7, 6, 6], "claim + removal per batch"
    clean(env, storage)


@pytest.mark.parametrize("race", ["writer committed the chunk", "entry queued again"])
def test_an_entry_that_changed_under_the_batch_is_left_out_and_the_rest_collected(
    env: Env, race: str
) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20)
    raced = names[13]
    key, stored = next((k, v) for k, v in env.store.dump()[GC].items() if k.endswith(name_key(raced)))
    if race == "writer committed the chunk":  # its record appears: the chunk is referenced again
        record = ChunkRecord(raced, 1, 0, 1, None, storage.epoch, None)
        change: list[Operation] = [Put(CHUNKS, name_key(raced), record.encode())]
    else:
        change = [Put(GC, key, stored.value)]  # the same entry, at a new version
    assert isinstance(env.store, WatchedStore)
    env.store.before = (is_claim, lambda: env.store.inner.commit(change))  # type: ignore[attr-defined]
    start = mark(env)
    stats = storage.gc.run_once()
    assert stats.chunks_deleted == 19 and stats.errors == 0
    assert env.binding.exists(raced), "a chunk whose entry changed is never deleted by this batch"
    assert [n for n in names if env.binding.exists(n)] == [raced]
    assert not queue(env)[raced].claimed and list(queue(env)) == [raced]
    claims = [ops for _, ops in commits_since(env, start) if is_claim(ops)]
    assert sum(len(ops) for ops in claims) == 19, "every other entry claimed once"
    assert len(claims) <= 1 + 2 * 5, "split in halves: O(log n) commits for one conflict"
    again = storage.gc.run_once()
    if race == "writer committed the chunk":
        assert (again.entries_kept, again.chunks_deleted) == (1, 0), "the verdict comes from metadata"
        assert env.binding.exists(raced) and queue(env) == {}
    else:
        assert (again.entries_kept, again.chunks_deleted) == (0, 1)
        assert not env.binding.exists(raced) and queue(env) == {}


def test_a_failed_delete_keeps_its_claim_and_the_next_pass_finishes_it(env: Env) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20)
    assert isinstance(env.binding, FaultyChunkStorage)
    env.binding.fail_nth("delete", 5)
    stats = storage.gc.run_once()
    assert (stats.chunks_deleted, stats.errors) == (19, 1)
    [left] = [name for name in names if env.binding.exists(name)]
    assert list(queue(env)) == [left] and queue(env)[left].claimed, "its claim stays"
    assert verify_container(storage).problems == [], "a claimed entry covers the chunk"
    start = mark(env)
    again = storage.gc.run_once()
    assert (again.chunks_deleted, again.errors) == (1, 0)
    [(_, removal)] = commits_since(env, start)
    assert is_removal(removal), "already claimed: no claim commit, only the removal"
    clean(env, storage)


@pytest.mark.parametrize("point", ["after the claim", "after the deletes"])
def test_a_crash_between_the_claim_and_the_removal_leaks_nothing(env: Env, point: str) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20)

    def crash(*_: object) -> None:
        raise Crash

    if point == "after the claim":
        storage.gc.barrier = crash  # before any delete
    else:
        assert isinstance(env.store, WatchedStore)
        env.store.before = (is_removal, crash)  # every delete ran
    with pytest.raises(Crash):
        storage.gc.run_once()
    entries = queue(env)
    assert sorted(entries) == sorted(names) and all(e.claimed for e in entries.values()), "all claimed"
    on_storage = [name for name in names if env.binding.exists(name)]
    assert on_storage == (names if point == "after the claim" else []), "the deletes ran, or none"
    after = env.reopen()
    assert verify_container(after).problems == [], "the claimed entries cover every chunk left"
    start = mark(env)
    stats = after.gc.run_once()
    # Deleted now, or found gone (the crashed pass deleted them): done, counted only once.
    assert stats.chunks_deleted == (20 if point == "after the claim" else 0) and stats.errors == 0
    assert queue(env) == {}
    assert not any(is_claim(ops) for _, ops in commits_since(env, start)), "nothing claimed twice"
    clean(env, after)


def test_deletes_run_in_parallel_bounded_and_as_gc_traffic(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = env.open()
    threads = storage.config.gc_delete_threads
    names = drop_chunks(env, storage, 3 * threads)
    together = threading.Barrier(threads, timeout=60)
    lock = threading.Lock()
    active, most, seen = [0], [0], [0]
    delete = env.binding.delete

    def counted(handle: ChunkHandle) -> None:
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            seen[0] += 1
            first = seen[0] <= threads
        try:
            if first:  # breaks (and fails the pass) unless that many deletes run at once
                together.wait()
            delete(handle)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(env.binding, "delete", counted)
    before = storage.meter.usage()[TrafficClass.GC].requests.get("DELETE", 0)
    stats = storage.gc.run_once()
    monkeypatch.undo()
    assert stats.chunks_deleted == len(names) and stats.errors == 0
    assert most[0] == threads, "as many at once as allowed, and no more"
    assert storage.meter.usage()[TrafficClass.GC].requests.get("DELETE", 0) - before == len(names)
    clean(env, storage)


def test_a_tombstone_batch_is_one_commit_and_a_failed_delete_commits_nothing(env: Env) -> None:
    storage = env.open(gc_batch_max=10)
    storage.create("d", max_rolling_length=1)
    handle = storage.open_write("d")
    storage.write(handle, 0, bytes(15))
    names = [chunk.name for _, chunk in storage.chunks("d")]
    settle(env, storage)
    storage.delete(handle)
    env.clock.advance(storage.config.gc_delay_s + 1)
    assert isinstance(env.binding, FaultyChunkStorage)
    env.binding.fail_nth("delete", 3)
    tombstones = env.store.dump()["deleted"]
    start = mark(env)
    failed = storage.gc.run_once()
    assert (failed.chunks_deleted, failed.errors, failed.tombstones_finished) == (
        9,
        1,
        0,
    )  # the other nine are gone (counted); nothing committed
    assert commits_since(env, start) == [] and env.store.dump()["deleted"] == tombstones, "nothing committed"
    assert verify_container(storage).problems == []
    first = storage.gc.run_once()
    assert (first.chunks_deleted, first.errors, first.tombstones_finished) == (
        1,
        0,
        0,
    )  # the nine were gone already
    assert len(commits_since(env, start)) == 1, "ten chunks, one commit"
    last = storage.gc.run_once()
    assert (last.chunks_deleted, last.tombstones_finished) == (5, 1)
    assert not any(env.binding.exists(name) for name in names)
    clean(env, storage)
