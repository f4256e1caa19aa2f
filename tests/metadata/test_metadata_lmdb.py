"""LMDB store specifics: layout, persistence, map growth, fork rule, processes, durability,
group commit."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import pytest

from slts.errors import InvalidArgument, MetadataCorrupted, MetadataError, VersionConflict
from slts.metadata import CachedMetadataStore, Delete, Expect, LmdbMetadataStore, Put, Versioned
from slts.metadata.lmdb_store import INTERNAL_DB, SEQUENCE_KEY

TABLES = ("segments", "chunks", "index")
CHILD = str(Path(__file__).with_name("metadata_child.py"))


def run_child(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, CHILD, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


# -- layout ----------------------------------------------------------------------------------


def test_layout_sub_databases_and_value_framing(lmdb_path: str) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        sequence = store.commit([Put("chunks", b"c1", b"payload"), Put("segments", b"s", b"")])
    # Raw access, bypassing the store (it is closed, so LMDB allows opening the files).
    with lmdb.open(lmdb_path, max_dbs=16, readonly=True) as env:
        with env.begin() as txn:
            names = {key for key, _ in txn.cursor()}
        assert {b"segments", b"chunks", b"index", INTERNAL_DB} <= names
        chunks, internal = (
            env.open_db(b"chunks", create=False),
            env.open_db(INTERNAL_DB, create=False),
        )
        with env.begin() as txn:
            assert txn.get(b"c1", db=chunks) == struct.pack(">Q", sequence) + b"payload"
            assert txn.get(SEQUENCE_KEY, db=internal) == struct.pack(">Q", sequence)


def test_corrupted_value_is_reported(lmdb_path: str) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        store.commit([Put("chunks", b"c1", b"payload")])
    with lmdb.open(lmdb_path, max_dbs=16) as env:
        chunks = env.open_db(b"chunks", create=False)
        with env.begin(write=True) as txn:
            txn.put(b"c1", b"abc", db=chunks)  # shorter than the version header
            txn.put(b"c2", bytes(8) + b"x", db=chunks)  # version 0
            txn.put(b"c3", b"", db=chunks)  # empty: not "absent"
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        with pytest.raises(MetadataCorrupted):
            store.get("chunks", b"c1")
        with pytest.raises(MetadataCorrupted):
            store.scan("chunks", b"c2")
        with pytest.raises(MetadataCorrupted):
            store.commit([Put("chunks", b"c1", b"x")], [Expect("chunks", b"c1", 1)])
        with pytest.raises(MetadataCorrupted):
            store.commit([Put("chunks", b"c3", b"x")], [Expect("chunks", b"c3", 0)])
        assert store.commit([Put("chunks", b"c1", b"repaired")]) == 2  # blind writes still work
        assert store.get("chunks", b"c1") == Versioned(2, b"repaired")


# -- handles, options, life cycle -------------------------------------------------------------


def test_handles_in_one_process_share_the_environment(lmdb_path: str) -> None:
    first = LmdbMetadataStore(lmdb_path, TABLES)
    second = LmdbMetadataStore(lmdb_path, ("segments", "extra"))  # more tables later is fine
    sequence = second.commit([Put("extra", b"k", b"v"), Put("segments", b"s", b"1")])
    assert first.get("segments", b"s") == Versioned(sequence, b"1")
    with pytest.raises(InvalidArgument):
        first.get("extra", b"k")  # a handle only knows its own tables
    first.close()
    assert second.get("extra", b"k") == Versioned(sequence, b"v")  # still open
    second.close()
    with LmdbMetadataStore(lmdb_path, TABLES) as third:  # every handle closed: reopen works
        assert third.last_sequence == sequence


def test_durable_flag_must_match_within_a_process(lmdb_path: str) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES, durable=True), pytest.raises(InvalidArgument):
        LmdbMetadataStore(lmdb_path, TABLES, durable=False)


def test_readonly(lmdb_path: str) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES) as writer:
        sequence = writer.commit([Put("segments", b"s", b"v")])
        with LmdbMetadataStore(lmdb_path, TABLES, readonly=True) as shared_reader:
            assert shared_reader.get("segments", b"s") == Versioned(sequence, b"v")
            with pytest.raises(InvalidArgument):
                shared_reader.commit([Delete("segments", b"s")])
    with LmdbMetadataStore(lmdb_path, (*TABLES, "never-created"), readonly=True) as reader:
        assert reader.get("segments", b"s") == Versioned(sequence, b"v")
        assert reader.scan("never-created") == [] and reader.get("never-created", b"s") is None
        assert reader.last_sequence == sequence
        with pytest.raises(InvalidArgument):
            reader.commit([Delete("segments", b"s")])
        with pytest.raises(InvalidArgument):
            LmdbMetadataStore(lmdb_path, TABLES)  # already open read-only here


def test_readonly_on_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        LmdbMetadataStore(str(tmp_path / "absent"), TABLES, readonly=True)


# -- map growth -------------------------------------------------------------------------------


def test_map_grows_instead_of_failing(lmdb_path: str) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES, map_size_bytes=64 << 10, durable=False) as store:
        initial = store.map_size_bytes
        errors: list[BaseException] = []

        def writer(thread: int) -> None:
            try:
                for index in range(40):
                    store.commit([Put("chunks", b"%d/%03d" % (thread, index), bytes([thread]) * 20_000)])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(thread,)) for thread in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        assert store.map_size_bytes > initial
        entries = store.scan("chunks", limit=1000)
        assert len(entries) == 160
        assert all(value.value == bytes([int(key.split(b"/")[0])]) * 20_000 for key, value in entries)


def test_map_grown_by_another_process_is_adopted(lmdb_path: str) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES, map_size_bytes=64 << 10) as store:
        store.commit([Put("segments", b"before", b"1")])
        initial = store.map_size_bytes
        grown = int(run_child("grow", lmdb_path, "100", "30000"))
        assert grown > initial
        assert len(store.scan("chunks", limit=1000)) == 100  # reading adopts the new size
        sequence = store.commit([Put("segments", b"after", b"2")])
        assert sequence == 102
        assert store.map_size_bytes >= grown


# -- processes --------------------------------------------------------------------------------


def test_another_process_commits_and_the_cache_sees_it(lmdb_path: str) -> None:
    plain = LmdbMetadataStore(lmdb_path, TABLES)
    cached = CachedMetadataStore(LmdbMetadataStore(lmdb_path, TABLES), capacity=16)
    try:
        first = cached.commit([Put("segments", b"k", b"parent")], [Expect("segments", b"k", 0)])
        assert cached.get("segments", b"k") == Versioned(first, b"parent")  # cached now
        child_sequence = int(run_child("commit", lmdb_path, "k", "child", str(first)))
        assert child_sequence == first + 1
        assert plain.get("segments", b"k") == Versioned(child_sequence, b"child")
        fresh = cached.get("segments", b"k")  # the cache noticed a commit it did not make
        with pytest.raises(VersionConflict):  # and a stale expectation still fails
            cached.commit([Put("segments", b"k", b"parent-2")], [Expect("segments", b"k", first)])
        assert fresh == Versioned(child_sequence, b"child")
        final = cached.commit([Put("segments", b"k", b"parent-2")], [Expect("segments", b"k", fresh.version)])
        assert plain.get("segments", b"k") == Versioned(final, b"parent-2")
        # And the child's own expectation can fail the same way.
        failed = subprocess.run(
            [sys.executable, CHILD, "commit", lmdb_path, "k", "late", str(first)],
            capture_output=True,
            text=True,
        )
        assert failed.returncode != 0 and "VersionConflict" in failed.stderr
    finally:
        plain.close()
        cached.close()


def _child_after_fork(store: LmdbMetadataStore, lmdb_path: str) -> int:
    """Runs in a forked child: 0 if the store refused every use, a bit mask otherwise."""
    code = 0
    try:
        try:
            store.get("segments", b"k")
            code |= 1
        except MetadataError as exc:
            code |= 0 if "fork" in str(exc) else 2
        try:
            LmdbMetadataStore(lmdb_path, TABLES)
            code |= 4
        except MetadataError as exc:
            code |= 0 if "fork" in str(exc) else 8
        store.close()  # allowed: marks the child's copy closed, touches nothing
    except BaseException:
        code |= 16
    return code


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_use_after_fork_is_refused(lmdb_path: str) -> None:
    store = LmdbMetadataStore(lmdb_path, TABLES)
    store.commit([Put("segments", b"k", b"v")])
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only, never return into pytest
        os._exit(_child_after_fork(store, lmdb_path))
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.get("segments", b"k").value == b"v"  # the parent's store is unharmed
    assert store.commit([Delete("segments", b"k")]) == 2
    store.close()


def test_acknowledged_commits_survive_sigkill(lmdb_path: str) -> None:
    """A child prints each sequence after commit() returned and is SIGKILLed at a random
    point; every printed commit is there after reopening (process crash, not power loss)."""
    rng = random.Random(20240611)
    acknowledged: dict[bytes, int] = {}
    for round_number in range(3):
        prefix = f"round{round_number}/"
        kill_after = rng.randint(20, 600)
        child = subprocess.Popen(
            [sys.executable, CHILD, "loop", lmdb_path, "100000", prefix],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None

        def acknowledge(line: str, prefix: str = prefix) -> None:
            index, sequence = map(int, line.split())
            acknowledged[prefix.encode() + b"%06d" % index] = sequence

        for _ in range(kill_after):
            acknowledge(child.stdout.readline())
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=60)
        for line in rest.split("\n")[:-1]:  # complete lines were printed before the kill
            acknowledge(line)
        assert child.returncode == -signal.SIGKILL
        with LmdbMetadataStore(lmdb_path, TABLES) as store:
            for key, sequence in acknowledged.items():
                value = store.get("segments", key)
                assert value is not None and value.version == sequence, key
            assert store.last_sequence >= max(acknowledged.values())
    assert len(acknowledged) >= 60
    assert len(set(acknowledged.values())) == len(acknowledged)


# -- group commit -----------------------------------------------------------------------------


def test_eight_threads_commit_exactly_once(lmdb_path: str) -> None:
    threads_count, per_thread = 8, 60
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        store.commit([Put("index", b"counter", b"0")])
        results: dict[int, list[int]] = {}
        conflicts = [0] * threads_count
        errors: list[BaseException] = []
        start = threading.Barrier(threads_count)

        def worker(thread: int) -> None:
            try:
                start.wait()
                mine = results.setdefault(thread, [])
                for index in range(per_thread):
                    # A blind insert and a contended read-modify-write of one shared counter.
                    mine.append(store.commit([Put("segments", b"%d/%03d" % (thread, index), b"x")]))
                    while True:
                        current = store.get("index", b"counter")
                        assert current is not None
                        try:
                            store.commit(
                                [Put("index", b"counter", b"%d" % (int(current.value) + 1))],
                                [Expect("index", b"counter", current.version)],
                            )
                            break
                        except VersionConflict:
                            conflicts[thread] += 1
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(thread,)) for thread in range(threads_count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        total = threads_count * per_thread
        assert int(store.get("index", b"counter").value) == total  # every increment exactly once
        inserted = sorted(sequence for mine in results.values() for sequence in mine)
        assert len(set(inserted)) == total  # every commit got its own sequence
        for thread, mine in results.items():
            assert mine == sorted(mine)  # one thread's commits are ordered
            for index, sequence in enumerate(mine):
                assert store.get("segments", b"%d/%03d" % (thread, index)) == Versioned(sequence, b"x")
        stats = store.statistics()
        assert stats.commits == 1 + 2 * total
        assert stats.conflicts == sum(conflicts)
        assert store.last_sequence == 1 + 2 * total  # conflicts took no sequence
        assert 1 <= stats.group_commits <= stats.commits


# -- shared syncs (metasync off; GroupCommitter's sync) ---------------------------------------


class _SyncSpy:
    """Stands in for one store's ``lmdb.Environment``: every call but ``sync`` goes to the
    real one; ``sync`` is counted, then passed on, or fails with ``error``."""

    def __init__(
        self, store: LmdbMetadataStore, monkeypatch: pytest.MonkeyPatch, error: Exception | None = None
    ):
        self.calls = 0
        self.real = store._env.env
        self.error = error
        monkeypatch.setattr(store._env, "env", self)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def sync(self, force: bool = False) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error
        self.real.sync(force)


def test_a_lone_durable_commit_syncs_before_it_returns(
    lmdb_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        syncs = _SyncSpy(store, monkeypatch)
        store.commit([Put("segments", b"s", b"1")])
        assert syncs.calls == 1  # its meta page: the commit's own data sync does not cover it
        store.make_durable()
        assert syncs.calls == 2


def test_queued_commits_share_the_next_groups_sync(lmdb_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.metadata.test_metadata_group_commit import SignallingQueue

    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        syncs = _SyncSpy(store, monkeypatch)
        committer = store._env.committer
        queue = SignallingQueue(want=3)
        committer._queue = queue
        real_run = store._env._run_group
        runs = 0

        def held_run(group):  # the first group waits inside until the other three are queued
            nonlocal runs
            runs += 1
            if runs == 1:
                assert queue.ready.wait(30)
            return real_run(group)

        monkeypatch.setattr(committer, "_run_group", held_run)
        threads = [
            threading.Thread(target=store.commit, args=([Put("segments", b"k%d" % i, b"v")],))
            for i in range(4)
        ]
        threads[0].start()
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert runs == 2 and committer.groups == 2
        assert syncs.calls == 1  # the second group's data sync made the first durable
        assert store.last_sequence == 4


def test_a_failed_sync_breaks_the_store_for_commits(lmdb_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with LmdbMetadataStore(lmdb_path, TABLES) as store:
        spy = _SyncSpy(store, monkeypatch, lmdb.Error("fdatasync: EIO"))
        with pytest.raises(MetadataError, match="sync failed"):
            store.commit([Put("segments", b"s", b"1")])
        spy.error = None  # the disk is back
        with pytest.raises(MetadataError, match="sync failed"):  # no later commit is trusted
            store.commit([Put("segments", b"t", b"1")])
