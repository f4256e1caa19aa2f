"""Kafka's RemoteLogManager cases (``RemoteLogManagerTest``) and leader-epoch cache rules
(``LeaderEpochFileCache``), ported: the lineage rules, the copy task's candidates and
metadata, the highest remote offset and log start offset, the expiration task, reads
across compacted gaps and ``minOneMessage``; then what SLTS adds: copies bounded to the
snapshot, unclean elections end to end, and tasks of one partition serialised beside
fetches. On the filesystem binding and S3."""

from __future__ import annotations

import dataclasses
import os
import threading
import uuid
from pathlib import Path

import pytest
from slts.tools.kafka_logs import build_log, decode_records, leader_epoch_checkpoint_bytes, write_log_dir

from slts.errors import InvalidArgument, RemoteOffsetOutOfRange, StorageUnavailable
from slts.remote import kafka_formats as kf
from slts.remote.lineage import LeaderEpochCache, filtered_epochs, segment_within_lineage
from slts.remote.local_log import LocalLog, LocalSegment, local_log
from slts.remote.manager import RemoteLogManager
from slts.remote.records import RemoteLogSegmentMetadata, SegmentState, TopicPartition, new_segment_metadata
from slts.remote.rsm import IndexType, LogSegmentData
from tests.support.engine import Env, env_fixture
from tests.support.faults import faulty_owner

TP = TopicPartition("orders", 0)
env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])


def segment_metadata(
    start: int, end: int, epochs: dict[int, int], **fields: object
) -> RemoteLogSegmentMetadata:
    """Metadata as Kafka's tests make it (the lineage rules read only epochs and end)."""
    values: dict[str, object] = {
        "segment_id": uuid.uuid4().bytes,
        "topic": TP.topic,
        "partition": TP.partition,
        "start_offset": start,
        "end_offset": end,
        "max_timestamp_ms": 0,
        "broker_id": 0,
        "event_timestamp_ms": 0,
        "size_bytes": 1024,
        "leader_epochs": epochs,
    }
    values.update(fields)
    return RemoteLogSegmentMetadata(**values)  # type: ignore[arg-type]


# -- the lineage rules (pure) ------------------------------------------------------------------


def test_epochs_without_records_are_filtered() -> None:
    epochs = {0: 0, 1: 0, 2: 0, 3: 30, 4: 40, 5: 60, 6: 60, 7: 70, 8: 70}
    assert filtered_epochs(epochs) == {2: 0, 3: 30, 4: 40, 6: 60, 8: 70}


@pytest.mark.parametrize(
    ("start", "end", "epochs", "within"),
    [
        (15, 35, {1: 15, 2: 20, 3: 30}, True),
        (15, 19, {1: 15}, True),
        (0, 5, {0: 0}, True),
        (70, 75, {7: 70}, True),
        (15, 29, {1: 15, 2: 20}, True),  # ends where epoch 2 ends
        (55, 85, {5: 55, 6: 60, 7: 70}, False),  # epoch 6 is not in the lineage
        (15, 45, {1: 15, 2: 20, 4: 40}, False),  # epoch 3 missing from the segment
        (15, 95, {0: 0, 1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 7: 70}, False),  # past the log end
        (15, 90, {0: 0, 1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 7: 70}, False),  # at the log end
        (5, 25, {1: 5, 2: 20}, False),  # epoch 1 starts before the lineage says
        (15, 35, {1: 15, 2: 20}, False),  # past epoch 2's end
    ],
)
def test_a_segment_within_the_lineage(start: int, end: int, epochs: dict[int, int], within: bool) -> None:
    lineage = {0: 0, 1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 7: 70}
    assert segment_within_lineage(segment_metadata(start, end, epochs), 90, lineage) is within


@pytest.mark.parametrize(
    ("start", "end", "epochs", "within"),
    [
        (14, 150, {5: 14, 7: 15, 9: 100}, True),  # overlaps a deleted segment: epochs before the lineage
        (2, 7, {2: 5, 3: 6}, False),
        (15, 250, {7: 15, 9: 100, 10: 200}, False),
        (75, 100, {8: 75}, False),
        (15, 150, {7: 15, 9: 101}, False),
        (99, 150, {9: 99}, False),
    ],
)
def test_overlapping_segments_and_the_lineage(
    start: int, end: int, epochs: dict[int, int], within: bool
) -> None:
    lineage = {7: 51, 9: 100}
    assert segment_within_lineage(segment_metadata(start, end, epochs), 210, lineage) is within


def test_the_leader_epoch_cache_answers_as_kafkas() -> None:
    cache = LeaderEpochCache.of([(0, 0), (1, 100), (2, 200)])
    assert cache.entries_in_range(0, 300) == [(0, 0), (1, 100), (2, 200)]
    assert cache.entries_in_range(100, 200) == [(1, 100)]
    assert cache.entries_in_range(150, 250) == [(1, 150), (2, 200)], "the first entry moved to the start"
    assert cache.entries_in_range(-1, 150) == [(0, 0), (1, 100)]
    assert [cache.epoch_for_offset(o) for o in (0, 99, 100, 199, 200, 10**6)] == [0, 0, 1, 1, 2, 2]
    assert LeaderEpochCache.of([(3, 10)]).epoch_for_offset(5) is None
    assert LeaderEpochCache.of([(5, 60), (6, 60), (7, 70)]).epoch_for_offset(60) == 5, (
        "the first at that offset"
    )
    assert LeaderEpochCache.of([(5, 60), (6, 60), (7, 70)]).epoch_for_offset(65) == 6
    assert cache.end_offset_for(2, 250) == (2, 250), "the latest epoch ends at the log end"
    assert cache.end_offset_for(0, 250) == (0, 100)
    assert cache.end_offset_for(3, 250) == (-1, -1)
    assert LeaderEpochCache.of([(2, 10), (4, 20)]).end_offset_for(3, 30) == (2, 20)
    assert LeaderEpochCache.of([(2, 10), (4, 20)]).end_offset_for(1, 30) == (1, 10)
    assert cache.previous_entry(2) == (1, 100) and cache.next_epoch(0) == 1 and cache.next_epoch(2) is None


def fake_log(bases: list[int], last_stable_offset: int, log_end_offset: int) -> LocalLog:
    data = LogSegmentData("log", "index", "timeindex", b"")
    segments = [LocalSegment(base, data, 10) for base in bases]
    return LocalLog.of(
        segments,
        [(0, 0)],
        log_start_offset=bases[0],
        log_end_offset=log_end_offset,
        last_stable_offset=last_stable_offset,
    )


def test_candidates_never_include_the_active_segment() -> None:
    log = fake_log([5, 10, 15], 20, 20)
    assert [(s.base_offset, n) for s, n in RemoteLogManager.candidate_segments(log, 5)] == [(5, 10), (10, 15)]


def test_candidates_stop_at_the_last_stable_offset() -> None:
    log = fake_log([5, 10, 15, 20], 15, 25)
    assert [(s.base_offset, n) for s, n in RemoteLogManager.candidate_segments(log, 5)] == [(5, 10), (10, 15)]
    assert [(s.base_offset, n) for s, n in RemoteLogManager.candidate_segments(log, 12)] == [(10, 15)]


# -- the copy task on a real container ------------------------------------------------------------


def finished(
    manager: RemoteLogManager, start: int, end: int, epochs: dict[int, int], **kw: object
) -> RemoteLogSegmentMetadata:
    """A segment recorded COPY_SEGMENT_FINISHED (no data: the tasks below read metadata)."""
    metadata = new_segment_metadata(
        TP,
        start_offset=start,
        end_offset=end,
        leader_epochs=epochs,
        max_timestamp_ms=int(kw.pop("max_timestamp_ms", 0)),  # type: ignore[call-overload]
        size_bytes=int(kw.pop("size_bytes", 1024)),  # type: ignore[call-overload]
    )
    manager.rlmm.add_segment(metadata)
    state = kw.pop("state", SegmentState.COPY_SEGMENT_FINISHED)
    if state != SegmentState.COPY_SEGMENT_STARTED:
        manager.rlmm.update_segment(metadata.id, SegmentState.COPY_SEGMENT_FINISHED)
    if state == SegmentState.DELETE_SEGMENT_STARTED:
        manager.rlmm.update_segment(metadata.id, SegmentState.DELETE_SEGMENT_STARTED)
    return manager.rlmm.segment(metadata.id)


def test_the_highest_remote_offset_follows_the_lineage(env: Env) -> None:
    manager = RemoteLogManager(env.open())
    log = fake_log([0, 300], 300, 600)
    empty = dataclasses.replace(log, leader_epochs=LeaderEpochCache.of([(0, 0), (1, 500)]))
    assert manager.find_highest_remote_offset(TP, empty) == (-1, -1), "nothing remote"
    finished(manager, 0, 200, {0: 0})
    assert manager.find_highest_remote_offset(TP, empty) == (200, 0), "epoch 1 has nothing: epoch 0's"
    unclean = dataclasses.replace(log, leader_epochs=LeaderEpochCache.of([(0, 0), (1, 150), (2, 300)]))
    assert manager.find_highest_remote_offset(TP, unclean) == (149, 0), "capped where epoch 0 ends here"


def test_the_log_start_offset_a_new_leader_adopts(env: Env) -> None:
    manager = RemoteLogManager(env.open())
    log = dataclasses.replace(
        fake_log([500, 600], 600, 700), leader_epochs=LeaderEpochCache.of([(0, 0), (1, 400)])
    )
    assert manager.find_log_start_offset(TP, log) == 500, "nothing remote: the local log's start"
    finished(manager, 150, 399, {0: 150})
    finished(manager, 400, 499, {1: 400})
    assert manager.find_log_start_offset(TP, log) == 150


@dataclasses.dataclass
class Folder:
    path: Path
    logs: list

    def local(self, **kw: int) -> LocalLog:
        return local_log(self.path, **kw)


def partition_folder(path: Path, layout: list[tuple[int, int]], epochs: list[tuple[int, int]]) -> Folder:
    """Segments at the given (base offset, batch count) (gaps between them stand for
    compacted offsets); each batch holds 3 records; ``epochs`` is the checkpoint."""
    logs = []
    cache = LeaderEpochCache.of(epochs)
    for number, (base, count) in enumerate(layout):
        in_segment = cache.entries_in_range(base, base + 3 * count)
        log = build_log(base, count, leader_epochs=in_segment, seed=number)
        write_log_dir(path, log)
        logs.append(log)
    (path / "leader-epoch-checkpoint").write_bytes(leader_epoch_checkpoint_bytes(epochs))
    return Folder(path, logs)


def test_the_copied_segment_is_what_kafka_records(env: Env, tmp_path: Path) -> None:
    """Kafka's testCopyLogSegmentsToRemoteShouldCopyExpectedLogSegment: the segment's end
    offset is the next segment's base - 1, its epochs the cache's in that range, its
    producer snapshot the one named after the next segment's base, and the checkpoint
    copied is the cache cut at its end."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 50), (150, 50)], [(0, 0), (1, 99), (2, 201)])
    (tmp_path / "orders-0" / f"{150:020d}.snapshot").write_bytes(b"state at 150")
    (tmp_path / "orders-0" / f"{0:020d}.snapshot").write_bytes(b"state at 0")
    manager = RemoteLogManager(env.open())
    report = manager.copy_rolled_segments(TP, folder.local(last_stable_offset=250))
    (copied,) = report.copied
    assert (copied.start_offset, copied.end_offset) == (0, 149)
    assert dict(copied.leader_epochs) == {0: 0, 1: 99}
    assert copied.size_bytes == len(folder.logs[0].data)
    assert manager.rsm.fetch_index(copied, IndexType.PRODUCER_SNAPSHOT) == b"state at 150"
    checkpoint = manager.rsm.fetch_index(copied, IndexType.LEADER_EPOCH)
    assert kf.parse_leader_epoch_checkpoint(checkpoint) == [(0, 0), (1, 99)]


def test_a_stale_topics_rolled_segment_is_copied(env: Env, tmp_path: Path) -> None:
    """Kafka's testCopyLogSegmentToRemoteForStaleTopic: LSO = LEO = the active segment's
    base (rolled by time, nothing new): the rolled segment is copied, the empty active
    segment is not, and nothing fails."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 50)], [(0, 0)])
    (tmp_path / "orders-0" / f"{150:020d}.log").write_bytes(b"")
    (tmp_path / "orders-0" / f"{150:020d}.index").write_bytes(b"")
    (tmp_path / "orders-0" / f"{150:020d}.timeindex").write_bytes(b"")
    log = folder.local()
    assert log.log_end_offset == log.last_stable_offset == 150
    manager = RemoteLogManager(env.open())
    report = manager.copy_rolled_segments(TP, log)
    assert [(m.start_offset, m.end_offset) for m in report.copied] == [(0, 149)]
    again = manager.copy_rolled_segments(TP, log)
    assert again.copied == [] and again.skipped == 1


def test_a_copy_takes_the_bytes_of_the_snapshot_only(env: Env, tmp_path: Path) -> None:
    """Bytes appended to a segment's file after the snapshot was taken are not copied:
    the remote log holds exactly ``size_bytes`` and a fetch never returns offsets past
    the segment's end."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 50), (150, 50), (300, 2)], [(0, 0)])
    log = folder.local()
    with open(log.segments[0].data.log, "ab") as file:  # a late writer appends the next segment's batches
        file.write(folder.logs[1].data)
    manager = RemoteLogManager(env.open())
    report = manager.copy_rolled_segments(TP, log)
    first = report.copied[0]
    with manager.rsm.fetch_log(first, 0) as stream:
        assert stream.read() == folder.logs[0].data
    result = manager.fetch(TP, 140, 1 << 20)
    offsets = [r[0] for r in decode_records(result.records)]
    assert offsets == list(range(138, 300)), "each offset once, from the segment that holds it"


def test_a_failed_copy_is_cleaned_at_once_and_retried(env: Env, tmp_path: Path) -> None:
    """Kafka's testFailedCopyShouldDeleteTheDanglingSegment."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 20), (60, 2)], [(0, 0)])
    storage, binding, _ = faulty_owner(env)
    manager = RemoteLogManager(storage)
    binding.fail_nth("create", 2, prefix="0/remote/")
    with pytest.raises(StorageUnavailable):
        manager.copy_rolled_segments(TP, folder.local())
    assert list(manager.rlmm.list_segments(TP)) == [] and list(storage.list("remote/")) == []
    assert len(manager.copy_rolled_segments(TP, folder.local()).copied) == 1


# -- the expiration task --------------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["bytes", "time"])
def test_retention_breached_segments_are_deleted_and_the_start_moves(env: Env, limit: str) -> None:
    """Kafka's testDeletionOnRetentionBreachedSegments: retention.bytes 0 or retention.ms
    0 deletes both remote segments; the log start offset moves to 200."""
    manager = RemoteLogManager(env.open())
    segments = [finished(manager, 0, 99, {0: 0}), finished(manager, 100, 199, {0: 100})]
    log = fake_log([200, 250], 250, 200 + 50)
    log = dataclasses.replace(log, segments=(), log_start_offset=0)  # nothing local counts
    kw = {"retention_bytes": 0} if limit == "bytes" else {"retention_ms": 0, "now_ms": 0}
    report = manager.enforce_retention(TP, log, **kw)  # type: ignore[arg-type]
    assert [m.id for m in report.deleted] == [m.id for m in segments]
    assert report.log_start_offset == 200


def test_time_retention_deletes_a_segment_exactly_at_the_cutoff(env: Env) -> None:
    """Kafka's isSegmentBreachedByRetentionTime uses <=."""
    manager = RemoteLogManager(env.open())
    at = finished(manager, 0, 99, {0: 0}, max_timestamp_ms=1_000)
    after = finished(manager, 100, 199, {0: 100}, max_timestamp_ms=1_001)
    log = dataclasses.replace(fake_log([200, 250], 250, 250), segments=(), log_start_offset=0)
    report = manager.enforce_retention(TP, log, retention_ms=500, now_ms=1_500)
    assert [m.id for m in report.deleted] == [at.id] and after.id not in {m.id for m in report.deleted}


def test_size_retention_counts_the_local_log(env: Env) -> None:
    """retention.bytes covers local segments not yet remote plus the remote ones."""
    manager = RemoteLogManager(env.open())
    oldest = finished(manager, 0, 99, {0: 0}, size_bytes=100)
    finished(manager, 100, 199, {0: 100}, size_bytes=100)
    # two local segments of 10 bytes each, not remote yet; the log starts at 0
    log = dataclasses.replace(fake_log([200, 300], 300, 350), log_start_offset=0)
    assert manager.enforce_retention(TP, log, retention_bytes=220).deleted == []
    assert manager.enforce_retention(TP, log, retention_bytes=121).deleted == [], "a segment goes whole"
    report = manager.enforce_retention(TP, log, retention_bytes=120)
    assert [m.id for m in report.deleted] == [oldest.id]


def test_size_retention_leaves_copy_started_out_of_the_size(env: Env) -> None:
    """Kafka's testRemoteLogSizeRetentionShouldFilterOutCopySegmentStartState (run 1): of
    a dangling STARTED upload, a half-deleted one and 11 finished segments over a limit of
    10, the first run deletes the STARTED one (the breach is one segment) and finishes
    the half-deleted one; an upload in progress stops the walk."""
    manager = RemoteLogManager(env.open())
    s1 = finished(manager, 0, 99, {0: 0}, state=SegmentState.COPY_SEGMENT_STARTED)
    s3 = finished(manager, 0, 99, {0: 0}, state=SegmentState.DELETE_SEGMENT_STARTED)
    s4 = finished(manager, 200, 299, {0: 200}, state=SegmentState.COPY_SEGMENT_STARTED)
    s5 = [finished(manager, 100 * n, 100 * n + 99, {0: 100 * n}) for n in range(3, 14)]
    log = dataclasses.replace(fake_log([0, 2000], 2000, 2000), segments=())
    report = manager.enforce_retention(TP, log, retention_bytes=1024 * 10)
    assert {m.id for m in report.deleted} == {s1.id, s3.id}
    manager.rlmm.update_segment(s4.id, SegmentState.COPY_SEGMENT_FINISHED)
    report = manager.enforce_retention(TP, log, retention_bytes=1024 * 10)
    assert {m.id for m in report.deleted} == {s4.id, s5[0].id}


def test_segments_of_epochs_before_the_lineage_are_deleted(env: Env) -> None:
    """After an unclean election the new leader's earliest epoch is 2: remote segments
    of epochs before it only are deleted, whatever the limits."""
    manager = RemoteLogManager(env.open())
    stale = finished(manager, 0, 99, {1: 0})
    kept = finished(manager, 100, 199, {2: 100})
    log = dataclasses.replace(
        fake_log([200, 300], 300, 300), leader_epochs=LeaderEpochCache.of([(2, 100)]), log_start_offset=100
    )
    report = manager.enforce_retention(TP, log)
    assert [m.id for m in report.deleted] == [stale.id]
    assert [m.id for m in manager.rlmm.list_segments(TP)] == [kept.id]


def kafkas_fifty_segments(
    manager: RemoteLogManager, old: int = 0, now_ms: int = 0
) -> list[RemoteLogSegmentMetadata]:
    """Kafka's ``listRemoteLogSegmentMetadata``: 50 segments of 100 offsets and 1024 bytes
    under the epochs (0, 0), (1, 20), (3, 50), (4, 100); the first ``old`` of them older
    than ``now_ms`` - 1."""
    cache = LeaderEpochCache.of(KAFKAS_EPOCHS)
    return [
        finished(
            manager,
            100 * n,
            100 * n + 99,
            dict(cache.entries_in_range(100 * n, 100 * n + 100)),
            max_timestamp_ms=now_ms - 2 if n < old else now_ms,
        )
        for n in range(50)
    ]


KAFKAS_EPOCHS = [(0, 0), (1, 20), (3, 50), (4, 100)]


def kafkas_local_log() -> LocalLog:
    """Kafka's mocked log for these cases: local log from 5000 holding 512 bytes, log end 5001."""
    data = LogSegmentData("log", "index", "timeindex", b"")
    return LocalLog.of(
        [LocalSegment(5000, data, 512)],
        KAFKAS_EPOCHS,
        log_start_offset=0,
        log_end_offset=5001,
        last_stable_offset=5001,
    )


@pytest.mark.parametrize("deletable", [0, 1, 23, 50])
def test_size_retention_deletes_the_oldest_segments_of_the_lineage(env: Env, deletable: int) -> None:
    """Kafka's testDeleteLogSegmentDueToRetentionSizeBreach."""
    manager = RemoteLogManager(env.open())
    segments = kafkas_fifty_segments(manager)
    report = manager.enforce_retention(TP, kafkas_local_log(), retention_bytes=(50 - deletable) * 1024 + 512)
    assert [m.id for m in report.deleted] == [m.id for m in segments[:deletable]]
    if deletable:
        assert report.log_start_offset == segments[deletable - 1].end_offset + 1


@pytest.mark.parametrize("deletable", [0, 1, 23, 50])
def test_time_retention_deletes_the_oldest_segments_of_the_lineage(env: Env, deletable: int) -> None:
    """Kafka's testDeleteLogSegmentDueToRetentionTimeBreach."""
    manager = RemoteLogManager(env.open())
    now = 10_000_000
    segments = kafkas_fifty_segments(manager, old=deletable, now_ms=now)
    report = manager.enforce_retention(TP, kafkas_local_log(), retention_ms=1, now_ms=now)
    assert [m.id for m in report.deleted] == [m.id for m in segments[:deletable]]
    if deletable:
        assert report.log_start_offset == segments[deletable - 1].end_offset + 1


@pytest.mark.parametrize("limit", ["bytes", "time"])
def test_overlapping_breached_segments_are_both_deleted(env: Env, limit: str) -> None:
    """Kafka's testDeletionOnOverlappingRetentionBreachedSegments: a second leader's upload
    of 0..104 supersedes the first one's 0..99; both go, the start moves past the wider."""
    manager = RemoteLogManager(env.open())
    first = finished(manager, 0, 99, {0: 0})
    second = finished(manager, 0, 104, {0: 0}, size_bytes=1024 + 128)
    log = dataclasses.replace(fake_log([200], 200, 200), segments=(), log_start_offset=0)
    kw = {"retention_bytes": 0} if limit == "bytes" else {"retention_ms": 0, "now_ms": 0}
    report = manager.enforce_retention(TP, log, **kw)  # type: ignore[arg-type]
    assert {m.id for m in report.deleted} == {first.id, second.id}
    assert report.log_start_offset == 105


def test_a_failed_delete_is_retried_by_the_next_run(env: Env) -> None:
    """Kafka's testFailedDeleteExpiredSegments: the RSM's delete fails; the start has moved
    already; the next run deletes the segment."""
    manager = RemoteLogManager(env.open())
    segment = finished(manager, 0, 99, {0: 0})
    log = dataclasses.replace(fake_log([200], 200, 200), segments=(), log_start_offset=0)
    delete = manager.rsm.delete_log_segment

    def failing(metadata: RemoteLogSegmentMetadata) -> int:
        raise StorageUnavailable("tier-2 refused the delete")

    manager.rsm.delete_log_segment = failing  # type: ignore[method-assign]
    with pytest.raises(StorageUnavailable):
        manager.enforce_retention(TP, log, retention_bytes=0)
    assert manager.rlmm.log_start_offset(TP) == 100
    assert manager.rlmm.segment(segment.id).segment_state == SegmentState.DELETE_SEGMENT_STARTED
    manager.rsm.delete_log_segment = delete  # type: ignore[method-assign]
    report = manager.enforce_retention(TP, log)
    assert [m.id for m in report.deleted] == [segment.id]
    assert list(manager.rlmm.list_segments(TP)) == []


def test_a_delete_repeated_after_it_finished_changes_nothing(env: Env) -> None:
    manager = RemoteLogManager(env.open())
    metadata = finished(manager, 0, 99, {0: 0})
    assert manager._delete(metadata) is True
    assert manager._delete(metadata) is False, "already forgotten: nothing to do, no error"


# -- reads ----------------------------------------------------------------------------------------


def test_a_fetch_in_a_compacted_gap_continues_into_the_next_segment(env: Env, tmp_path: Path) -> None:
    """Kafka's testReadForFirstBatchInLogCompaction: offsets 60..99 were compacted away;
    the first segment ends at 99 (the next base - 1); a fetch at 80 returns the next
    segment's first batch."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 20), (100, 20), (200, 2)], [(0, 0)])
    manager = RemoteLogManager(env.open())
    log = folder.local()
    manager.copy_rolled_segments(TP, log)
    for epochs in (None, log.leader_epochs):
        result = manager.fetch(TP, 80, 1, leader_epochs=epochs)
        assert decode_records(result.records)[0][0] == 100 and result.next_offset == 103


def test_min_one_message(env: Env, tmp_path: Path) -> None:
    """Kafka's testReadForFirstBatchMoreThanMaxFetchBytes: with minOneMessage the first
    batch comes whole even over the budget; without it, nothing."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 20), (60, 2)], [(0, 0)])
    manager = RemoteLogManager(env.open())
    manager.copy_rolled_segments(TP, folder.local())
    whole = manager.fetch(TP, 0, 10, min_one_message=True)
    assert whole.records == folder.logs[0].data[: folder.logs[0].batches[0].size]
    empty = manager.fetch(TP, 0, 10, min_one_message=False)
    assert empty.records == b"" and empty.next_offset == 0


# -- unclean election end to end -------------------------------------------------------------------


def test_after_an_unclean_election_only_the_new_lineage_is_served_and_copied(
    env: Env, tmp_path: Path
) -> None:
    """The old leader (epoch 1 from 60) copied 60..119 of its own bytes. The new leader
    (epoch 2) diverged at 60: its log holds other bytes there. Kafka's rules: the copy
    resumes after epoch 0's end (59), not after 119; a fetch under the new lineage never
    returns the old leader's bytes, nor does retention count or delete them."""
    old = partition_folder(tmp_path / "old" / "orders-0", [(0, 20), (60, 20), (120, 2)], [(0, 0), (1, 60)])
    manager = RemoteLogManager(env.open())
    assert len(manager.copy_rolled_segments(TP, old.local()).copied) == 2

    new_path = tmp_path / "new" / "orders-0"
    new_path.mkdir(parents=True)
    for suffix in (".log", ".index", ".timeindex"):
        os.link(old.path / f"{0:020d}{suffix}", new_path / f"{0:020d}{suffix}")
    diverged = build_log(60, 30, leader_epochs=[(2, 60)], seed=99)
    write_log_dir(new_path, diverged)
    write_log_dir(new_path, build_log(150, 2, leader_epochs=[(2, 150)], seed=98))
    (new_path / "leader-epoch-checkpoint").write_bytes(leader_epoch_checkpoint_bytes([(0, 0), (2, 60)]))
    new = local_log(new_path)

    assert manager.find_highest_remote_offset(TP, new) == (59, 0)
    with pytest.raises(RemoteOffsetOutOfRange):
        manager.fetch(TP, 70, leader_epochs=new.leader_epochs)
    report = manager.copy_rolled_segments(TP, new)
    assert [(m.start_offset, m.end_offset) for m in report.copied] == [(60, 149)]
    fetched = manager.fetch(TP, 70, 1 << 20, leader_epochs=new.leader_epochs)
    assert [r for r in decode_records(fetched.records) if r[0] >= 70] == [
        r for r in diverged.records if r[0] >= 70
    ]
    # Kafka keeps the old leader's segment (epoch 1 is outside this lineage, but the old
    # leader, elected again, would have it in its own): never read, never counted
    retention = manager.enforce_retention(TP, new, retention_bytes=0)
    assert (60, {1: 60}) not in [(m.start_offset, dict(m.leader_epochs)) for m in retention.deleted]
    assert {1: 60} in [dict(m.leader_epochs) for m in manager.rlmm.list_segments(TP)]


# -- one task at a time per partition, fetches beside them ------------------------------------------


@pytest.mark.parametrize("task", ["cleanup", "retention"])
def test_a_task_started_during_a_copy_waits_for_it(env: Env, tmp_path: Path, task: str) -> None:
    """Kafka's testDeletionSkippedForSegmentsBeingCopied: a cleanup or an expiration run
    started while a copy writes the segment must not delete that upload (Kafka skips the
    segments being copied; SLTS's task lock makes it wait): the copy finishes, then the
    task runs on what it left (retention.bytes 0 deletes the segment then)."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 20), (60, 2)], [(0, 0)])
    manager = RemoteLogManager(env.open())
    log = folder.local()
    copy = manager.rsm.copy_log_segment
    results: list[list[uuid.UUID]] = []
    others: list[threading.Thread] = []

    def run_task() -> None:
        if task == "cleanup":
            results.append(manager.cleanup(TP))
        else:
            results.append([m.id for m in manager.enforce_retention(TP, log, retention_bytes=0).deleted])

    def copy_beside_the_task(metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        others.append(threading.Thread(target=run_task))
        others[0].start()
        others[0].join(timeout=1.0)  # on code without the task lock, the task finishes here
        return copy(metadata, data)

    manager.rsm.copy_log_segment = copy_beside_the_task  # type: ignore[method-assign]
    report = manager.copy_rolled_segments(TP, log)
    assert [m.segment_state for m in report.copied] == [SegmentState.COPY_SEGMENT_FINISHED]
    others[0].join()
    assert results == [[] if task == "cleanup" else [report.copied[0].id]]


def test_fetches_beside_retention_return_whole_batches_or_out_of_range(env: Env, tmp_path: Path) -> None:
    folder = partition_folder(tmp_path / "orders-0", [(n * 30, 10) for n in range(8)] + [(240, 2)], [(0, 0)])
    manager = RemoteLogManager(env.open())
    log = folder.local()
    manager.copy_rolled_segments(TP, log)
    expected = {r[0]: r for kafka_log in folder.logs for r in kafka_log.records}
    outcomes: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        offset = 0
        while not stop.is_set():
            try:
                result = manager.fetch(TP, offset % 240, 200)
            except RemoteOffsetOutOfRange:
                outcomes.append("out of range")
            else:
                for record in decode_records(result.records):
                    assert expected[record[0]] == record
                outcomes.append("batches")
            offset += 7

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        segments = list(manager.rlmm.list_segments(TP))
        for count in range(1, len(segments) + 1):
            limit = sum(m.size_bytes for m in segments[count:]) + log.segments[-1].size_bytes
            manager.enforce_retention(TP, log, retention_bytes=limit)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert list(manager.rlmm.list_segments(TP)) == []
    assert "batches" in outcomes


def test_without_threads_every_copy_step_runs_in_the_calling_thread(env: Env, tmp_path: Path) -> None:
    """``threads=False`` (a seeded simulation's replay): the inspection ahead and the
    RSM's side-by-side writes run in the caller's thread; a bad flag is refused."""
    folder = partition_folder(tmp_path / "orders-0", [(0, 20), (60, 20), (120, 2)], [(0, 0)])
    storage = env.open()
    manager = RemoteLogManager(storage, threads=False)
    seen: set[str] = set()
    write = storage.write

    def recording_write(*args: object, **kwargs: object) -> object:
        seen.add(threading.current_thread().name)
        return write(*args, **kwargs)  # type: ignore[arg-type]

    storage.write = recording_write  # type: ignore[method-assign]
    assert len(manager.copy_rolled_segments(TP, folder.local()).copied) == 2
    assert seen == {threading.current_thread().name}
    for bad in ("yes", 1, None):
        with pytest.raises(InvalidArgument):
            RemoteLogManager(storage, threads=bad)  # type: ignore[arg-type]
