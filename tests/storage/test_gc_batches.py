"""GC in batches (``slts.gc`` module doc, DESIGN.md §7).

A truncate queues one entry per commit for the whole run of chunks it drops
(``GcEntry.more``). A batch of due queue entries holds up to ``gc_batch_max`` chunks and
costs one claim commit, one barrier (one flush of the metadata log to tier-2), the chunk
deletes in parallel (at most ``gc_delete_threads`` at once) and one removal commit; a
tombstone batch costs one barrier, the deletes and one commit. Every dropped chunk is
deleted exactly once. An entry that changed under the batch (a writer committed one of
its chunks, the entry was queued again) is left out as a whole without sinking the
batch; the next pass decides it afresh, keeping the chunk that has a record. A failure
or a crash between the claim and the removal leaks nothing: the claimed entries stay (a
run narrowed to the chunks whose delete failed), and the next pass (of this owner or the
next) finishes them.
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
from slts.metadata.records import ChunkRecord, GcEntry, GcReason
from slts.metadata.schema import CHUNKS, GC, name_key
from slts.metadata.store import Delete, Expect, MetadataStore, Operation, Put
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import BINDINGS, STORES, Env, segment_chunks

PAIRS = [("memory", "memory"), ("filesystem", "lmdb"), ("s3", "lmdb")]

Commit = tuple[tuple[Operation, ...], tuple[Expect, ...]]


class Crash(BaseException):
    """The process dies here (nothing in the engine catches a ``BaseException``)."""


class WatchedStore(DelegatingStore):
    """Delegates to ``inner``; keeps every applied commit (its sequence, ops and
    expectations) and runs ``before`` (once, when set) ahead of the next commit it
    matches: a racing writer committing to ``inner`` first, or a crash."""

    def __init__(self, inner: MetadataStore) -> None:
        super().__init__(inner)
        self.applied: list[tuple[int, Commit]] = []
        self.before: tuple[Callable[[Commit], bool], Callable[[], None]] | None = None

    def commit(self, ops: Sequence[Operation], expect: Sequence[Expect] = ()) -> int:
        if self.before is not None and self.before[0]((tuple(ops), tuple(expect))):
            action = self.before[1]
            self.before = None
            action()
        sequence = self.inner.commit(ops, expect)
        self.applied.append((sequence, (tuple(ops), tuple(expect))))
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


def is_claim(commit: Commit) -> bool:
    """Is this a claim commit (it marks queue entries claimed, expecting chunk records absent)?"""
    ops, expect = commit
    return any(
        isinstance(op, Put) and op.table == GC and GcEntry.decode(op.value).claimed for op in ops
    ) and any(e.table == CHUNKS for e in expect)


def is_removal(commit: Commit) -> bool:
    """Is this the removal commit of a batch (queue entries deleted, nothing else)?"""
    ops, _ = commit
    return bool(ops) and all(isinstance(op, Delete) and op.table == GC for op in ops)


def queue(env: Env) -> dict[str, GcEntry]:
    """The GC queue, by chunk name (every chunk of an entry of a run maps to the entry)."""
    entries = map(GcEntry.decode, (v.value for v in env.store.dump()[GC].values()))
    return {name: entry for entry in entries for name in entry.chunks}


def runs(env: Env) -> list[tuple[str, ...]]:
    """The chunks of each queue entry, in queue order."""
    return [GcEntry.decode(v.value).chunks for v in env.store.dump()[GC].values()]


def settle(env: Env, storage: ChunkedSegmentStorage) -> None:
    """Collect what the writes left queued (on an object store, the intent registered one
    write ahead: ``slts.storage.ahead_intents``), so that the queue starts empty."""
    env.clock.advance(storage.config.gc_delay_s + 1)
    while storage.gc.run_once().progressed:
        pass
    assert queue(env) == {}


def drop_chunks(env: Env, storage: ChunkedSegmentStorage, count: int, step: int | None = None) -> list[str]:
    """A segment of ``count + 1`` one-byte chunks truncated to its last one, ``step``
    chunks a truncate (default: all at once), 10 ms apart: ``count`` chunks
    queued as ``dropped`` (and nothing else) in one run entry per truncate batch, due
    now, in list order. Their names, in list order."""
    storage.create("s", max_rolling_length=1)
    handle = storage.open_write("s")
    storage.write(handle, 0, bytes(range(count + 1)))
    names = [chunk.name for _, chunk in storage.chunks("s")][:count]
    settle(env, storage)
    step = step or count
    for offset in range(step, count + step, step):
        storage.truncate(handle, min(offset, count))
        env.clock.advance(0.01)
    env.clock.advance(storage.config.gc_delay_s + 1)
    assert sorted(queue(env)) == sorted(names)
    batch = storage.config.gc_batch_max
    expected = [tuple(names[i : min(i + step, count)]) for i in range(0, count, step)]
    if step > batch:  # a truncate drops at most gc_batch_max chunks a commit
        expected = [run[i : i + batch] for run in expected for i in range(0, len(run), batch)]
    assert runs(env) == expected, "one entry per truncate commit, for its whole run"
    return names


def mark(env: Env) -> int:
    """How many commits the store has applied so far (for ``commits_since``)."""
    assert isinstance(env.store, WatchedStore)
    return len(env.store.applied)


def commits_since(env: Env, start: int) -> list[tuple[int, Commit]]:
    """The commits applied since ``mark`` returned ``start``: (sequence, (ops, expect)) each."""
    assert isinstance(env.store, WatchedStore)
    return env.store.applied[start:]


def deletes_counted(env: Env) -> Callable[[], dict[str, int]]:
    """Counts every chunk delete the binding is asked for, by name, from now on."""
    counts: dict[str, int] = {}
    lock = threading.Lock()
    delete = env.binding.delete

    def counted(handle: ChunkHandle) -> None:
        with lock:
            counts[handle.name] = counts.get(handle.name, 0) + 1
        delete(handle)

    env.binding.delete = counted  # type: ignore[method-assign]
    return lambda: dict(counts)


def clean(env: Env, storage: ChunkedSegmentStorage) -> None:
    """Nothing leaked: exactly the referenced chunks on storage, the queue empty, verify clean."""
    referenced = {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}
    assert set(segment_chunks(env.binding)) == referenced
    assert queue(env) == {}
    assert verify_container(storage).problems == []


def test_a_truncate_queues_one_entry_per_commit_for_its_run(env: Env) -> None:
    storage = env.open(gc_batch_max=7)
    storage.create("s", max_rolling_length=1)
    handle = storage.open_write("s")
    storage.write(handle, 0, bytes(21))
    names = [chunk.name for _, chunk in storage.chunks("s")][:20]
    settle(env, storage)
    start = mark(env)
    storage.truncate(handle, 20)
    commits = [ops for _, (ops, _) in commits_since(env, start) if any(op.table == CHUNKS for op in ops)]
    assert len(commits) == 3, "at most gc_batch_max chunks a commit"
    queued = [
        [GcEntry.decode(op.value) for op in ops if isinstance(op, Put) and op.table == GC] for ops in commits
    ]
    assert [len(entries) for entries in queued] == [1, 1, 1], "one entry a commit"
    assert [entry.chunks for [entry] in queued] == [
        tuple(names[0:7]),
        tuple(names[7:14]),
        tuple(names[14:20]),
    ]
    assert all(entry.reason == GcReason.DROPPED and not entry.claimed for [entry] in queued)
    assert verify_container(storage).problems == [], "every dropped chunk is covered by its run's entry"


def test_a_batch_costs_two_commits_one_barrier_and_one_flush(env: Env) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20, step=5)
    barriers: list[int] = []
    flush = storage.gc.barrier

    def barrier(sequence: int) -> None:
        barriers.append(sequence)
        flush(sequence)

    storage.gc.barrier = barrier
    assert storage.durable is not None
    flushes, start = storage.durable.statistics().flushes, mark(env)
    deletes = deletes_counted(env)
    stats = storage.gc.run_once()
    assert stats.chunks_deleted == 20 and stats.errors == 0
    (claim, claim_commit), (_, removal_commit) = commits_since(env, start)
    assert is_claim(claim_commit) and len(claim_commit[0]) == 4, "one commit claims the four runs"
    expected = [e.table for e in claim_commit[1]]
    assert (expected.count(GC), expected.count(CHUNKS)) == (4, 20), "each run unchanged, each record absent"
    assert is_removal(removal_commit) and len(removal_commit[0]) == 4, "one commit removes them"
    assert barriers == [claim], "one barrier, for the claim"
    assert storage.durable.statistics().flushes - flushes == 1, "one flush of the metadata log"
    assert deletes() == dict.fromkeys(names, 1), "every dropped chunk deleted exactly once"
    assert not any(env.binding.exists(name) for name in names)
    clean(env, storage)


def test_batches_stay_within_gc_batch_max_chunks(env: Env) -> None:
    storage = env.open(gc_batch_max=7)
    drop_chunks(env, storage, 20, step=3)  # runs of 3, 3, 3, 3, 3, 3, 2
    start = mark(env)
    passes = [storage.gc.run_once().chunks_deleted for _ in range(5)]
    assert passes == [6, 6, 6, 2, 0], "whole entries, up to gc_batch_max chunks"
    commits = [ops for _, (ops, _) in commits_since(env, start)]
    assert [len(ops) for ops in commits] == [2, 2, 2, 2, 2, 2, 1, 1], "claim + removal per batch"
    clean(env, storage)


def test_a_run_longer_than_gc_batch_max_is_collected_whole(env: Env) -> None:
    # Queued under a larger gc_batch_max, collected under a smaller one: an entry is
    # never split by the collector, so a pass takes it alone.
    storage = env.open(gc_batch_max=20)
    names = drop_chunks(env, storage, 20)
    after = env.reopen(gc_batch_max=7)
    env.clock.advance(after.config.gc_delay_s + 1)
    first = after.gc.run_once()
    assert (first.chunks_deleted, first.errors) == (20, 0)
    assert not any(env.binding.exists(name) for name in names)
    clean(env, after)


@pytest.mark.parametrize("race", ["writer committed the chunk", "entry queued again"])
def test_an_entry_that_changed_under_the_batch_is_left_out_and_the_rest_collected(
    env: Env, race: str
) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20, step=5)
    raced = names[13]
    run = next(run for run in runs(env) if raced in run)
    key, stored = next(
        (k, v) for k, v in env.store.dump()[GC].items() if raced in GcEntry.decode(v.value).chunks
    )
    if race == "writer committed the chunk":  # its record appears: the chunk is referenced again
        record = ChunkRecord(raced, 1, 0, 1, None, storage.epoch, None)
        change: list[Operation] = [Put(CHUNKS, name_key(raced), record.encode())]
    else:
        change = [Put(GC, key, stored.value)]  # the same entry, at a new version
    assert isinstance(env.store, WatchedStore)
    env.store.before = (is_claim, lambda: env.store.inner.commit(change))  # type: ignore[attr-defined]
    start = mark(env)
    stats = storage.gc.run_once()
    assert stats.chunks_deleted == 15 and stats.errors == 0, "the other runs are collected"
    assert [n for n in names if env.binding.exists(n)] == list(run), "the raced run waits, whole"
    assert sorted(queue(env)) == sorted(run) and not queue(env)[raced].claimed
    claims = [ops for _, (ops, expect) in commits_since(env, start) if is_claim((ops, expect))]
    assert sum(len(ops) for ops in claims) == 3, "every other entry claimed once"
    assert len(claims) <= 1 + 2 * 2, "split in halves: O(log n) commits for one conflict"
    again = storage.gc.run_once()
    if race == "writer committed the chunk":
        assert (again.entries_kept, again.chunks_deleted) == (1, 4), "the verdict comes from metadata"
        assert [n for n in names if env.binding.exists(n)] == [raced] and queue(env) == {}
    else:
        assert (again.entries_kept, again.chunks_deleted) == (0, 5)
        assert not any(env.binding.exists(n) for n in names) and queue(env) == {}
        clean(env, storage)


def test_a_run_raced_on_every_pass_waits_and_is_collected_once_the_races_stop(env: Env) -> None:
    # A run's claim fails as a whole when anything it expects changes under the batch.
    # While a writer keeps racing it the run waits (nothing of it deleted, nothing lost),
    # and the first pass without a race decides it afresh; a chunk that got a record
    # stays until the change that drops it queues it again.
    storage = env.open()
    names = drop_chunks(env, storage, 10)
    raced = names[4]
    assert isinstance(env.store, WatchedStore)
    watched = env.store
    [(key, stored)] = env.store.dump()[GC].items()

    def race() -> None:  # the run's entry is written again before each claim
        watched.inner.commit([Put(GC, key, stored.value)])

    for _ in range(5):
        watched.before = (is_claim, race)
        stats = storage.gc.run_once()
        assert (stats.chunks_deleted, stats.entries_kept, stats.errors) == (0, 0, 0)
        assert all(env.binding.exists(name) for name in names), "nothing deleted under a race"
        assert sorted(queue(env)) == sorted(names) and not queue(env)[raced].claimed
        assert verify_container(storage).problems == [], "the waiting run covers every chunk"
    # A record that stays: that chunk is kept and leaves the entry; the rest is collected.
    record = ChunkRecord(raced, 1, 0, 1, None, storage.epoch, None)
    watched.before = (is_claim, lambda: watched.inner.commit([Put(CHUNKS, name_key(raced), record.encode())]))
    assert storage.gc.run_once().chunks_deleted == 0
    kept = storage.gc.run_once()
    assert (kept.chunks_deleted, kept.entries_kept) == (9, 1)
    assert [n for n in names if env.binding.exists(n)] == [raced] and queue(env) == {}
    # Dropped again (its record goes, with a new entry): collected, nothing leaks.
    env.store.commit([Delete(CHUNKS, name_key(raced)), storage.gc.run_entry([raced], GcReason.DROPPED)])
    env.clock.advance(storage.config.gc_delay_s + 1)
    assert storage.gc.run_once().chunks_deleted == 1
    clean(env, storage)


def test_a_failed_delete_keeps_its_claim_and_the_next_pass_finishes_it(env: Env) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20, step=10)
    assert isinstance(env.binding, FaultyChunkStorage)
    env.binding.fail_nth("delete", 5)
    start = mark(env)
    stats = storage.gc.run_once()
    assert (stats.chunks_deleted, stats.errors) == (19, 1)
    [left] = [name for name in names if env.binding.exists(name)]
    assert list(queue(env)) == [left] and queue(env)[left].claimed, "its claim stays"
    assert runs(env) == [(left,)], "its run narrowed to it: the next pass deletes only it"
    (_, claim), (_, finish) = commits_since(env, start)
    assert is_claim(claim) and not is_claim(finish), "the narrowing claims nothing new"
    assert verify_container(storage).problems == [], "a claimed entry covers the chunk"
    start = mark(env)
    deletes = deletes_counted(env)
    again = storage.gc.run_once()
    assert (again.chunks_deleted, again.errors, again.chunks_gone) == (1, 0, 0)
    assert deletes() == {left: 1}
    [(_, removal)] = commits_since(env, start)
    assert is_removal(removal), "already claimed: no claim commit, only the removal"
    clean(env, storage)


@pytest.mark.parametrize("point", ["after the claim", "after the deletes"])
def test_a_crash_between_the_claim_and_the_removal_leaks_nothing(env: Env, point: str) -> None:
    storage = env.open()
    names = drop_chunks(env, storage, 20, step=5)

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
    assert stats.chunks_gone == (0 if point == "after the claim" else 20)
    assert queue(env) == {}
    assert not any(is_claim(commit) for _, commit in commits_since(env, start)), "nothing claimed twice"
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
