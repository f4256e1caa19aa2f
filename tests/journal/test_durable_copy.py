"""The container's copy of its metadata on tier-2, and restore from it (DESIGN.md §6).

A "lost machine" is simulated by stopping an instance without its final flush and
throwing its metadata store away; ``restore`` then rebuilds a new store from the
chunk storage alone, and the restored container must read byte-identical to the
state at the last flush (the RPO), pass ``verify_container`` (which also checks the
copy itself), and accept a new owner.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Callable, Iterator

import msgpack
import pytest
from slts.bindings.faulty import FaultyChunkStorage
from slts.journal.durable_copy import DurableCopy
from slts.journal.metadata_copy import encode_change
from slts.journal.restore import restore, verify_copy
from slts.journal.system_names import METADATA_LOG, METADATA_SNAPSHOTS
from slts.journal.system_segments import iter_range

from slts.admin.orphans import reconcile
from slts.admin.verify import verify_container
from slts.config import StorageConfig
from slts.errors import Fenced, InvalidArgument, MetadataCorrupted, StorageUnavailable
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.metadata.store import MetadataStore
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env

MANUAL = {"metadata_log_flush_interval_s": 0.0, "journal_snapshot_records": 20}


@contextlib.contextmanager
def copying(env: Env, store: MetadataStore) -> Iterator[tuple[ChunkedSegmentStorage, DurableCopy]]:
    """An instance on ``store`` whose metadata copy ships only when told (``MANUAL``)."""
    settings = StorageConfig(gc_interval_s=0.0, **MANUAL)  # type: ignore[arg-type]
    with ChunkedSegmentStorage(0, None, env.binding, store, settings, clock=env.clock) as storage:
        assert storage.durable is not None
        yield storage, storage.durable


def contents(storage: ChunkedSegmentStorage) -> dict[str, bytes]:
    result = {}
    for name in storage.list():
        info = storage.info(name)
        result[name] = storage.read(
            storage.open_read(name), info.start_offset, info.length - info.start_offset
        )
    return result


def churn(storage: ChunkedSegmentStorage, rng: random.Random, steps: int, prefix: str = "s") -> None:
    """Creates, small writes, seals, concats, truncates, deletes and defrags."""
    for step in range(steps):
        name = f"{prefix}{rng.randrange(12)}"
        if not storage.exists(name):
            storage.create(name, max_rolling_length=rng.choice([64, 1000]))
        handle = storage.open_write(name)
        info = storage.info(name)
        action = rng.random()
        if info.sealed:
            storage.unseal(handle)
        elif action < 0.6:
            storage.write(handle, info.length, os.urandom(rng.randrange(1, 200)))
        elif action < 0.7 and info.length:
            storage.truncate(handle, rng.randrange(info.start_offset, info.length + 1))
        elif action < 0.8:
            source = f"{prefix}src{step}"
            storage.create(source)
            storage.write(storage.open_write(source), 0, os.urandom(rng.randrange(1, 100)))
            storage.seal(storage.open_write(source))
            storage.concat(handle, info.length, source)
        elif action < 0.9:
            storage.defrag(name)
        else:
            storage.delete(handle)


def lose_machine(storage: ChunkedSegmentStorage, env: Env) -> None:
    """Stop the instance the way a lost machine does: no final flush; then the metadata
    is gone (an LMDB folder is deleted from disk)."""
    storage.gc.stop()
    assert storage.durable is not None
    storage.durable.close(flush=False)
    storage.durable = None
    storage.close()
    if isinstance(env.store, LmdbMetadataStore):
        env.store.close()
        shutil.rmtree(env.store.path)


@contextlib.contextmanager
def restored(env: Env, tmp_path) -> Iterator[ChunkedSegmentStorage]:
    """A new owner on a store restored from ``env.binding`` alone (closed afterwards)."""
    target = fresh_store(env, tmp_path)
    report = restore(env.binding, 0, target)
    assert report.sequence >= report.snapshot_sequence
    settings = StorageConfig(**{"gc_delay_s": 10.0, "gc_interval_s": 0.0, **MANUAL})  # type: ignore[arg-type]
    try:
        with ChunkedSegmentStorage(0, None, env.binding, target, settings, clock=env.clock) as instance:
            yield instance
    finally:
        target.close()


def assert_restores(env: Env, tmp_path, expected: dict[str, bytes]) -> None:
    """Tier-2 alone restores exactly ``expected``, with every invariant holding."""
    with restored(env, tmp_path) as instance:
        assert contents(instance) == expected
        assert verify_container(instance).problems == []


def fresh_store(env: Env, tmp_path) -> MetadataStore:
    if isinstance(env.store, LmdbMetadataStore):
        return LmdbMetadataStore(str(tmp_path / f"restored-{os.urandom(4).hex()}"), TABLES)
    return MemoryMetadataStore(TABLES)


def test_restore_is_byte_identical_up_to_the_last_flush(env: Env, tmp_path) -> None:
    storage = env.open(**MANUAL)
    rng = random.Random(1)
    churn(storage, rng, 120)
    assert storage.durable is not None
    storage.durable.snapshot()
    churn(storage, rng, 60)  # after the snapshot: only in the metadata log
    storage.durable.flush()
    expected = contents(storage)
    churn(storage, rng, 40, prefix="late")  # never flushed: beyond the RPO
    lose_machine(storage, env)
    with restored(env, tmp_path) as instance:
        assert contents(instance) == expected
        # Chunks written after the RPO are on tier-2 with nothing restored referencing
        # them: exactly those are leaks, and the orphan reconciler collects them.
        leaks = verify_container(instance).problems
        assert leaks and all("/late" in problem and "(leak)" in problem for problem in leaks)
        assert len(reconcile(instance).orphans) == len(leaks)
        env.clock.advance(60)
        while instance.gc.run_once().progressed:
            pass
        assert verify_container(instance).problems == []
        assert instance.epoch > storage.epoch
        churn(instance, rng, 30)  # the restored container is a working one
        instance.durable.flush()
        assert verify_copy(env.binding, 0).problems == []


def test_gc_never_deletes_a_chunk_the_restorable_state_needs(env: Env, tmp_path) -> None:
    storage = env.open(**MANUAL)
    rng = random.Random(2)
    churn(storage, rng, 150)
    env.clock.advance(60)
    churn(storage, rng, 150)  # drops more chunks; none of it flushed yet
    env.clock.advance(60)
    deleted = 0
    while done := storage.gc.run_once().chunks_deleted:
        deleted += done
    assert deleted > 20, "the churn must give GC real work"
    expected = contents(storage)
    lose_machine(storage, env)  # right after heavy GC, without the final flush
    assert_restores(env, tmp_path, expected)


def test_failed_metadata_snapshot_keeps_the_previous_one(env: Env, tmp_path) -> None:
    faulty = FaultyChunkStorage(env.binding)
    env.binding = faulty
    storage = env.open(**MANUAL)
    churn(storage, random.Random(3), 80)
    first = storage.durable.snapshot()
    churn(storage, random.Random(4), 40)
    faulty.partial_write(3)  # piece 1 (data, journal record) lands; the data of piece 2 is torn
    with pytest.raises(StorageUnavailable):
        storage.durable.log.write_snapshot(piece_bytes=512)
    faulty.clear()
    layout = storage.durable.segments.layout(METADATA_SNAPSHOTS)
    assert layout.attrs["sequence"] == first.sequence, "the failed snapshot is never pointed at"
    storage.durable.flush()
    expected = contents(storage)
    lose_machine(storage, env)
    env.binding = faulty.inner
    assert_restores(env, tmp_path, expected)


def test_a_store_older_than_its_copy_is_snapshotted_at_boot(env: Env, tmp_path) -> None:
    plain = env.open(journal=False)
    churn(plain, random.Random(5), 60)
    plain.close()
    storage = env.open(**MANUAL)  # boot: the log cannot hold the past, a snapshot does
    assert storage.durable is not None and storage.durable.statistics().snapshots == 1
    expected = contents(storage)
    lose_machine(storage, env)
    assert_restores(env, tmp_path, expected)


def test_restarts_keep_the_copy_contiguous(env: Env, tmp_path) -> None:
    rng = random.Random(6)
    for _ in range(4):
        storage = env.reopen(**MANUAL)
        churn(storage, rng, 40)
    env.instances[-1].close()  # a clean close flushes
    storage = env.open(**MANUAL)
    expected = contents(storage)
    assert storage.durable.statistics().snapshots == 0, "a clean history needs no snapshot at boot"
    lose_machine(storage, env)
    assert_restores(env, tmp_path, expected)


def test_a_fenced_instance_stops_copying(env: Env, tmp_path) -> None:
    old = env.open(**MANUAL)
    churn(old, random.Random(7), 30)
    new = env.open(**MANUAL)
    churn(new, random.Random(8), 30)
    with pytest.raises(Fenced):
        old.durable.flush()
    with pytest.raises(Fenced):
        old.durable.snapshot()
    new.durable.flush()
    expected = contents(new)
    old.close()
    lose_machine(new, env)
    assert_restores(env, tmp_path, expected)


def test_restore_bad_input_changes_nothing(env: Env, tmp_path) -> None:
    target = fresh_store(env, tmp_path)
    try:
        with pytest.raises(MetadataCorrupted, match="no system journal"):
            restore(env.binding, 0, target)  # nothing on tier-2 yet
        assert target.last_sequence == 0
        storage = env.open(**MANUAL)
        storage.close()
        with pytest.raises(MetadataCorrupted, match="no system journal"):
            restore(env.binding, 7, target)  # another container
        target.commit([])  # not empty any more
        before = target.dump()
        with pytest.raises(InvalidArgument, match="empty metadata store"):
            restore(env.binding, 0, target)
        assert target.dump() == before
    finally:
        target.close()


def test_restore_rebuilds_every_record_with_its_version(env: Env, tmp_path) -> None:
    storage = env.open(**MANUAL)
    rng = random.Random(9)
    churn(storage, rng, 80)
    storage.durable.snapshot()
    churn(storage, rng, 80)  # a long log after the snapshot: restored in batched transactions
    storage.durable.flush()
    source = env.store.dump()
    lose_machine(storage, env)
    target = fresh_store(env, tmp_path)
    try:
        report = restore(env.binding, 0, target)
        restored = target.dump()
        assert report.log_records > 50 and report.sequence > report.snapshot_sequence
        for table, entries in source.items():
            if table != "container":  # restore raises the epoch in a commit of its own
                assert restored[table] == entries, table
    finally:
        target.close()


def test_the_copy_ships_only_what_is_durable_here(env: Env) -> None:
    """Shared syncs let a commit be visible before it is durable: the metadata copy makes
    the store durable before it reads the changes or the snapshot it ships."""
    from slts.metadata.delegating import DelegatingStore

    events: list[str] = []

    class Recording(DelegatingStore):
        def make_durable(self) -> None:
            events.append("make_durable")
            super().make_durable()

        def encoded_changes(self, after: int, limit: int = 1000) -> list:
            events.append("changes")
            return super().encoded_changes(after, limit)

        def snapshot(self):  # type: ignore[no-untyped-def]
            events.append("snapshot")
            return super().snapshot()

    settings = StorageConfig(gc_interval_s=0.0, **MANUAL)  # type: ignore[arg-type]
    with ChunkedSegmentStorage(
        0, None, env.binding, Recording(env.store), settings, clock=env.clock
    ) as storage:
        storage.create("s")
        assert storage.durable is not None
        events.clear()
        storage.durable.flush()
        storage.durable.snapshot()
    reads = [i for i, event in enumerate(events) if event == "changes"]
    assert reads and all(events[i - 1] == "make_durable" for i in reads)
    dumps = [i for i in range(1, len(events)) if events[i] == "snapshot" and events[i - 1] == "make_durable"]
    assert dumps  # the snapshot's consistent view is taken right after a make_durable


def test_a_background_step_ships_what_was_committed_before_it(env: Env) -> None:
    """Under a busy writer, one background step ships the commits made before it began
    and ends: a commit landing during the step waits for the next one (shipping until
    nothing is left would never end and would append to tier-2 every few commits)."""
    from slts.metadata.delegating import DelegatingStore

    class Busy(DelegatingStore):
        during: Callable[[], None] | None = None

        def encoded_changes(self, after: int, limit: int = 1000) -> list:
            result = super().encoded_changes(after, limit)
            if self.during is not None:
                during, self.during = self.during, None
                during()  # a writer commits while the step ships
            return result

    busy = Busy(env.store)
    with copying(env, busy) as (storage, copy):
        storage.create("s")
        handle = storage.open_write("s")
        storage.write(handle, 0, b"a")
        began = busy.last_sequence
        busy.during = lambda: storage.write(handle, 1, b"b")
        flushes = copy.statistics().flushes
        copy.maintain()
        assert busy.during is None, "the writer committed during the step"
        assert copy.durable_sequence == began < busy.last_sequence
        assert copy.statistics().flushes == flushes + 1
        copy.maintain()
        assert copy.durable_sequence == busy.last_sequence


def test_the_log_ships_each_commit_as_encode_change_encodes_it(env: Env) -> None:
    """The log ships a captured change's operations as the store's change log holds them,
    without decoding them into operations and encoding them again: each shipped record is
    byte for byte what ``encode_change`` makes of the same commit."""
    with copying(env, env.store) as (storage, copy):
        copy.flush()
        log = copy.log
        start = log.segments.layout(METADATA_LOG).length
        churn(storage, random.Random(7), 80)
        pending = env.store.changes(log.durable_sequence, limit=100_000)
        assert len(pending) > 80 and pending[0].sequence == log.durable_sequence + 1
        copy.flush()
        assert log.durable_sequence == pending[-1].sequence
        layout = log.segments.layout(METADATA_LOG)
        shipped = b"".join(iter_range(log.segments.binding, layout, start, layout.length))
    assert shipped == b"".join(encode_change(change.sequence, change.ops) for change in pending)


BAD_CAPTURED = {
    "not msgpack": b"\xc1",
    "not a list": msgpack.packb({"a": 1}),
    "an operation of two": msgpack.packb([["segments", b"k"]]),
    "an unknown table": msgpack.packb([["nope", b"k", None]], use_bin_type=True),
    "a key as text": msgpack.packb([["segments", "k", None]], use_bin_type=True),
    "bytes after the list": msgpack.packb([], use_bin_type=True) + b"\xc0",
    "nothing": b"",
}


@pytest.mark.parametrize("check", ["built", "python"])
@pytest.mark.parametrize("bad", sorted(BAD_CAPTURED))
def test_a_malformed_captured_change_is_not_shipped(
    env: Env, bad: str, check: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log checks every change before it ships it (restore must be able to take every
    record): a change-log entry that is not a list of [table, key, value or nil] of the
    store's tables raises ``MetadataCorrupted`` naming the change, and nothing is shipped
    or discarded."""
    from slts.journal import metadata_copy

    from slts.metadata.delegating import DelegatingStore

    if check == "python":
        monkeypatch.setattr(metadata_copy, "check_plain_change", metadata_copy.plain_change_python)
    elif metadata_copy.NATIVE is None:
        pytest.skip("slts.journal._replay is not built (no C compiler at install)")
    damaged: set[int] = set()

    class Damaged(DelegatingStore):
        def encoded_changes(self, after: int, limit: int = 1000) -> list[tuple[int, bytes]]:
            found = super().encoded_changes(after, limit)
            return [(s, BAD_CAPTURED[bad] if s in damaged else raw) for s, raw in found]

    store = Damaged(env.store)
    with copying(env, store) as (storage, copy):
        storage.create("s")
        copy.flush()
        log_length = copy.log.segments.layout(METADATA_LOG).length
        durable = copy.durable_sequence
        handle = storage.open_write("s")
        storage.write(handle, 0, b"a")
        storage.write(handle, 1, b"b")
        damaged.add(store.last_sequence)
        with pytest.raises(MetadataCorrupted, match=f"captured change {store.last_sequence} "):
            copy.log.flush_batch()
        assert copy.durable_sequence == durable
        assert copy.log.segments.layout(METADATA_LOG).length == log_length
        kept = list(range(durable + 1, store.last_sequence + 1))
        assert len(kept) >= 2 and [change.sequence for change in env.store.changes(durable)] == kept
        damaged.clear()  # the entry mended: the copy goes on where it stopped
        copy.flush()
        assert copy.durable_sequence == store.last_sequence
