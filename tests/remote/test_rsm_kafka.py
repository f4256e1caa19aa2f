"""The remote storage manager against Kafka's RSM contract: the cases of Kafka's
``LocalTieredStorageTest`` (storage/src/test/.../remote/storage), ported, and the rest of
what ``RemoteStorageManager``'s javadoc asks (idempotent copy and delete, ranged fetch,
not-found errors), on the filesystem binding and on S3 (SeaweedFS).

Kafka's test segments hold one batch (or none) and index files of made-up bytes: the RSM
treats every file as opaque bytes. One difference: Kafka's test metadata claims 1024
bytes for any log; SLTS copies exactly ``size_bytes`` of the log (what the remote log
manager inspected), so the metadata here carries the file's true size.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from pathlib import Path

import pytest
from slts.bindings.faulty import FaultyChunkStorage
from slts.tools.kafka_logs import decode_records, make_batch

from slts.errors import (
    ChunkNotFound,
    InvalidArgument,
    InvalidLogSegment,
    InvalidOffset,
    RemoteSegmentNotFound,
    SegmentNotFound,
    StorageUnavailable,
)
from slts.remote.records import RemoteLogSegmentMetadata, TopicPartition, new_segment_metadata
from slts.remote.rsm import LOG, IndexType, LogSegmentData, RemoteStorageManager
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, env_fixture
from tests.support.faults import faulty_owner

env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])
TP = TopicPartition("my-topic", 1)

# Kafka's LocalLogSegments: made-up bytes for every file beside the log.
OFFSET_FILE_BYTES = b"offset"
TIME_FILE_BYTES = b"time"
TXN_FILE_BYTES = b"txn"
PRODUCER_SNAPSHOT_FILE_BYTES = b"pid"
LEADER_EPOCH_CHECKPOINT_FILE_BYTES = b"0\n2\n0 0\n2 12"
EXPECTED_INDEXES = {
    IndexType.OFFSET: OFFSET_FILE_BYTES,
    IndexType.TIMESTAMP: TIME_FILE_BYTES,
    IndexType.TRANSACTION: TXN_FILE_BYTES,
    IndexType.PRODUCER_SNAPSHOT: PRODUCER_SNAPSHOT_FILE_BYTES,
    IndexType.LEADER_EPOCH: LEADER_EPOCH_CHECKPOINT_FILE_BYTES,
}
ALL_FILES = [LOG, *(kind.value for kind in IndexType)]


class LocalLogSegments:
    """Kafka's test helper: the next segment's files in a folder, its log one batch of
    ``values`` (one record each) from the next base offset, or empty without values."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.base_offset = 0

    def next_segment(self, *values: bytes) -> tuple[LogSegmentData, bytes]:
        stem = self.folder / f"{self.base_offset:020d}"
        log = make_batch(self.base_offset, [(None, v, 1_700_000_000_000) for v in values]) if values else b""
        files = {
            ".log": log,
            ".index": OFFSET_FILE_BYTES,
            ".timeindex": TIME_FILE_BYTES,
            ".txnindex": TXN_FILE_BYTES,
            ".snapshot": PRODUCER_SNAPSHOT_FILE_BYTES,
        }
        for suffix, content in files.items():
            Path(f"{stem}{suffix}").write_bytes(content)
        self.base_offset += len(values)
        data = LogSegmentData(
            log=f"{stem}.log",
            offset_index=f"{stem}.index",
            time_index=f"{stem}.timeindex",
            leader_epoch_checkpoint=LEADER_EPOCH_CHECKPOINT_FILE_BYTES,
            transaction_index=f"{stem}.txnindex",
            producer_snapshot=f"{stem}.snapshot",
        )
        return data, log


def metadata_for(log: bytes, segment_id: uuid.UUID | None = None) -> RemoteLogSegmentMetadata:
    """Kafka's test metadata (offsets 0..0, epoch 0), sized as the log."""
    return new_segment_metadata(
        TP,
        start_offset=0,
        end_offset=0,
        leader_epochs={0: 0},
        max_timestamp_ms=-1,
        size_bytes=len(log),
        broker_id=1,
        segment_id=segment_id,
    )


@pytest.fixture
def segments(tmp_path: Path) -> LocalLogSegments:
    return LocalLogSegments(tmp_path / "local-segments")


@pytest.fixture
def rsm(env: Env) -> RemoteStorageManager:
    return RemoteStorageManager(env.open())


def remote_files(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> list[str]:
    return sorted(name.rsplit("/", 1)[-1] for name in rsm.copied_names(metadata))


def stored_log(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata) -> bytes:
    """The remote log's bytes, read from the store directly (not through a fetch)."""
    storage = rsm.storage
    name = rsm.segment_name(metadata)
    length = storage.info(name).length
    return storage.read(storage.open_read(name), 0, length) if length else b""


def fetched(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, *positions: int | None) -> bytes:
    with rsm.fetch_log(metadata, *positions) as stream:  # type: ignore[arg-type]
        return stream.read()


# --- LocalTieredStorageTest, ported --------------------------------------------------------


def test_copy_empty_log_segment(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    data, log = segments.next_segment()
    metadata = metadata_for(log)
    assert rsm.copy_log_segment(metadata, data) is None
    assert remote_files(rsm, metadata) == sorted(ALL_FILES)
    assert fetched(rsm, metadata, 0) == b""


def test_copy_data_from_log_segment(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    data, log = segments.next_segment(bytes([0, 1, 2]))
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    assert stored_log(rsm, metadata) == Path(data.log).read_bytes() == log


def test_fetch_log_segment(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    data, log = segments.next_segment(bytes([0, 1, 2]))
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    records = decode_records(fetched(rsm, metadata, 0))
    assert records[0][2] == bytes([0, 1, 2])


@pytest.mark.parametrize("index_type", list(IndexType), ids=lambda kind: kind.name)
def test_fetch_index(rsm: RemoteStorageManager, segments: LocalLogSegments, index_type: IndexType) -> None:
    """fetchOffsetIndex, fetchTimeIndex, fetchTransactionIndex, fetchLeaderEpochCheckpoint,
    fetchProducerSnapshot: each file comes back exactly as given."""
    data, log = segments.next_segment()
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    assert rsm.fetch_index(metadata, index_type) == EXPECTED_INDEXES[index_type]


def test_delete_log_segment(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    data, log = segments.next_segment()
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    assert remote_files(rsm, metadata) == sorted(ALL_FILES)
    rsm.delete_log_segment(metadata)
    assert remote_files(rsm, metadata) == []


def test_delete_log_segment_without_optional_files(
    rsm: RemoteStorageManager, segments: LocalLogSegments
) -> None:
    data, log = segments.next_segment()
    os.unlink(data.transaction_index)  # type: ignore[arg-type]
    data = dataclasses.replace(data, transaction_index=None)
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    assert remote_files(rsm, metadata) == sorted(set(ALL_FILES) - {IndexType.TRANSACTION.value})
    rsm.delete_log_segment(metadata)
    assert remote_files(rsm, metadata) == []


def test_records_of_two_segments(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    """traverseMultipleOffloadedRecordsInOneSegment / InTwoSegments: each remote log holds
    its own records, in order."""
    data_a, log_a = segments.next_segment(bytes([0, 1, 2]), bytes([3, 4, 5]))
    data_b, log_b = segments.next_segment(bytes([6, 7, 8]), bytes([9, 10, 11]))
    metadata_a, metadata_b = metadata_for(log_a), metadata_for(log_b)
    rsm.copy_log_segment(metadata_a, data_a)
    rsm.copy_log_segment(metadata_b, data_b)
    values = {
        m.id: [record[2] for record in decode_records(fetched(rsm, m, 0))] for m in (metadata_a, metadata_b)
    }
    assert values == {
        metadata_a.id: [bytes([0, 1, 2]), bytes([3, 4, 5])],
        metadata_b.id: [bytes([6, 7, 8]), bytes([9, 10, 11])],
    }


def test_fetch_throws_if_data_does_not_exist(rsm: RemoteStorageManager) -> None:
    metadata = metadata_for(bytes(1024))
    with pytest.raises(RemoteSegmentNotFound) as caught:
        rsm.fetch_log(metadata, 0, metadata.size_bytes)
    assert caught.value.segment == str(metadata.id) and caught.value.partition == str(TP)
    for index_type in IndexType:
        with pytest.raises(RemoteSegmentNotFound):
            rsm.fetch_index(metadata, index_type)


def test_start_and_end_position_consistency(rsm: RemoteStorageManager) -> None:
    """Checked before the segment is looked up, as Kafka's: the segment here was never copied."""
    metadata = metadata_for(bytes(1024))
    for start, end in ((-1, 2**31 - 1), (1, -1), (2, 1)):
        with pytest.raises(InvalidOffset):
            rsm.fetch_log(metadata, start, end)


# --- the rest of Kafka's RemoteStorageManager contract ---------------------------------------


def test_any_bytes_are_copied_as_they_are(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    """Nothing is parsed: bytes that are no record batch at all come back exactly."""
    data, _ = segments.next_segment()
    garbage = os.urandom(100_000)
    Path(data.log).write_bytes(garbage)
    metadata = metadata_for(garbage)
    rsm.copy_log_segment(metadata, data)
    assert fetched(rsm, metadata, 0) == garbage


def test_a_ranged_fetch_ends_at_the_end_position_or_the_end_of_the_data(
    env: Env, segments: LocalLogSegments
) -> None:
    rsm = RemoteStorageManager(env.open(), read_bytes=100)
    data, _ = segments.next_segment()
    log = os.urandom(1000)
    Path(data.log).write_bytes(log)
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    assert fetched(rsm, metadata, 0) == log
    assert fetched(rsm, metadata, 10, 19) == log[10:20], "the end position is inclusive"
    assert fetched(rsm, metadata, 250, 250) == log[250:251]
    assert fetched(rsm, metadata, 990, 5000) == log[990:], "an end past the data ends with the data"
    assert fetched(rsm, metadata, 990, 2**31 - 1) == log[990:]
    assert fetched(rsm, metadata, 1000) == b"", "a start at the end: an empty stream"
    assert fetched(rsm, metadata, 1000, 1500) == b""
    for start, end in ((1001, None), (1001, 2000), (2**31 - 1, None)):
        with pytest.raises(InvalidOffset) as caught:
            rsm.fetch_log(metadata, start, end)
        assert caught.value.offset == start
    for start, end in (("0", None), (0, 1.5), (True, None), (-1, None)):
        with pytest.raises(InvalidOffset):
            rsm.fetch_log(metadata, start, end)  # type: ignore[arg-type]


def test_only_size_bytes_of_the_log_are_copied(env: Env, segments: LocalLogSegments) -> None:
    """What was inspected is what is copied: bytes a broker appends to the file after its
    size was taken are not, whatever the piece size."""
    rsm = RemoteStorageManager(env.open(), write_bytes=333)
    data, _ = segments.next_segment()
    log = os.urandom(10_000)
    Path(data.log).write_bytes(log + b"appended later")
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    assert stored_log(rsm, metadata) == log
    assert rsm.fetch_index(metadata, IndexType.OFFSET) == OFFSET_FILE_BYTES


def test_a_log_shorter_than_its_size_is_refused_and_nothing_changes(
    env: Env, rsm: RemoteStorageManager, segments: LocalLogSegments
) -> None:
    data, log = segments.next_segment(b"abc")
    metadata = dataclasses.replace(metadata_for(log), size_bytes=len(log) + 1)
    before = env.snapshot()
    with pytest.raises(InvalidLogSegment) as caught:
        rsm.copy_log_segment(metadata, data)
    assert caught.value.position == len(log)
    assert env.snapshot() == before


def test_a_log_that_shrinks_during_the_copy_leaves_nothing_behind(
    env: Env, segments: LocalLogSegments
) -> None:
    """The file is cut under the copy (after its size was checked): the copy fails and
    deletes what it wrote."""
    storage, binding, _ = faulty_owner(env)
    rsm = RemoteStorageManager(storage, write_bytes=1000)
    data, _ = segments.next_segment()
    log = os.urandom(64 << 10)
    Path(data.log).write_bytes(log)
    metadata = metadata_for(log)
    binding.before(
        ("create", "write"), lambda: os.truncate(data.log, 2000), prefix=f"0/{rsm.segment_name(metadata)}/"
    )
    with pytest.raises(InvalidLogSegment, match="ended at"):
        rsm.copy_log_segment(metadata, data)
    assert rsm.copied_names(metadata) == []


def test_a_retried_copy_replaces_a_complete_one(
    rsm: RemoteStorageManager, segments: LocalLogSegments
) -> None:
    """Copied once with a transaction index, again under the same id from other files
    without one: the second copy's files are the segment's, the old index is gone."""
    first, log = segments.next_segment(b"first")
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, first)
    second, _ = segments.next_segment(b"other")
    other = os.urandom(len(log))
    Path(second.log).write_bytes(other)
    Path(second.offset_index).write_bytes(b"new offsets")
    rsm.copy_log_segment(metadata, dataclasses.replace(second, transaction_index=None))
    assert fetched(rsm, metadata, 0) == other
    assert rsm.fetch_index(metadata, IndexType.OFFSET) == b"new offsets"
    with pytest.raises(RemoteSegmentNotFound):
        rsm.fetch_index(metadata, IndexType.TRANSACTION)


def test_a_retried_copy_replaces_a_partial_one(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    """An earlier attempt died after writing part of the log (unsealed) and one index."""
    data, log = segments.next_segment(b"value")
    metadata = metadata_for(log)
    storage = rsm.storage
    for kind, content in ((LOG, log[:10]), (IndexType.OFFSET, b"partial")):
        name = rsm.segment_name(metadata, kind)
        storage.create(name)
        storage.write(storage.open_write(name), 0, content)
    rsm.copy_log_segment(metadata, data)
    assert fetched(rsm, metadata, 0) == log
    assert storage.info(rsm.segment_name(metadata)).sealed
    assert rsm.fetch_index(metadata, IndexType.OFFSET) == OFFSET_FILE_BYTES


def test_a_failed_copy_deletes_what_it_wrote(env: Env, segments: LocalLogSegments) -> None:
    storage, binding, _ = faulty_owner(env)
    rsm = RemoteStorageManager(storage)
    data, log = segments.next_segment(b"value")
    metadata = metadata_for(log)
    binding.fail_nth("create", 3, prefix=f"0/{rsm.folder(metadata)}/")
    with pytest.raises(StorageUnavailable):
        rsm.copy_log_segment(metadata, data)
    assert rsm.copied_names(metadata) == []
    rsm.copy_log_segment(metadata, data)  # and a retry succeeds
    assert fetched(rsm, metadata, 0) == log


def test_a_segment_deleted_under_a_fetch_stream(env: Env, segments: LocalLogSegments) -> None:
    rsm = RemoteStorageManager(env.open(), read_bytes=16)
    data, _ = segments.next_segment()
    log = os.urandom(1000)
    Path(data.log).write_bytes(log)
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    with rsm.fetch_log(metadata, 0) as stream:
        assert stream.read(16) == log[:16]
        rsm.delete_log_segment(metadata)
        with pytest.raises(RemoteSegmentNotFound) as caught:
            stream.read()
    assert isinstance(caught.value.__cause__, SegmentNotFound)


def test_a_followers_stream_after_the_gc_collected_the_chunks(env: Env, segments: LocalLogSegments) -> None:
    """A read-only follower streams a segment; between two of its reads the owner deletes
    the segment and the GC collects its chunks: the read finds the chunk gone, looks again,
    finds the segment gone: RemoteSegmentNotFound."""
    owner = env.open()
    rsm = RemoteStorageManager(owner)
    data, _ = segments.next_segment()
    log = os.urandom(1000)
    Path(data.log).write_bytes(log)
    metadata = metadata_for(log)
    rsm.copy_log_segment(metadata, data)
    binding = FaultyChunkStorage(env.binding)
    follower_storage = ChunkedSegmentStorage(0, None, binding, env.store, read_only=True)
    env.instances.append(follower_storage)
    follower = RemoteStorageManager(follower_storage, read_bytes=16)

    collected = threading.Event()
    passes: list[tuple[str, object]] = []  # (thread, GcStatistics): said if the chunks stay

    def delete_and_collect() -> None:
        rsm.delete_log_segment(metadata)
        env.clock.advance(100)
        for _ in range(50):  # a pass whose deletes failed (a loaded S3) leaves them to the next
            passed = owner.gc.run_once()
            passes.append((threading.current_thread().name, passed))
            if not (passed.progressed or passed.errors):
                break
        collected.set()

    with follower.fetch_log(metadata, 0) as stream:
        assert stream.read(16) == log[:16]
        binding.before("read", delete_and_collect, prefix=f"0/{rsm.segment_name(metadata)}/")
        with pytest.raises(RemoteSegmentNotFound) as caught:
            stream.read()
    # On an object store the read that runs the hook may be read-ahead's, in its own thread:
    # the reader's own read can find the segment gone while that thread still collects.
    assert collected.wait(120), "the owner's GC ran"
    assert list(env.binding.list(f"0/{rsm.folder(metadata)}/")) == [], f"the chunks were collected: {passes}"
    assert isinstance(caught.value.__cause__.__context__, ChunkNotFound), "the read found the chunk gone"
    with pytest.raises(RemoteSegmentNotFound):
        follower.fetch_index(metadata, IndexType.TIMESTAMP)


def test_delete_is_idempotent(rsm: RemoteStorageManager, segments: LocalLogSegments) -> None:
    """Absent files are no error (Kafka: a delete retried after a partial one, or of a
    segment whose copy failed)."""
    data, log = segments.next_segment(b"value")
    metadata = metadata_for(log)
    assert rsm.delete_log_segment(metadata) == 0, "never copied"
    rsm.copy_log_segment(metadata, data)
    storage = rsm.storage
    storage.delete(storage.open_write(rsm.segment_name(metadata, IndexType.OFFSET)))  # a partial delete
    assert rsm.delete_log_segment(metadata) == len(ALL_FILES) - 1
    assert rsm.delete_log_segment(metadata) == 0
    assert remote_files(rsm, metadata) == []


def test_bad_arguments_change_nothing(
    env: Env, rsm: RemoteStorageManager, segments: LocalLogSegments
) -> None:
    data, log = segments.next_segment(b"value")
    metadata = metadata_for(log)
    before = env.snapshot()
    calls = [
        lambda: rsm.copy_log_segment("segment", data),  # type: ignore[arg-type]
        lambda: rsm.copy_log_segment(metadata, "files"),  # type: ignore[arg-type]
        lambda: rsm.copy_log_segment(metadata, dataclasses.replace(data, leader_epoch_checkpoint="0\n0\n")),  # type: ignore[arg-type]
        lambda: rsm.copy_log_segment(metadata, dataclasses.replace(data, offset_index=None)),  # type: ignore[arg-type]
        lambda: rsm.copy_log_segment(
            metadata, dataclasses.replace(data, time_index=segments.folder / "gone")
        ),
        lambda: rsm.copy_log_segment(metadata, dataclasses.replace(data, producer_snapshot=segments.folder)),
        lambda: rsm.fetch_log("segment", 0),  # type: ignore[arg-type]
        lambda: rsm.fetch_index(metadata, "index"),  # type: ignore[arg-type]
        lambda: rsm.delete_log_segment("segment"),  # type: ignore[arg-type]
        lambda: RemoteStorageManager(rsm.storage, write_bytes=0),
    ]
    for call in calls:
        with pytest.raises(InvalidArgument) as caught:
            call()
        assert not isinstance(caught.value, InvalidLogSegment), caught.value
    assert env.snapshot() == before
