"""A GC intent collected before its chunk existed never leaks the chunk.

The owner's GC takes an intent for garbage once it is ``gc_delay_s`` old: it claims
it, deletes the chunk (not there yet) and removes the entry. A creator that was slower
than that (a stalled writer, a long defrag) then creates a chunk nothing accounts for,
unless it queues the chunk again after its commit failed (``gc.requeue_lost_intents``).
Each test stalls one creator past ``gc_delay_s`` right before it creates its chunk,
runs the owner's GC there, and checks that the operation changed nothing visible, that
``verify`` finds no leak, and that the next GC pass deletes the chunk.

Defrag batch runs lease their intents (``defrag_batch_lease_s``) and renew the lease
while the batch builds, so the owner's GC leaves a running batch alone; a batch whose
lease lapses has its runs expire.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import pytest

from slts.admin.verify import verify_container
from slts.config import StorageConfig
from slts.errors import WriteExpired
from slts.metadata.schema import GC
from slts.metadata.store import Delete
from slts.storage.batch_defrag import BatchDefrag, Outcome, PlannedRun, RunTask, execute_locally, run_batch
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, segment_chunks

from .test_batch_defrag import SMALL, contents, fragment


def collect(owner: ChunkedSegmentStorage, env: Env) -> None:
    """Every queued chunk due, then GC passes until one deletes nothing."""
    env.clock.advance(owner.config.gc_delay_s + 1)
    while owner.gc.run_once().progressed:
        pass


def stall_once(
    env: Env, owner: ChunkedSegmentStorage, monkeypatch: pytest.MonkeyPatch, prefix: str
) -> list[str]:
    """Make the binding's next ``create``/``concat`` of a chunk under ``prefix`` stall past
    ``gc_delay_s``, with the owner's GC running meanwhile; the stalled chunk names."""
    stalled: list[str] = []

    def stalling(original: Callable[..., object]) -> Callable[..., object]:
        def call(name: str, *args: object, **kwargs: object) -> object:
            if name.startswith(prefix) and not stalled:
                stalled.append(name)
                env.clock.advance(owner.config.gc_delay_s + 1)
                owner.gc.run_once()  # the intent is due: claimed, nothing to delete yet, entry gone
            return original(name, *args, **kwargs)

        return call

    for method in ("create", "concat"):
        monkeypatch.setattr(env.binding, method, stalling(getattr(env.binding, method)))
    return stalled


def test_a_write_stalled_past_gc_delay_fails_and_its_chunk_is_collected(env: Env, monkeypatch) -> None:
    owner = env.open()
    owner.create("s")
    stalled = stall_once(env, owner, monkeypatch, "0/s/")
    with pytest.raises(WriteExpired, match="longer than gc_delay_s") as caught:
        owner.write(owner.open_write("s"), 0, b"x" * 100)  # a first write always makes a new chunk
    assert caught.value.retryable and caught.value.segment == "s" and caught.value.chunks == stalled
    assert owner.statistics().commit_retries == 0, "an expired write does not retry its commit"
    monkeypatch.undo()
    assert len(stalled) == 1 and env.binding.exists(stalled[0]), "the stalled create did land"
    assert owner.info("s").length == 0, "the failed write is not visible"
    assert verify_container(owner).problems == [], "the chunk is queued again, not leaked"
    collect(owner, env)
    assert not env.binding.exists(stalled[0]), "GC deleted the chunk"
    owner.write(owner.open_write("s"), 0, b"y" * 10)
    assert owner.read(owner.open_read("s"), 0, 10) == b"y" * 10
    assert verify_container(owner).problems == []


def test_an_in_process_defrag_stalled_past_gc_delay_drops_its_run_and_leaks_nothing(
    env: Env, monkeypatch
) -> None:
    owner, written = fragment(env, 1, 4)
    before = segment_chunks(env.binding)
    stalled = stall_once(env, owner, monkeypatch, "0/f/0000/")
    result = owner.defrag("f/0000")
    monkeypatch.undo()
    assert len(stalled) == 1 and result.runs_committed == 0 and result.runs_dropped == 1, result
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    assert verify_container(owner).problems == [], "the run's chunk is queued again, not leaked"
    collect(owner, env)
    assert segment_chunks(env.binding) == before, "GC deleted the run's chunk"
    again = owner.defrag("f/0000")  # nothing stalls now: the run commits
    assert again.runs_committed == 1, again


def gc_during_the_batch(
    env: Env, owner: ChunkedSegmentStorage
) -> Callable[[Sequence[RunTask]], list[Outcome]]:
    """An in-process executor that first lets ``gc_delay_s`` pass and the owner's GC run,
    as a minute into a long batch."""
    build = execute_locally(env.binding, 2)

    def slow(tasks: Sequence[RunTask]) -> list[Outcome]:
        env.clock.advance(owner.config.gc_delay_s + 1)
        owner.gc.run_once()
        return list(build(tasks))

    return slow


def test_the_owners_gc_leaves_a_leased_batch_alone(env: Env) -> None:
    owner, written = fragment(env, 3, 4)
    batch = BatchDefrag(env.binding, env.store, 0, StorageConfig(**SMALL), clock=env.clock)
    report = run_batch(batch, gc_during_the_batch(env, owner))
    assert report.runs_committed == report.runs_planned == 3 and report.runs_expired == 0, report
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    collect(owner, env)
    assert verify_container(owner).problems == []
    assert all(owner.info(name).chunk_count == 2 for name in written)


def test_a_batch_that_outlives_its_lease_expires_its_runs_and_leaks_nothing(env: Env) -> None:
    owner, written = fragment(env, 3, 4)
    before = segment_chunks(env.binding)
    config = StorageConfig(**SMALL, defrag_batch_lease_s=0.0)  # type: ignore[arg-type]
    batch = BatchDefrag(env.binding, env.store, 0, config, clock=env.clock)
    report = run_batch(batch, gc_during_the_batch(env, owner))
    assert report.runs_expired == report.runs_planned == 3 and report.runs_committed == 0, report
    assert report.runs_dropped == report.runs_failed == 0, (
        "an expiry is told apart from a change of the segment"
    )
    assert len(segment_chunks(env.binding)) == len(before) + 3, "the tasks built their chunks after GC's pass"
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    assert verify_container(owner).problems == [], "the built chunks are queued again, not leaked"
    collect(owner, env)
    assert segment_chunks(env.binding) == before, "GC deleted them"
    again = run_batch(
        BatchDefrag(env.binding, env.store, 0, StorageConfig(**SMALL), clock=env.clock),
        execute_locally(env.binding),
    )
    assert again.runs_committed == 3, again


def end_runs(batch: BatchDefrag, planned: Sequence[PlannedRun], outcomes: Sequence[Outcome]) -> list[str]:
    """Commit each built run, releasing what did not commit: how each ended."""
    ends = []
    for item, outcome in zip(planned, outcomes, strict=True):
        assert not isinstance(outcome, BaseException), outcome
        ends.append(
            "committed" if batch.commit(item, outcome) else "expired" if batch.release(item) else "dropped"
        )
    return ends


def test_renewal_moves_the_intents_still_held_and_leaves_those_gc_took(env: Env, monkeypatch) -> None:
    owner, written = fragment(env, 3, 4)
    lease = 100.0
    batch = BatchDefrag(
        env.binding,
        env.store,
        0,
        StorageConfig(**SMALL, defrag_batch_lease_s=lease),  # type: ignore[arg-type]
        clock=env.clock,
    )
    [runs] = list(batch.plan())
    planned = batch.register(runs)
    taken = planned[0]
    commits: list[int] = []
    commit = batch._commit

    def racing_gc(ops, expect):
        if not commits:  # GC takes one intent between the renewal's look and its commit
            env.store.commit([Delete(GC, taken.intent_key)], [])
        commits.append(len(ops))
        return commit(ops, expect)

    env.clock.advance(lease / 2)
    monkeypatch.setattr(batch, "_commit", racing_gc)
    renewed = batch.renew(planned)
    monkeypatch.undo()
    assert commits == [6, 4], "the first commit lost to GC's; the second moved the two intents still held"
    assert renewed[0] == taken, "a taken intent is left as it was"
    assert all(
        new.intent_key != old.intent_key and new.intent_version > old.intent_version
        for new, old in zip(renewed[1:], planned[1:], strict=True)
    )
    env.clock.advance(
        lease / 2 + owner.config.gc_delay_s + 1
    )  # the first lease is over, the renewed one is not
    owner.gc.run_once()
    ends = end_runs(batch, renewed, execute_locally(env.binding)([item.task for item in renewed]))
    assert ends == ["expired", "committed", "committed"]
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    assert verify_container(owner).problems == []


def test_a_batch_held_up_for_longer_than_its_lease_keeps_its_runs(env: Env, monkeypatch) -> None:
    owner, written = fragment(env, 3, 4)
    lease = 0.3  # renewed every 0.1 s of real time; the fake clock says when intents fall due
    batch = BatchDefrag(
        env.binding,
        env.store,
        0,
        StorageConfig(**SMALL, defrag_batch_lease_s=lease),  # type: ignore[arg-type]
        clock=env.clock,
    )
    renewals = threading.Condition()
    count = [0]
    renew = batch.renew

    def counted(planned: Sequence[PlannedRun]) -> list[PlannedRun]:
        result = renew(planned)
        with renewals:
            count[0] += 1
            renewals.notify_all()
        return result

    monkeypatch.setattr(batch, "renew", counted)
    build = execute_locally(env.binding, 2)

    def held_up(tasks: Sequence[RunTask]) -> list[Outcome]:
        env.clock.advance(owner.config.gc_delay_s + lease + 1)  # every registered intent would be due
        with renewals:  # the second renewal from now began after the clock moved
            seen = count[0]
            assert renewals.wait_for(lambda: count[0] >= seen + 2, timeout=60), "the driver did not renew"
        owner.gc.run_once()
        return list(build(tasks))

    report = run_batch(batch, held_up)
    assert report.runs_committed == report.runs_planned == 3 and report.runs_expired == 0, report
    assert report.lease_renewals >= 2
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    collect(owner, env)
    assert verify_container(owner).problems == []
    assert all(owner.info(name).chunk_count == 2 for name in written)
