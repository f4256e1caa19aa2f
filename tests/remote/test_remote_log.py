"""Tiering a Kafka log into SLTS and reading it back (KIP-405's RLM, RSM and RLMM
together), on the filesystem binding and on S3 (SeaweedFS), with logs of genuine v2
record batches built by kafka-python and fetched batches decoded by it."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from slts.tools.kafka_logs import (
    KafkaLog,
    build_log,
    decode_records,
    leader_epoch_checkpoint_bytes,
    write_log_dir,
)

from slts.admin.verify import verify_container
from slts.errors import (
    Fenced,
    InvalidArgument,
    InvalidLogSegment,
    MetadataError,
    ReadOnlyInstance,
    RemoteOffsetOutOfRange,
    StorageUnavailable,
)
from slts.metadata.schema import SEGMENTS
from slts.remote.inspection import inspect_segment
from slts.remote.manager import LocalSegment, RemoteLogManager, local_segments
from slts.remote.records import SegmentState, TopicPartition, new_segment_metadata
from slts.remote.rsm import IndexType
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, env_fixture
from tests.support.faults import faulty_owner

TP = TopicPartition("payments", 7)
env = env_fixture([("filesystem", "lmdb"), ("s3", "lmdb")])


@dataclasses.dataclass
class Partition:
    """A partition folder of several segments with contiguous offsets."""

    folder: Path
    logs: list[KafkaLog]

    def segments(self) -> list[LocalSegment]:
        return local_segments(self.folder)

    def records(self, logs: slice = slice(None)) -> list[tuple]:
        return [record for log in self.logs[logs] for record in log.records]


def make_partition(
    folder: Path,
    sizes: list[int],
    *,
    epochs_every: int = 0,
    records_per_batch: int = 3,
    value_bytes: int = 100,
) -> Partition:
    """Segments of ``sizes`` batches each; with ``epochs_every``, the leader epoch goes up
    by one every that many batches (so segments span epochs)."""
    logs, base, epoch, epoch_entries, batch_number = [], 0, 0, [(0, 0)], 0
    for index, count in enumerate(sizes):
        epochs = [(epoch, base)]
        for batch in range(count):
            if epochs_every and batch_number and batch_number % epochs_every == 0:
                epoch += 1
                start = base + batch * records_per_batch
                if batch:
                    epochs.append((epoch, start))
                else:
                    epochs = [(epoch, start)]
                epoch_entries.append((epoch, start))
            batch_number += 1
        log = build_log(
            base,
            count,
            records_per_batch=records_per_batch,
            leader_epochs=epochs,
            seed=index,
            value_bytes=value_bytes,
        )
        write_log_dir(folder, log)
        logs.append(log)
        base = log.end_offset + 1
    (folder / "leader-epoch-checkpoint").write_bytes(leader_epoch_checkpoint_bytes(epoch_entries))
    return Partition(folder, logs)


def consume(manager: RemoteLogManager, start: int, max_bytes: int = 64 << 10) -> list[tuple]:
    """Every record from ``start`` to the highest remote offset, fetch by fetch."""
    highest = manager.rlmm.highest_offset(TP)
    assert highest is not None
    records, offset = [], start
    while offset <= highest:
        result = manager.fetch(TP, offset, max_bytes)
        assert result.records and result.next_offset > offset
        records += [r for r in decode_records(result.records) if r[0] >= offset]
        offset = result.next_offset
    return records


def test_copy_then_consume_every_record_back(env: Env, tmp_path: Path) -> None:
    """Three segments of 1,200 batches each (two epochs changes); the two rolled ones are
    copied, the active one (from the last stable offset on) is not; consuming from the
    start returns every record of the rolled ones, in order, decoded by kafka-python."""
    partition = make_partition(tmp_path / "payments-7", [1200, 1200, 1200], epochs_every=1000)
    manager = RemoteLogManager(env.open())
    segments = partition.segments()
    report = manager.copy_rolled_segments(TP, segments, segments[-1].base_offset)
    assert [(m.start_offset, m.end_offset) for m in report.copied] == [
        (log.base_offset, log.end_offset) for log in partition.logs[:2]
    ]
    assert report.skipped == 1
    assert all(m.segment_state == SegmentState.COPY_SEGMENT_FINISHED for m in report.copied)
    assert report.copied[0].leader_epochs == {0: 0, 1: 1000 * 3}
    assert report.copied[1].leader_epochs == {1: partition.logs[1].base_offset, 2: 2000 * 3}
    assert manager.rlmm.earliest_offset(TP) == 0
    assert manager.rlmm.highest_offset(TP) == partition.logs[1].end_offset
    assert consume(manager, 0) == partition.records(slice(0, 2))

    again = manager.copy_rolled_segments(TP, segments, segments[-1].base_offset)
    assert again.copied == [] and again.skipped == 3, "a second run copies nothing twice"
    for metadata in report.copied:  # the files round-trip exactly
        log = partition.logs[report.copied.index(metadata)]
        assert manager.rsm.fetch_index(metadata, IndexType.OFFSET) == log.offset_index
        assert manager.rsm.fetch_index(metadata, IndexType.TIMESTAMP) == log.time_index
        with manager.rsm.fetch_log(metadata, 0) as stream:
            assert stream.read() == log.data
    assert verify_container(env.instances[-1]).problems == []


def test_a_fetch_starts_at_the_batch_holding_the_offset_at_every_offset(env: Env, tmp_path: Path) -> None:
    """Hundreds of small segments under several leader epochs; a one-byte budget returns
    exactly the batch holding each offset (and with a leader epoch, the same)."""
    count = 120 if env.binding.url.startswith("file") else 30
    partition = make_partition(tmp_path / "payments-7", [4] * count, epochs_every=37, records_per_batch=2)
    manager = RemoteLogManager(env.open())
    segments = partition.segments()
    manager.copy_rolled_segments(TP, segments, partition.logs[-1].end_offset + 1)
    assert len(list(manager.rlmm.list_segments(TP))) == count
    assert len(manager.rlmm.leader_epochs(TP)) >= 3
    by_offset = {record[0]: record for record in partition.records()}
    for offset, record in by_offset.items():
        result = manager.fetch(TP, offset, 1)
        decoded = decode_records(result.records)
        assert decoded[0][0] <= offset <= decoded[-1][0] and record in decoded, offset
        assert result.next_offset == decoded[-1][0] + 1


def test_fetch_crosses_segment_boundaries_within_its_budget(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [50, 50, 50])
    manager = RemoteLogManager(env.open())
    manager.copy_rolled_segments(TP, partition.segments(), partition.logs[-1].end_offset + 1)
    start = partition.logs[0].end_offset - 4
    result = manager.fetch(TP, start, len(partition.logs[0].data) + len(partition.logs[1].data))
    assert len(result.segments) >= 2
    records = [r for r in decode_records(result.records) if r[0] >= start]
    assert records == partition.records()[start : start + len(records)]
    assert len(result.records) <= len(partition.logs[0].data) + len(partition.logs[1].data)


def test_offsets_outside_the_remote_log_are_typed_errors(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [20, 20])
    manager = RemoteLogManager(env.open())
    with pytest.raises(RemoteOffsetOutOfRange, match="empty"):
        manager.fetch(TP, 0)
    manager.copy_rolled_segments(TP, partition.segments(), partition.logs[-1].end_offset + 1)
    manager.rlmm.move_log_start_offset(TP, 10)
    for offset in (0, 9, partition.logs[-1].end_offset + 1):
        with pytest.raises(RemoteOffsetOutOfRange) as caught:
            manager.fetch(TP, offset)
        assert caught.value.partition == str(TP) and caught.value.offset == offset
    with pytest.raises(RemoteOffsetOutOfRange, match="leader epoch 5"):
        manager.fetch(TP, 10, leader_epoch=5)
    for bad in (
        lambda: manager.fetch(TP, -1),
        lambda: manager.fetch(TP, 10, 0),
        lambda: manager.fetch("t-1", 0),
    ):
        with pytest.raises(InvalidArgument):
            bad()  # type: ignore[no-untyped-call]


def test_a_crash_between_started_and_finished_is_cleaned_up_and_copied_again(
    env: Env, tmp_path: Path
) -> None:
    """The copy fails after COPY_SEGMENT_STARTED and part of the data (tier-2 refuses the
    second of the segment's files to be created, so at least one was written): the copy
    deletes what it wrote; the next owner's run deletes the partial upload, records it
    deleted and copies the segment again."""
    partition = make_partition(tmp_path / "payments-7", [300, 300])
    storage, binding, _ = faulty_owner(env)
    first = RemoteLogManager(storage)
    binding.fail_nth("create", 2, prefix=f"0/remote/payments-7/{0:020d}-")  # the first segment's files
    stable = partition.logs[-1].end_offset + 1
    with pytest.raises(StorageUnavailable) as caught:
        first.copy_rolled_segments(TP, partition.segments(), stable)
    assert caught.value.context["injected"]
    (started,) = list(first.rlmm.list_segments(TP))
    assert started.segment_state == SegmentState.COPY_SEGMENT_STARTED
    assert first.rsm.copied_names(started) == [], "the failed copy deleted what it wrote"
    with pytest.raises(RemoteOffsetOutOfRange):
        first.fetch(TP, 0)

    second = RemoteLogManager(env.reopen())  # a new owner (a restart)
    report = second.copy_rolled_segments(TP, partition.segments(), stable)
    assert report.cleaned == [started.id]
    assert [m.start_offset for m in report.copied] == [0, partition.logs[1].base_offset]
    assert started.id not in {m.id for m in second.rlmm.list_segments(TP)}
    assert second.rsm.copied_names(started) == []
    assert consume(second, 0) == partition.records()
    assert verify_container(env.instances[-1]).problems == []


def test_a_crash_between_the_halves_of_a_delete_is_finished_by_the_next_run(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [100, 100, 100])
    storage, _, store = faulty_owner(env)
    manager = RemoteLogManager(storage)
    manager.copy_rolled_segments(TP, partition.segments(), partition.logs[-1].end_offset + 1)
    oldest = next(iter(manager.rlmm.list_segments(TP)))
    store.fail_nth(1, table=SEGMENTS)  # the segments' delete (the data's half) fails
    total = sum(m.size_bytes for m in manager.rlmm.list_segments(TP))
    with pytest.raises(MetadataError) as caught:
        manager.enforce_retention(TP, retention_bytes=total - oldest.size_bytes)
    assert caught.value.context["injected"]
    assert manager.rlmm.segment(oldest.id).segment_state == SegmentState.DELETE_SEGMENT_STARTED
    assert manager.rlmm.earliest_offset(TP) == oldest.end_offset + 1, "the start moved before the delete"
    with pytest.raises(RemoteOffsetOutOfRange):
        manager.fetch(TP, 0)

    restarted = RemoteLogManager(env.reopen())
    report = restarted.enforce_retention(TP)  # no limits: only the unfinished delete
    assert [m.id for m in report.deleted] == [oldest.id]
    assert oldest.id not in {m.id for m in restarted.rlmm.list_segments(TP)}
    assert restarted.rsm.copied_names(oldest) == []
    assert consume(restarted, oldest.end_offset + 1) == partition.records(slice(1, None))


def test_retention_by_time_and_by_size(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [40] * 6)
    manager = RemoteLogManager(env.open())
    manager.copy_rolled_segments(TP, partition.segments(), partition.logs[-1].end_offset + 1)
    segments = list(manager.rlmm.list_segments(TP))
    cutoff = segments[1].max_timestamp_ms + 1  # the first two are older than this
    report = manager.enforce_retention(TP, retention_ms=1000, now_ms=cutoff + 1000)
    assert [m.id for m in report.deleted] == [m.id for m in segments[:2]]
    assert report.log_start_offset == segments[1].end_offset + 1 == manager.rlmm.earliest_offset(TP)

    kept = segments[2:]
    limit = sum(m.size_bytes for m in kept[1:])  # the oldest of the rest must go
    report = manager.enforce_retention(TP, retention_bytes=limit)
    assert [m.id for m in report.deleted] == [kept[0].id]
    assert sum(m.size_bytes for m in manager.rlmm.list_segments(TP)) == limit
    assert manager.enforce_retention(TP, retention_bytes=limit).deleted == [], "within the limit"
    assert consume(manager, kept[1].start_offset) == partition.records(slice(3, None))
    assert verify_container(env.instances[-1]).problems == []


def test_a_superseded_upload_is_deleted_by_retention(env: Env, tmp_path: Path) -> None:
    """An old leader uploaded offsets 0..89; the next leader uploads 0..179 of the same
    epoch (it had more when it took over): lookups go to the superset, the old upload
    stays listed until retention deletes it and its data."""
    short = make_partition(tmp_path / "old-leader" / "payments-7", [30])
    long = make_partition(tmp_path / "payments-7", [60])
    manager = RemoteLogManager(env.open())
    manager.copy_rolled_segments(TP, short.segments(), 10**6)
    (old,) = list(manager.rlmm.list_segments(TP))

    data = long.segments()[0].data
    inspected = inspect_segment(data, label="new leader's segment")
    summary = inspected.summary
    new = new_segment_metadata(
        TP,
        start_offset=summary.base_offset,
        end_offset=summary.end_offset,
        leader_epochs=summary.leader_epochs,
        max_timestamp_ms=summary.max_timestamp,
        size_bytes=summary.size_bytes,
        broker_id=2,
    )
    manager.rlmm.add_segment(new)
    manager.rsm.copy_log_segment(new, data)
    manager.rlmm.update_segment(new.id, SegmentState.COPY_SEGMENT_FINISHED)
    assert manager.rlmm.segment_for_offset(TP, 50).id == new.id
    assert not manager.rlmm.is_referenced(old)

    report = manager.enforce_retention(TP)
    assert [m.id for m in report.deleted] == [old.id]
    assert manager.rsm.copied_names(old) == []
    assert consume(manager, 0) == long.records()


def test_restore_from_tier2_alone_brings_the_remote_log_back(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [200, 200])
    storage = env.open(metadata_log_flush_interval_s=0.0)
    manager = RemoteLogManager(storage)
    manager.copy_rolled_segments(TP, partition.segments(), partition.logs[-1].end_offset + 1)
    expected = list(manager.rlmm.list_segments(TP))
    revived = env.lose_machine_and_restore(storage)
    manager = RemoteLogManager(revived)
    assert list(manager.rlmm.list_segments(TP)) == expected
    assert consume(manager, 0) == partition.records()
    assert verify_container(revived).problems == []


def test_a_fenced_instance_changes_nothing_and_a_follower_reads(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [50, 50, 50])
    segments = partition.segments()
    old = RemoteLogManager(env.open())
    old.copy_rolled_segments(TP, segments[:1], segments[1].base_offset)
    RemoteLogManager(env.open())  # a newer owner
    before = env.snapshot()
    for change in (
        lambda: old.copy_rolled_segments(TP, segments, partition.logs[-1].end_offset + 1),
        lambda: old.enforce_retention(TP, retention_bytes=0),
        lambda: old.delete_partition(TP),
    ):
        with pytest.raises(Fenced):
            change()
    assert env.snapshot() == before
    follower_storage = ChunkedSegmentStorage(0, None, env.binding, env.store, read_only=True)
    env.instances.append(follower_storage)
    follower = RemoteLogManager(follower_storage)
    assert consume(follower, 0) == partition.records(slice(0, 1))
    with pytest.raises(ReadOnlyInstance):
        follower.copy_rolled_segments(TP, segments, partition.logs[-1].end_offset + 1)
    assert env.snapshot() == before


@pytest.mark.parametrize(
    "damage",
    ["flipped byte in a record", "truncated batch", "index into a batch", "odd index", "bad checkpoint"],
)
def test_bad_segment_files_are_refused_before_anything_is_written(
    env: Env, tmp_path: Path, damage: str
) -> None:
    partition = make_partition(tmp_path / "payments-7", [30, 30, 30])
    manager = RemoteLogManager(env.open())
    manager.copy_rolled_segments(TP, partition.segments()[:1], partition.logs[1].base_offset)
    second = partition.segments()[1].data
    log = Path(second.log).read_bytes()
    if damage == "flipped byte in a record":
        position = partition.logs[1].batches[5].position + 70
        Path(second.log).write_bytes(log[:position] + bytes([log[position] ^ 0xFF]) + log[position + 1 :])
    elif damage == "truncated batch":
        Path(second.log).write_bytes(log[:-7])
    elif damage == "index into a batch":
        index = bytearray(Path(second.offset_index).read_bytes())
        index[4:8] = (int.from_bytes(index[4:8], "big") + 3).to_bytes(4, "big")
        Path(second.offset_index).write_bytes(bytes(index))
    elif damage == "odd index":
        Path(second.offset_index).write_bytes(Path(second.offset_index).read_bytes() + b"\x00")
    else:
        (partition.folder / "leader-epoch-checkpoint").write_bytes(b"0\n3\n0 0\n")
    before = env.snapshot()
    with pytest.raises(InvalidLogSegment) as caught:
        manager.copy_rolled_segments(TP, partition.segments(), partition.logs[-1].end_offset + 1)
    assert str(TP) in caught.value.segment and f"{partition.logs[1].base_offset:020d}" in caught.value.segment
    if damage != "bad checkpoint":
        assert caught.value.position is not None or caught.value.offset is not None
    assert env.snapshot() == before, "a refused segment changed the store"


def test_local_segments_reads_a_partition_folder(tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [5, 5])
    found = local_segments(partition.folder)
    assert [s.base_offset for s in found] == [0, partition.logs[1].base_offset]
    with pytest.raises(InvalidArgument):
        local_segments(tmp_path / "missing")
    (partition.folder / f"{partition.logs[1].base_offset:020d}.index").unlink()
    with pytest.raises(InvalidArgument, match="no \\.index"):
        local_segments(partition.folder)


def test_random_fetches_match_the_log(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [80, 80], value_bytes=400)
    manager = RemoteLogManager(env.open())
    manager.copy_rolled_segments(TP, partition.segments(), partition.logs[-1].end_offset + 1)
    records = partition.records()
    rng = random.Random(3)
    for _ in range(40):
        offset = rng.randrange(len(records))
        budget = rng.choice([1, 500, 5000, 50000])
        result = manager.fetch(TP, offset, budget)
        decoded = decode_records(result.records)
        assert decoded[0][0] <= offset and records[offset] in decoded
        assert len(result.records) <= budget or len(decode_records(result.records)) <= 2 * 3
        assert [r for r in decoded if r[0] >= offset] == records[offset : decoded[-1][0] + 1]
