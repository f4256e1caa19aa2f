"""Defrag batch runs with the in-process executor (``slts.storage.batch_defrag``).

The driver is not the container's owner: it runs beside a live instance that keeps
writing, and everything it did must be visible to that instance (no stale cache
serving a deleted chunk). The Spark executor is tested in ``tests/spark``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TypeAlias

import pytest
from slts.bindings.memory import MemoryChunkStorage

from slts.admin.verify import verify_container
from slts.errors import ChunkNotFound, Fenced, InvalidArgument, InvalidName, StorageUnavailable
from slts.metadata.faulty_store import FaultyMetadataStore
from slts.metadata.schema import SEGMENTS, name_key
from slts.metadata.store import Expect, Operation
from slts.storage.batch_defrag import (
    ERRORS_KEPT,
    BatchDefrag,
    BatchReport,
    RunTask,
    execute,
    execute_locally,
    run_batch,
)
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import PAIRS, TRANSFORM_PAIRS, Env, env_fixture, segment_chunks

env = env_fixture(PAIRS + TRANSFORM_PAIRS)

SMALL = {"defrag_small_chunk_bytes": 1000}


def fragment(
    env: Env, count: int, pieces: int, prefix: str = "f/"
) -> tuple[ChunkedSegmentStorage, dict[str, bytearray]]:
    """``count`` segments of ``pieces`` chunks each: every piece is written by a new owner
    (a takeover always starts a new chunk). Returns the last owner and the bytes."""
    written: dict[str, bytearray] = {}
    owner = env.open(**SMALL)
    for piece in range(pieces):
        if piece:
            owner = env.reopen(**SMALL)
        for i in range(count):
            name = f"{prefix}{i:04d}"
            if not piece:
                owner.create(name)
            data = os.urandom(60 + (i * 7 + piece * 13) % 90)
            owner.write(owner.open_write(name), len(written.get(name, b"")), data)
            written.setdefault(name, bytearray()).extend(data)
    return owner, written


def contents(storage: ChunkedSegmentStorage) -> dict[str, bytes]:
    """Every segment's readable bytes (from its start offset)."""
    result = {}
    for name in storage.list():
        info = storage.info(name)
        result[name] = storage.read(
            storage.open_read(name), info.start_offset, info.length - info.start_offset
        )
    return result


def driver(env: Env) -> BatchDefrag:
    return BatchDefrag(
        env.binding, env.store, 0, env.instances[-1].config if env.instances else None, clock=env.clock
    )


def test_a_batch_merges_runs_of_every_segment_and_a_second_plans_nothing(env: Env) -> None:
    owner, written = fragment(env, 30, 8)
    owner.seal(owner.open_write("f/0000"))  # a sealed segment's last chunk may merge too
    before = sum(owner.info(name).chunk_count for name in written)
    progressed: list[int] = []
    report = run_batch(driver(env), execute_locally(env.binding, 3), batch_runs=7, progress=progressed.append)
    assert report.runs_failed == report.runs_dropped == 0 and report.batches > 1
    assert len(progressed) == report.batches and sum(progressed) == report.runs_planned
    assert all(0 < n <= 7 for n in progressed)
    assert report.segments_scanned == 30 and report.chunks_before == before
    after = sum(owner.info(name).chunk_count for name in written)
    assert report.chunks_after == after and after <= before // 3
    assert owner.info("f/0000").chunk_count == 1
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    moved = report.bytes_native + report.bytes_copied
    assert 0 < moved <= sum(chunk.stored for name in written for _, chunk in owner.chunks(name))
    env.clock.advance(60)
    while owner.gc.run_once().progressed:
        pass
    assert verify_container(owner).problems == []
    again = run_batch(driver(env), execute_locally(env.binding), progress=progressed.append)
    assert len(progressed) == report.batches  # nothing planned: no progress step, no error
    assert again.runs_planned == 0 and again.chunks_after == again.chunks_before == after


def test_the_live_owner_keeps_writing_and_sees_the_new_layout(env: Env) -> None:
    owner, written = fragment(env, 6, 6)
    batch = driver(env)
    planned = [p for runs in batch.plan() for p in batch.register(runs)]
    built = execute_locally(env.binding)([p.task for p in planned])
    for name, data in written.items():  # the owner appends (its cache still holds the old layout)
        extra = os.urandom(150)
        owner.write(owner.open_write(name), len(data), extra)
        data += extra
    assert all(batch.commit(p, b) for p, b in zip(planned, built, strict=True)), (
        "writes elsewhere drop no run"
    )
    for name, data in written.items():  # reads and writes of the owner after the swap
        assert owner.read(owner.open_read(name), 0, len(data)) == bytes(data)
        owner.write(owner.open_write(name), len(data), b"tail")
        data += b"tail"
    env.clock.advance(60)
    while owner.gc.run_once().progressed:  # the replaced chunks are deleted now
        pass
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    assert verify_container(owner).problems == []
    assert owner.epoch == env.instances[-1].epoch and not owner._ownership.fenced, "the batch fences nobody"


BeforeCommit: TypeAlias = Callable[[Sequence[Operation], Sequence[Expect]], None]


def once_before_commit_on(segment: str, action: Callable[[], None]) -> BeforeCommit:
    """A ``FaultyMetadataStore.before_commit`` hook that runs ``action`` once, just before
    the next commit that names ``segment``: another process's commit lands between the
    owner's read and its commit."""
    key = name_key(segment)
    pending = [action]

    def hook(ops: Sequence[Operation], expect: Sequence[Expect]) -> None:
        if pending and any(x.table == SEGMENTS and x.key == key for x in [*ops, *expect]):
            pending.pop()()

    return hook


Written = dict[str, bytearray]


def take_over(owner: ChunkedSegmentStorage, written: Written) -> None:
    owner.open_write("f/0000")
    owner.write(owner.open_write("f/0000"), len(written["f/0000"]), b"more")
    written["f/0000"] += b"more"


def seal(owner: ChunkedSegmentStorage, written: Written) -> None:
    owner.seal(owner.open_write("f/0000"))
    assert owner.info("f/0000").sealed


def unseal(owner: ChunkedSegmentStorage, written: Written) -> None:
    owner.unseal(owner.open_write("f/0000"))
    assert not owner.info("f/0000").sealed


def delete(owner: ChunkedSegmentStorage, written: Written) -> None:
    owner.delete(owner.open_write("f/0000"))
    del written["f/0000"]


def truncate(owner: ChunkedSegmentStorage, written: Written) -> None:
    owner.truncate(owner.open_write("f/0000"), 200)
    assert owner.info("f/0000").start_offset == 200
    del written["f/0000"][:200]


def concat(owner: ChunkedSegmentStorage, written: Written) -> None:
    owner.concat(owner.open_write("f/0000"), len(written["f/0000"]), "f/0001")
    written["f/0000"] += written.pop("f/0001")


def take(owner: ChunkedSegmentStorage) -> None:
    owner.open_write("f/0000")


def take_and_seal(owner: ChunkedSegmentStorage) -> None:
    owner.seal(owner.open_write("f/0000"))


#: Owner changes of segment f/0000 (f/0001 is sealed), each with what runs before the
#: batch is planned; the change asserts its effect and updates the expected bytes.
OWNER_CHANGES: dict[str, tuple[Callable[[ChunkedSegmentStorage], None], Callable[..., None]]] = {
    "take over": (lambda owner: None, take_over),
    "seal": (take, seal),
    "unseal": (take_and_seal, unseal),
    "delete": (take, delete),
    "truncate": (take, truncate),
    "concat": (take, concat),
}


@pytest.mark.parametrize("change", OWNER_CHANGES)
def test_the_owners_changes_absorb_a_batch_commit_beside_them(env: Env, change: str) -> None:
    """A batch commit to the same segment between the owner's read and its commit
    (found by the Spark live-writer test: ``open_write`` raised ``VersionConflict``):
    the owner reads again and applies its change; the batch's run stands."""
    raw = env.store
    env.store = hooked = FaultyMetadataStore(raw)
    _, written = fragment(env, 2, 4)
    env.instances[-1].seal(env.instances[-1].open_write("f/0001"))
    owner = env.reopen(**SMALL)  # the segments are the older epoch's until taken over
    setup, operation = OWNER_CHANGES[change]
    setup(owner)
    batch = BatchDefrag(env.binding, raw, 0, owner.config, clock=env.clock)
    planned = [p for runs in batch.plan(names=["f/0000"]) for p in batch.register(runs)]
    assert planned, "the segment has a run to merge"
    built = execute_locally(env.binding)([p.task for p in planned])
    committed: list[bool] = []
    hooked.before_commit = once_before_commit_on(
        "f/0000", lambda: committed.extend(batch.commit(p, b) for p, b in zip(planned, built, strict=True))
    )
    retries = owner.statistics().commit_retries
    operation(owner, written)
    assert committed and all(committed), "the batch committed between the owner's read and commit"
    assert owner.statistics().commit_retries == retries + 1
    env.clock.advance(60)
    while owner.gc.run_once().progressed:
        pass
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    assert verify_container(owner).problems == []


def test_a_run_that_changed_is_dropped_and_its_chunk_collected(env: Env) -> None:
    owner, written = fragment(env, 1, 6)
    batch = driver(env)
    [planned] = [p for runs in batch.plan() for p in batch.register(runs)]
    built = execute(planned.task, env.binding)
    owner.truncate(owner.open_write("f/0000"), 250)  # drops chunks of the run
    assert batch.commit(planned, built) is False
    assert batch.release(planned) is False, "the leased intent was still there: traded for a due entry"
    env.clock.advance(60)
    while owner.gc.run_once().progressed:
        pass
    assert built.name not in segment_chunks(env.binding), "the dropped run's chunk is collected"
    assert contents(owner)["f/0000"] == bytes(written["f/0000"][250:])
    assert verify_container(owner).problems == []


def test_tasks_are_idempotent(env: Env) -> None:
    fragment(env, 1, 5)
    batch = driver(env)
    [planned] = [p for runs in batch.plan() for p in batch.register(runs)]
    first = execute(planned.task, env.binding)
    again = execute(planned.task, env.binding)  # a retried attempt: the chunk is there already
    assert (again.name, again.length, again.checksum) == (first.name, first.length, first.checksum)
    assert batch.commit(planned, again)


def test_a_new_owner_stops_the_batch(env: Env) -> None:
    fragment(env, 3, 5)
    batch = driver(env)
    runs = next(batch.plan())
    env.open(**SMALL)  # a new owner starts
    before = env.snapshot()
    with pytest.raises(Fenced):
        batch.register(runs)
    assert env.snapshot() == before


def test_failed_tasks_are_reported_and_collected(env: Env) -> None:
    owner, written = fragment(env, 4, 5)

    def failing(tasks: list[RunTask]) -> list[object]:
        outcomes: list[object] = []
        for task in tasks:
            if task.segment == "f/0001":
                execute(task, env.binding)  # the chunk lands, then the executor dies
                outcomes.append(StorageUnavailable("executor lost"))
            else:
                outcomes.append(execute(task, env.binding))
        return outcomes

    report = run_batch(driver(env), failing)  # type: ignore[arg-type]
    assert report.runs_failed == 1 and "executor lost" in report.errors[0]
    env.clock.advance(60)
    while owner.gc.run_once().progressed:
        pass
    assert contents(owner) == {name: bytes(data) for name, data in written.items()}
    assert verify_container(owner).problems == [], "the failed task's chunk is no leak"


def test_every_failed_run_is_counted_by_kind_past_the_errors_kept(env: Env) -> None:
    """With more failed runs than ``ERRORS_KEPT``, the report keeps that many errors whole
    and counts every failed run by its error's type (how a batch failed, in one line)."""
    fragment(env, ERRORS_KEPT + 4, 3)

    def failing(tasks: list[RunTask]) -> list[object]:
        return [
            ChunkNotFound(f"source of {task.segment} gone") if i % 3 else StorageUnavailable("executor lost")
            for i, task in enumerate(tasks)
        ]

    report = run_batch(driver(env), failing)  # type: ignore[arg-type]
    failed = ERRORS_KEPT + 4
    assert report.runs_failed == failed and report.runs_committed == 0
    assert len(report.errors) == ERRORS_KEPT
    unavailable = len(range(0, failed, 3))
    assert report.error_kinds == {"ChunkNotFound": failed - unavailable, "StorageUnavailable": unavailable}


def test_bad_input_changes_nothing(env: Env) -> None:
    fragment(env, 2, 4)
    batch = driver(env)
    before = env.snapshot()
    with pytest.raises(InvalidName):
        list(batch.plan(names=["../escape"]))
    with pytest.raises(InvalidName):
        list(batch.plan(prefix="a\x00b"))
    with pytest.raises(InvalidArgument):
        list(batch.plan(batch_runs=0))
    with pytest.raises(InvalidArgument):
        list(batch.plan(batch_bytes=0))
    anonymous = MemoryChunkStorage()
    anonymous.url = ""  # a binding executors could not rebuild
    with pytest.raises(InvalidArgument, match="no URL"):
        BatchDefrag(anonymous, env.store, 0)
    with pytest.raises(InvalidArgument, match="container"):
        BatchDefrag(env.binding, env.store, 5)
    assert env.snapshot() == before
    assert isinstance(run_batch(batch, execute_locally(env.binding), names=["f/missing"]), BatchReport)
