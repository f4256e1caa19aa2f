"""The HDFS binding's own behaviour against the WebHDFS test server (bindings/hdfs.py).

What the conformance suite cannot see: the two-step redirects, the translation of every
RemoteException class, bounded retries (counted on the server, never timed), lost answers
that must not duplicate a write, the single-writer lease, permissions, the block recovery
a truncate starts, and the engine on top of it (defrag copies: no native concat).
"""

from __future__ import annotations

import threading
import uuid

import pytest

pyhdfs = pytest.importorskip("pyhdfs", reason="pyhdfs is not installed (pip install 'slts[hdfs]')")

from slts.bindings import ConcatSource, from_url
from slts.bindings.hdfs import (
    BACKOFF_S_MAX,
    RECOVERY_ATTEMPTS_MAX,
    HdfsChunkStorage,
    chunk_relpath,
)

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkNotFound,
    ChunkReadOnly,
    ChunkStorageError,
    StorageUnavailable,
    UnsupportedOperation,
)
from tests.support.hdfs import TEST_OPTIONS, TEST_USER
from tests.support.webhdfs_server import SUPERUSER, WebHdfsTestServer

ATTEMPTS = TEST_OPTIONS["max_attempts"]


def delta(server: WebHdfsTestServer, before: dict, role: str, op: str) -> int:
    return server.requests[(role, op)] - before.get((role, op), 0)


def path_of(root: str, name: str) -> str:
    return f"{root}/{chunk_relpath(name)}"


def tmp_files(server: WebHdfsTestServer, root: str) -> list[str]:
    return server.raw_list(f"{root}/%tmp")


# -- the two-step protocol -------------------------------------------------------------------------


def test_create_append_and_read_go_through_the_datanode(storage, server, root):
    before = dict(server.requests)
    handle = storage.create("a/b", b"hello")
    assert delta(server, before, "namenode", "CREATE") == delta(server, before, "datanode", "CREATE") == 1
    assert delta(server, before, "namenode", "RENAME") == 1
    before = dict(server.requests)
    storage.write(handle, 5, b" world")
    assert delta(server, before, "namenode", "APPEND") == delta(server, before, "datanode", "APPEND") == 1
    before = dict(server.requests)
    assert storage.read(handle, 3, 5) == b"lo wo"
    assert delta(server, before, "namenode", "OPEN") == delta(server, before, "datanode", "OPEN") == 1
    assert server.raw_read(path_of(root, "a/b")) == b"hello world"
    assert tmp_files(server, root) == []


def test_creates_ask_the_datanodes_to_sync_the_block(storage, server, root):
    storage.create("c", b"x")
    inode = server.raw_inode(path_of(root, "c"))
    assert inode.sync_block and inode.permission == 0o644 and inode.owner == TEST_USER


def test_reads_at_and_past_the_end(storage, server):
    handle = storage.create("c", b"abc")
    assert storage.read(handle, 3, 10) == b""  # WebHDFS itself would refuse this OPEN
    with pytest.raises(ChunkInvalidOffset):
        storage.read(handle, 4, 1)
    empty = storage.create("e")
    assert storage.read(empty, 0, 5) == b""
    with pytest.raises(ChunkInvalidOffset):
        storage.read(empty, 1, 5)


def test_a_torn_download_is_retried_never_returned_short(storage, server):
    handle = storage.create("c", bytes(range(200)))
    server.inject("OPEN", role="datanode", action="drop_partial")
    before = dict(server.requests)
    assert storage.read(handle, 10, 100) == bytes(range(10, 110))
    assert delta(server, before, "datanode", "OPEN") == 2
    server.inject("OPEN", role="datanode", action="drop_partial", count=ATTEMPTS)
    with pytest.raises(StorageUnavailable):
        storage.read(handle, 10, 100)


# -- RemoteException classes -> typed errors -------------------------------------------------------

MAPPING = [
    ("FileNotFoundException", ChunkNotFound, False),
    ("FileAlreadyExistsException", ChunkExists, False),
    ("AccessControlException", ChunkReadOnly, False),
    ("AlreadyBeingCreatedException", StorageUnavailable, True),
    ("RecoveryInProgressException", StorageUnavailable, True),
    ("LeaseExpiredException", StorageUnavailable, True),
    ("SafeModeException", StorageUnavailable, True),
    ("StandbyException", StorageUnavailable, True),
    ("RetriableException", StorageUnavailable, True),
    ("IOException", StorageUnavailable, True),
    ("PathComponentTooLongException", ChunkNameInvalid, False),
    ("EOFException", ChunkInvalidOffset, False),
    ("NSQuotaExceededException", ChunkStorageError, False),
    ("DSQuotaExceededException", ChunkStorageError, False),
    ("IllegalArgumentException", ChunkStorageError, False),
    ("UnsupportedOperationException", ChunkStorageError, False),
    ("SecurityException", ChunkStorageError, False),
    ("RuntimeException", ChunkStorageError, False),
    ("NullPointerException", ChunkStorageError, False),
]


@pytest.mark.parametrize(("exception", "expected", "retryable"), MAPPING, ids=[m[0] for m in MAPPING])
def test_each_remote_exception_becomes_its_typed_error(storage, server, exception, expected, retryable):
    storage.create("c", b"x")
    server.inject("GETFILESTATUS", exception, f"{exception} injected", count=ATTEMPTS)
    with pytest.raises(ChunkStorageError) as caught:
        storage.get_info("c")
    error = caught.value
    assert type(error) is expected, error
    assert error.retryable is retryable
    assert error.chunk == "c"
    assert isinstance(error.__cause__, pyhdfs.HdfsException)  # the cause is kept...
    assert "pyhdfs" not in type(error).__module__  # ...but nothing of pyhdfs escapes
    server.clear_injections()
    assert storage.get_info("c").length == 1


def test_lease_errors_say_so(storage, server):
    storage.create("c", b"x")
    server.inject("GETFILESTATUS", "AlreadyBeingCreatedException", "lease", count=ATTEMPTS)
    with pytest.raises(StorageUnavailable) as caught:
        storage.get_info("c")
    assert caught.value.lease is True
    assert caught.value.remote_exception == "AlreadyBeingCreatedException"


def test_an_unexpected_answer_is_storage_unavailable(storage, server, monkeypatch):
    storage.create("c", b"x")
    # A proxy in the way answers HTML: pyhdfs cannot decode a RemoteException from it.
    monkeypatch.setattr(
        server,
        "namenode",
        lambda *args: (502, b"<html>Bad Gateway</html>", {"Content-Type": "text/html"}),
    )
    with pytest.raises(StorageUnavailable) as caught:
        storage.get_info("c")
    assert "unexpected answer" in str(caught.value)


@pytest.mark.parametrize(
    "body", [b'{"FileStatus": {}}', b'{"FileStatus": {"type": "FILE", "length": "x"}}', b"{}"]
)
def test_a_malformed_answer_is_storage_unavailable(storage, server, monkeypatch, body):
    storage.create("c", b"x")
    monkeypatch.setattr(server, "namenode", lambda *args: (200, body, {"Content-Type": "application/json"}))
    with pytest.raises(StorageUnavailable) as caught:
        storage.get_info("c")
    assert "malformed WebHDFS answer" in str(caught.value) or "unexpected answer" in str(caught.value)


# -- bounded retries -------------------------------------------------------------------------------


def test_transient_errors_are_retried_up_to_max_attempts(storage, server):
    storage.create("c", b"x")
    server.inject("GETFILESTATUS", "SafeModeException", "starting", count=ATTEMPTS - 1)
    before = dict(server.requests)
    assert storage.get_info("c").length == 1
    assert delta(server, before, "namenode", "GETFILESTATUS") == ATTEMPTS
    server.inject("GETFILESTATUS", "SafeModeException", "starting", count=ATTEMPTS + 5)
    before = dict(server.requests)
    with pytest.raises(StorageUnavailable):
        storage.get_info("c")
    assert delta(server, before, "namenode", "GETFILESTATUS") == ATTEMPTS  # and not one more


def test_permanent_errors_are_not_retried(storage, server):
    storage.create("c", b"x")
    server.inject("GETFILESTATUS", "NSQuotaExceededException", "quota", count=ATTEMPTS)
    before = dict(server.requests)
    with pytest.raises(ChunkStorageError):
        storage.get_info("c")
    assert delta(server, before, "namenode", "GETFILESTATUS") == 1


def test_backoff_doubles_up_to_its_cap_with_jitter(server, root):
    sleeps: list[float] = []
    storage = HdfsChunkStorage(
        [server.namenode_address],
        root,
        user=TEST_USER,
        max_attempts=6,
        backoff_s=0.5,
        sleep=sleeps.append,
    )
    storage.create("c", b"x")
    server.inject("GETFILESTATUS", "StandbyException", "failing over", count=6)
    with pytest.raises(StorageUnavailable):
        storage.get_info("c")
    exponential = [0.5, 1.0, BACKOFF_S_MAX, BACKOFF_S_MAX, BACKOFF_S_MAX]
    assert len(sleeps) == len(exponential)
    for sleep_s, delay_s in zip(sleeps, exponential, strict=True):
        assert delay_s / 2 <= sleep_s <= delay_s  # the policy's jitter draws from [50 %, 100 %]
    storage.close()


def test_safe_mode_fails_creates_after_the_bounded_retries(storage, server, root):
    server.safe_mode = True
    before = dict(server.requests)
    with pytest.raises(StorageUnavailable) as caught:
        storage.create("c", b"x")
    assert caught.value.remote_exception == "SafeModeException"
    assert delta(server, before, "datanode", "CREATE") == ATTEMPTS
    server.safe_mode = False
    assert not storage.exists("c")
    storage.create("c", b"x")
    assert tmp_files(server, root) == []


def test_a_stopped_server_is_storage_unavailable(own_server):
    storage = HdfsChunkStorage.from_url(own_server.url("/r", **TEST_OPTIONS))
    storage.create("c", b"x")
    own_server.stop()
    with pytest.raises(StorageUnavailable) as caught:
        storage.get_info("c")
    assert caught.value.retryable
    with pytest.raises(StorageUnavailable):
        HdfsChunkStorage.from_url(storage.url)
    storage.close()


def test_a_standby_namenode_is_passed_over(server, root):
    standby = server.add_standby_namenode()
    url = f"hdfs://{standby},{server.namenode_address}{root}?user={TEST_USER}&backoff_s=0"
    before = dict(server.requests)
    storage = from_url(url)
    storage.create("c", b"x")
    assert storage.read(storage.open_read("c"), 0, 1) == b"x"
    assert delta(server, before, "standby", "MKDIRS") >= 1  # it was asked first, and refused
    storage.close()


def test_only_standby_namenodes_is_storage_unavailable(storage, server):
    storage.create("c", b"x")
    server.standby = True
    with pytest.raises(StorageUnavailable) as caught:
        storage.get_info("c")
    assert "no NameNode answered" in str(caught.value)


# -- lost answers: nothing twice -------------------------------------------------------------------


def test_an_append_whose_answer_was_lost_is_not_written_twice(storage, server, root):
    handle = storage.create("c", b"head")
    injection = server.inject("APPEND", role="datanode", action="drop_after")
    assert storage.write(handle, 4, b"-tail") == 5
    assert injection.hits == 1
    assert server.raw_read(path_of(root, "c")) == b"head-tail"


def test_an_append_that_never_arrived_is_sent_again(storage, server, root):
    handle = storage.create("c", b"head")
    injection = server.inject("APPEND", role="datanode", action="drop_before")
    assert storage.write(handle, 4, b"-tail") == 5
    assert injection.hits == 1
    assert server.raw_read(path_of(root, "c")) == b"head-tail"


def test_a_partly_written_append_is_reported_not_completed(storage, server, root):
    handle = storage.create("c", b"head")
    server.inject("APPEND", role="datanode", action="drop_partial")
    with pytest.raises(StorageUnavailable) as caught:
        storage.write(handle, 4, b"-tail")
    assert "is not this write's" in str(caught.value)
    # The chunk holds a torn tail the engine never adopts (DESIGN.md §5: lengths come from
    # metadata); a write at the old end is refused, nothing is appended after the tear.
    assert server.raw_read(path_of(root, "c")) == b"head-t"
    with pytest.raises(ChunkInvalidOffset):
        storage.write(handle, 4, b"-tail")


def test_a_rename_whose_answer_was_lost_still_creates_once(storage, server, root):
    injection = server.inject("RENAME", action="drop_after")
    storage.create("c", b"data")
    assert injection.hits == 1
    assert server.raw_read(path_of(root, "c")) == b"data"
    assert tmp_files(server, root) == []
    with pytest.raises(ChunkExists):
        storage.create("c", b"other")


def test_a_create_of_a_taken_name_leaves_no_temporary_file(storage, server, root):
    storage.create("c", b"one")
    with pytest.raises(ChunkExists):
        storage.create("c", b"two")
    assert tmp_files(server, root) == []
    assert server.raw_read(path_of(root, "c")) == b"one"


def test_a_delete_whose_answer_was_lost_succeeds(storage, server, root):
    handle = storage.create("c", b"x")
    server.inject("DELETE", action="drop_after", path=path_of(root, "c"))
    storage.delete(handle)
    assert not server.raw_exists(path_of(root, "c"))
    with pytest.raises(ChunkNotFound):
        storage.delete(handle)


def test_delete_prunes_empty_folders_but_not_the_root(storage, server, root):
    storage.create("a/b/c", b"1")
    storage.create("a/z", b"2")
    storage.delete(storage.open_read("a/b/c"))
    assert server.raw_list(root) == ["%tmp", "a%"]
    assert server.raw_list(f"{root}/a%") == ["z"]
    storage.delete(storage.open_read("a/z"))
    assert server.raw_list(root) == ["%tmp"]


def test_a_create_whose_folder_is_pruned_before_the_rename_makes_it_again(storage, server, root, monkeypatch):
    storage.create("a/keep", b"k")
    storage.delete(storage.open_read("a/keep"))
    real_mkdirs = storage._hdfs.mkdirs
    pruned: list[str] = []

    def mkdirs_then_pruned(path: str) -> None:
        real_mkdirs(path)
        if not pruned:  # a delete in another process empties and prunes the folder now
            pruned.append(path)
            server.raw_delete(path)

    monkeypatch.setattr(storage._hdfs, "mkdirs", mkdirs_then_pruned)
    before = dict(server.requests)
    storage.create("a/c", b"x")
    assert pruned == [f"{root}/a%"]
    assert delta(server, before, "namenode", "RENAME") == 2  # refused once, for want of a folder
    assert server.raw_read(path_of(root, "a/c")) == b"x"
    assert tmp_files(server, root) == []


# -- the single-writer lease -----------------------------------------------------------------------


def test_another_writer_holding_the_lease_fails_the_append_after_bounded_retries(make_storage, server, root):
    # Two instances, as two processes: the per-name lock of one does not order the other.
    first, second = make_storage(), make_storage()
    handle = first.create("c", b"head")
    outcome: list[object] = []
    with server.pause_writes(path_of(root, "c")) as pause:
        writer = threading.Thread(target=lambda: outcome.append(first.write(handle, 4, b"-first")))
        writer.start()
        assert pause.lease_taken.wait(30), "the first append never took the lease"
        before = dict(server.requests)
        with pytest.raises(StorageUnavailable) as caught:
            second.write(second.open_write("c"), 4, b"-second")
        assert caught.value.lease is True
        assert caught.value.remote_exception == "AlreadyBeingCreatedException"
        assert delta(server, before, "datanode", "APPEND") == ATTEMPTS
        pause.release.set()
        writer.join(30)
    assert outcome == [6]
    assert server.raw_read(path_of(root, "c")) == b"head-first"
    # With the lease free again, the stale offset is what stops the second writer.
    with pytest.raises(ChunkInvalidOffset):
        second.write(second.open_write("c"), 4, b"-second")


def test_a_lease_released_meanwhile_lets_the_retry_through(storage, server, root):
    handle = storage.create("c", b"head")
    server.inject("APPEND", "AlreadyBeingCreatedException", "owned by DFSClient_X", role="datanode", count=2)
    assert storage.write(handle, 4, b"-tail") == 5
    assert server.raw_read(path_of(root, "c")) == b"head-tail"


# -- permissions and read-only ---------------------------------------------------------------------


def test_read_only_is_enforced_even_for_the_superuser(make_storage, server, root):
    storage = make_storage(user=SUPERUSER)  # HDFS itself would let this user write
    handle = storage.create("c", b"data")
    storage.set_readonly(handle, True)
    assert server.raw_status(path_of(root, "c"))["permission"] == "444"
    with pytest.raises(ChunkReadOnly):
        storage.write(handle, 4, b"x")
    with pytest.raises(ChunkReadOnly):
        storage.truncate(handle, 0)
    with pytest.raises(ChunkReadOnly):
        storage.open_write("c")
    assert server.raw_read(path_of(root, "c")) == b"data"
    storage.set_readonly(handle, False)
    assert server.raw_status(path_of(root, "c"))["permission"] == "644"


def test_hdfs_permission_denied_becomes_chunk_read_only(storage, server, root):
    storage.create("keep", b"k")
    server.raw_mkdirs(f"{root}/theirs%", owner="other", permission=0o755)
    with pytest.raises(ChunkReadOnly) as caught:
        storage.create("theirs/c", b"x")
    assert caught.value.remote_exception == "AccessControlException"
    assert isinstance(caught.value, PermissionError)
    assert tmp_files(server, root) == []
    assert list(storage.list()) == ["keep"]


# -- truncate and block recovery -------------------------------------------------------------------


def test_truncate_inside_a_block_waits_for_the_recovery(own_server):
    own_server.truncate_recovery_ops = 3
    storage = HdfsChunkStorage.from_url(own_server.url("/r", **TEST_OPTIONS))
    handle = storage.create("c", b"0123456789")
    before = dict(own_server.requests)
    storage.truncate(handle, 4)
    assert delta(own_server, before, "namenode", "TRUNCATE") == 1
    # Probed with empty appends: three refused (RecoveryInProgressException), one through.
    assert delta(own_server, before, "datanode", "APPEND") == 4
    before = dict(own_server.requests)
    storage.write(handle, 4, b"x")  # appendable at once
    assert delta(own_server, before, "datanode", "APPEND") == 1
    assert own_server.raw_read("/r/c") == b"0123x"
    storage.close()


def test_truncate_on_a_block_boundary_needs_no_recovery(own_server):
    own_server.block_size = 16
    storage = HdfsChunkStorage.from_url(own_server.url("/r", **TEST_OPTIONS))
    handle = storage.create("c", bytes(40))
    before = dict(own_server.requests)
    storage.truncate(handle, 32)
    storage.truncate(handle, 0)
    assert delta(own_server, before, "datanode", "APPEND") == 0
    assert storage.get_info("c").length == 0
    storage.close()


def test_a_recovery_that_does_not_end_is_reported(own_server):
    own_server.truncate_recovery_ops = 10**6
    storage = HdfsChunkStorage.from_url(own_server.url("/r", **TEST_OPTIONS))
    handle = storage.create("c", b"0123456789")
    before = dict(own_server.requests)
    with pytest.raises(StorageUnavailable) as caught:
        storage.truncate(handle, 4)
    assert "block recovery" in str(caught.value)
    assert delta(own_server, before, "datanode", "APPEND") == RECOVERY_ATTEMPTS_MAX
    assert storage.get_info("c").length == 4  # the truncate itself took effect
    own_server.finish_recoveries()
    storage.truncate(handle, 4)  # idempotent: the chunk already has that length
    storage.close()


def test_a_truncate_racing_a_shrink_is_chunk_invalid_offset(storage, server, root):
    handle = storage.create("c", b"0123456789")
    # The chunk shrinks between the binding's length check and its TRUNCATE.
    server.inject("TRUNCATE", "HadoopIllegalArgumentException", "Cannot truncate to a larger file size.")
    with pytest.raises(ChunkInvalidOffset):
        storage.truncate(handle, 8)


# -- no native concat: the engine copies -----------------------------------------------------------


def test_concat_is_not_offered(storage):
    storage.create("a", b"x")
    assert storage.supports_concat is False
    with pytest.raises(UnsupportedOperation):
        storage.concat("t", [ConcatSource("a", 0, 1)])
    assert list(storage.list()) == ["a"]


def test_the_engine_runs_on_hdfs_and_defrag_copies(server, tmp_path):
    import slts

    url = server.url(f"/engine/{uuid.uuid4().hex}", **TEST_OPTIONS)
    metadata = str(tmp_path / "metadata")
    settings = {"defrag_small_chunk_bytes": 32, "defrag_run_bytes_max": 100}
    data = bytes(range(100))
    for epoch, offset in enumerate(range(0, len(data), 10)):
        # Every restart is a new epoch, which starts a new chunk: ten small chunks.
        storage = slts.open(url, metadata=metadata, **settings)
        if epoch == 0:
            storage.create("s", max_rolling_length=1000)
        handle = storage.open_write("s")
        storage.write(handle, offset, data[offset : offset + 4])
        storage.write(handle, offset + 4, data[offset + 4 : offset + 10])  # an append
        storage.close()
    storage = slts.open(url, metadata=metadata, **settings)
    storage.seal(storage.open_write("s"))
    assert storage.info("s").chunk_count == 10
    result = storage.defrag("s")
    assert result.runs_committed == 1 and result.chunks_after == 1
    assert result.bytes_native == 0 and result.bytes_copied == len(data)  # no native concat
    assert storage.read(storage.open_read("s"), 0, len(data)) == data
    storage.close()
    reopened = slts.open(url, metadata=metadata)
    assert reopened.read(reopened.open_read("s"), 0, len(data)) == data
    reopened.close()


def test_a_sequential_reader_on_hdfs_is_served_by_read_ahead(server, tmp_path):
    """Every HDFS read is two round trips (NameNode, DataNode): the engine reads ahead
    by default, and a reader going front to back gets exactly the bytes written."""
    import slts

    url = server.url(f"/engine/{uuid.uuid4().hex}", **TEST_OPTIONS)
    settings = {"read_ahead_bytes": 64 << 10, "read_ahead_part_bytes": 8 << 10}
    data = bytes(i % 253 for i in range(96 << 10))
    with slts.open(url, metadata=str(tmp_path / "metadata"), **settings) as storage:
        storage.create("s", max_rolling_length=32 << 10)  # three chunks
        storage.write(storage.open_write("s"), 0, data)
        reader = storage.open_read("s")
        got = b"".join(storage.read(reader, offset, 4 << 10) for offset in range(0, len(data), 4 << 10))
        statistics = storage.read_ahead_statistics()
    assert got == data
    assert statistics is not None and statistics.hits > 0 and statistics.failures == 0
