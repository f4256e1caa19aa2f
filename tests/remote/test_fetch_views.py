"""The fetch path's own parts: partition views in the RLMM (``slts.remote.partition_views``)
answer as the store does and are never served stale, whoever commits (another RLMM,
another instance, another process); batches read as views of ranged reads
(``kafka_formats.iter_batch_views``) are ``iter_batches``'s; the offset index's bounds
hold the batch of every offset; damaged remote bytes fail a fetch with InvalidLogSegment."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slts.bindings.memory import MemoryChunkStorage
from slts.tools.kafka_logs import build_log, decode_records, write_log_dir

from slts.config import StorageConfig
from slts.errors import InvalidLogSegment, InvalidOffset, RemoteOffsetOutOfRange, RemoteSegmentNotFound
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.memory_store import MemoryMetadataStore
from slts.metadata.schema import TABLES
from slts.metadata.store import MetadataStore
from slts.remote import kafka_formats as kf
from slts.remote import partition_views
from slts.remote.index_cache import OffsetIndexCache
from slts.remote.manager import RemoteLogManager
from slts.remote.records import (
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicPartition,
    new_segment_metadata,
)
from slts.remote.rlmm import RemoteLogMetadataManager
from slts.storage.chunked import ChunkedSegmentStorage
from tests.remote.test_remote_log import make_partition
from tests.support.engine import Env, env_fixture

TP = TopicPartition("payments", 7)
S = SegmentState
env = env_fixture([("memory", "memory"), ("filesystem", "lmdb")])


def segment(start: int, end: int, epochs: dict[int, int]) -> RemoteLogSegmentMetadata:
    return new_segment_metadata(
        TP,
        start_offset=start,
        end_offset=end,
        leader_epochs=epochs,
        max_timestamp_ms=end,
        size_bytes=(end - start + 1) * 10,
    )


def container(store: MetadataStore) -> ChunkedSegmentStorage:
    return ChunkedSegmentStorage(0, None, MemoryChunkStorage(), store, StorageConfig(gc_interval_s=0.0))


# -- views against the store --------------------------------------------------------------------------

#: One change: (kind, start, length, epoch numbers, which earlier segment).
changes = st.tuples(
    st.sampled_from(["copy", "copy", "copy", "start-only", "delete", "half-delete", "log-start", "mark"]),
    st.integers(0, 120),
    st.integers(1, 40),
    st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True),
    st.integers(0, 30),
)


def apply(writer: RemoteLogMetadataManager, change: tuple, made: list[RemoteLogSegmentMetadata]) -> None:
    kind, start, length, epochs, which = change
    if kind in ("copy", "start-only"):
        end = start + length - 1
        ordered = sorted(epochs)
        starts = sorted({start, *(start + (length * n) // len(ordered) for n in range(1, len(ordered)))})
        metadata = segment(start, end, dict(zip(ordered, starts, strict=False)))
        try:
            writer.add_segment(metadata)
        except Exception:
            return
        made.append(metadata)
        if kind == "copy":
            writer.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED)
    elif kind in ("delete", "half-delete") and made:
        metadata = made[which % len(made)]
        steps = [S.DELETE_SEGMENT_STARTED] + ([S.DELETE_SEGMENT_FINISHED] if kind == "delete" else [])
        for state in steps:
            try:
                writer.update_segment(metadata.id, state)
            except Exception:
                break
    elif kind == "log-start" and writer.has_partition(TP):
        writer.move_log_start_offset(TP, start)
    elif kind == "mark" and writer.has_partition(TP):
        for state in list(PartitionDeleteState)[: 1 + which % 3]:
            try:
                writer.mark_partition(TP, state)
            except Exception:
                continue


def check_same(reader: RemoteLogMetadataManager, offsets: list[int]) -> None:
    """Every lookup of ``reader``'s view equals the store's (the general path)."""
    view = reader.view(TP)
    if not reader.has_partition(TP):
        assert view is None
        return
    if reader.delete_state(TP) is not None:
        assert view is None, "a marked partition is not viewed"
        return
    assert view is not None
    assert view.record.log_start_offset == reader.log_start_offset(TP)
    assert dict(sorted(view.record.highest_offsets.items())) == reader.leader_epochs(TP)
    for offset in offsets:
        for epoch in (None, 0, 1, 2, 3, 4):
            expected = reader.segment_for_offset(TP, offset, epoch)
            assert reader.segment_in_view(view, offset, epoch) == expected, (offset, epoch)


@pytest.mark.parametrize("kind", ["memory", "lmdb"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(changes, st.lists(st.integers(0, 170), max_size=6)), max_size=25))
def test_a_view_answers_as_the_store_after_every_change_by_another_rlmm(
    kind: str, steps: list[tuple[tuple, list[int]]]
) -> None:
    """The reader's views learn intervals between changes; the writer (another RLMM on
    the same store) commits; each lookup of the reader after it equals the store's."""
    with tempfile.TemporaryDirectory() as folder:
        store = (
            LmdbMetadataStore(folder, TABLES, durable=False)
            if kind == "lmdb"
            else MemoryMetadataStore(TABLES)
        )
        storage = container(store)
        try:
            reader = RemoteLogMetadataManager(storage)
            writer = RemoteLogMetadataManager(storage)
            made: list[RemoteLogSegmentMetadata] = []
            for change, offsets in steps:
                check_same(reader, offsets)
                apply(writer, change, made)
                check_same(reader, [*offsets, change[1], change[1] + change[2] - 1])
        finally:
            storage.close()
            store.close()


def test_a_learned_interval_is_not_served_after_a_change(env: Env) -> None:
    """Offsets a view answered from memory are looked up again once a commit changed the
    partition: superseded by a re-upload of a new leader, deleted, or forgotten."""
    rlmm = RemoteLogMetadataManager(env.open())
    other = RemoteLogMetadataManager(env.instances[-1])
    old = segment(0, 99, {0: 0})
    other.add_segment(old)
    other.update_segment(old.id, S.COPY_SEGMENT_FINISHED)
    view = rlmm.view(TP)
    assert view is not None and rlmm.segment_in_view(view, 50) == other.segment(old.id)
    assert rlmm.view(TP) is view, "nothing committed: the same view, no read"
    new = segment(0, 120, {0: 0, 1: 60})  # a new leader's upload covering the old one
    other.add_segment(new)
    other.update_segment(new.id, S.COPY_SEGMENT_FINISHED)
    fresh = rlmm.view(TP)
    assert fresh is not None and fresh is not view
    assert rlmm.segment_in_view(fresh, 50).id == new.id  # type: ignore[union-attr]
    assert rlmm.segment_in_view(fresh, 110).id == new.id  # type: ignore[union-attr]
    other.update_segment(new.id, S.DELETE_SEGMENT_STARTED)
    after = rlmm.view(TP)
    assert after is not None and rlmm.segment_in_view(after, 110) is None
    assert rlmm.segment_in_view(after, 50) is None, "the old one was superseded under epoch 0"
    for state in PartitionDeleteState:
        other.mark_partition(TP, state)
    assert rlmm.view(TP) is None
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.segment_in_view(after, 10)  # a view kept past its partition's end: the store answers


def test_a_stale_view_asked_again_answers_from_the_store(env: Env) -> None:
    """A view held across a commit (a fetch's, while retention runs) finds its version gone
    on its next store lookup and is answered by the store as it is now."""
    rlmm = RemoteLogMetadataManager(env.open())
    first, second = segment(0, 49, {0: 0}), segment(50, 99, {0: 50})
    for metadata in (first, second):
        rlmm.add_segment(metadata)
        rlmm.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED)
    view = rlmm.view(TP)
    assert view is not None and rlmm.segment_in_view(view, 10).id == first.id  # type: ignore[union-attr]
    rlmm.update_segment(first.id, S.DELETE_SEGMENT_STARTED)
    assert rlmm.segment_in_view(view, 10).id == first.id, "learned: the view's version answers"  # type: ignore[union-attr]
    with pytest.raises(partition_views.StaleView):
        view.segment_for_offset(70)  # not learned: the store's version is not the view's
    assert rlmm.segment_in_view(view, 70).id == second.id  # type: ignore[union-attr]
    assert rlmm.view(TP) is not view


def test_views_and_intervals_are_bounded(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_views, "INTERVALS_MAX", 3)
    monkeypatch.setattr(partition_views, "VIEWS_MAX", 2)
    rlmm = RemoteLogMetadataManager(env.open())
    for number in range(6):
        metadata = segment(number * 10, number * 10 + 9, {0: number * 10})
        rlmm.add_segment(metadata)
        rlmm.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED)
    view = rlmm.view(TP)
    assert view is not None
    for offset in range(0, 60, 3):
        assert rlmm.segment_in_view(view, offset).start_offset == offset // 10 * 10  # type: ignore[union-attr]
        assert view._learned <= 3
    monkeypatch.setattr(partition_views, "INTERVALS_TOTAL_MAX", 2)
    rlmm.view(TP)
    assert rlmm.view(TP) is not view, "over the total: every view dropped"
    for number in range(3):
        tp = TopicPartition("other", number)
        rlmm.add_segment(
            new_segment_metadata(
                tp, start_offset=0, end_offset=0, leader_epochs={0: 0}, max_timestamp_ms=0, size_bytes=1
            )
        )
        rlmm.view(tp)
        assert len(rlmm._views) <= 2


# -- views across instances and processes ---------------------------------------------------------------


def test_a_followers_fetch_sees_the_owners_retention_and_copies(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [30, 30, 30])
    owner = RemoteLogManager(env.open())
    owner.copy_rolled_segments(TP, partition.local(last_stable_offset=partition.logs[2].base_offset))
    follower_storage = ChunkedSegmentStorage(0, None, env.binding, env.store, read_only=True)
    env.instances.append(follower_storage)
    follower = RemoteLogManager(follower_storage)
    first = partition.logs[0].records[5][0]
    assert decode_records(follower.fetch(TP, first, 1).records)[0][0] <= first
    third = partition.logs[2].records[5][0]
    with pytest.raises(RemoteOffsetOutOfRange):
        follower.fetch(TP, third, 1)
    owner.copy_rolled_segments(TP, partition.local())
    assert third in [r[0] for r in decode_records(follower.fetch(TP, third, 1).records)]
    keep = len(partition.logs[1].data) + len(partition.logs[2].data) + len(partition.active.data)
    assert [
        m.start_offset for m in owner.enforce_retention(TP, partition.local(), retention_bytes=keep).deleted
    ] == [0]
    with pytest.raises(RemoteOffsetOutOfRange):
        follower.fetch(TP, first, 1)


_OWNER_RUN = """
import sys
import slts
from slts.remote import RemoteLogManager, TopicPartition, local_log
folder, log_dir, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
storage = slts.open("file://" + folder + "/chunks", metadata=folder + "/metadata", gc_interval_s=0.0)
manager = RemoteLogManager(storage)
log = local_log(log_dir)
tp = TopicPartition("payments", 7)
copied = manager.copy_rolled_segments(tp, log).copied
deleted = manager.enforce_retention(tp, log, retention_bytes=keep).deleted
print(len(copied), len(deleted))
storage.close()
"""


def test_a_fetch_sees_another_processes_copy_and_retention(tmp_path: Path) -> None:
    """A follower in this process keeps a view of the partition (two segments); the owner
    in another process copies the third and deletes the first, moving the log start
    offset; the follower's next fetches read the third and find the first out of range
    (LMDB's change marker moved: the view is checked again)."""
    import slts

    partition = make_partition(tmp_path / "payments-7", [30, 30, 30])
    store = tmp_path / "store"
    owner = slts.open(f"file://{store}/chunks", metadata=f"{store}/metadata", gc_interval_s=0.0)
    RemoteLogManager(owner).copy_rolled_segments(
        TP, partition.local(last_stable_offset=partition.logs[2].base_offset)
    )
    owner.close()
    follower_storage = slts.open(
        f"file://{store}/chunks", metadata=f"{store}/metadata", gc_interval_s=0.0, read_only=True
    )
    try:
        follower = RemoteLogManager(follower_storage)
        first, second, third = (log.records[7][0] for log in partition.logs)
        for offset in (first, second):
            assert offset in [r[0] for r in decode_records(follower.fetch(TP, offset, 1).records)]
        with pytest.raises(RemoteOffsetOutOfRange):
            follower.fetch(TP, third, 1)
        keep = len(partition.logs[1].data) + len(partition.logs[2].data) + len(partition.active.data)
        out = subprocess.run(
            [sys.executable, "-c", _OWNER_RUN, str(store), str(partition.folder), str(keep)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split() == ["1", "1"], out
        assert third in [r[0] for r in decode_records(follower.fetch(TP, third, 1).records)]
        with pytest.raises(RemoteOffsetOutOfRange):
            follower.fetch(TP, first, 1)
        assert second in [r[0] for r in decode_records(follower.fetch(TP, second, 1).records)]
    finally:
        follower_storage.close()


# -- batches from ranged reads ------------------------------------------------------------------------

LOG = build_log(1000, 40, records_per_batch=4, seed=5, value_bytes=300, interval_bytes=2048)


def reads_of(data: bytes, reads: list[tuple[int, int]]):
    def read(position: int, length: int) -> memoryview:
        assert position >= 0 and position + length <= len(data), (position, length)
        reads.append((position, length))
        return memoryview(data)[position : position + length]

    return read


@settings(max_examples=80, deadline=None)
@given(first=st.integers(0, len(LOG.batches) - 1), ahead=st.integers(0, 40_000), more=st.integers(0, 20_000))
def test_batch_views_are_the_batches_iter_batches_reads(first: int, ahead: int, more: int) -> None:
    start = LOG.batches[first].position
    reads: list[tuple[int, int]] = []
    views = kf.iter_batch_views(
        reads_of(LOG.data, reads), len(LOG.data), start, min(len(LOG.data), start + ahead), more_bytes=more
    )
    got = [(header, bytes(batch)) for header, batch in views]
    expected = list(kf.iter_batches(io.BytesIO(LOG.data[start:]).read, start_position=start))
    assert got == expected
    assert sum(length for _, length in reads) <= len(LOG.data) - start, "no byte is read twice"


def test_batch_views_read_one_batch_when_asked_for_it() -> None:
    batch = LOG.batches[7]
    reads: list[tuple[int, int]] = []
    views = kf.iter_batch_views(
        reads_of(LOG.data, reads), len(LOG.data), batch.position, batch.position + batch.size
    )
    header, view = next(views)
    assert (header.base_offset, bytes(view)) == (
        batch.base_offset,
        LOG.data[batch.position : batch.position + batch.size],
    )
    assert reads == [(batch.position, batch.size)]
    reads.clear()
    cut = kf.iter_batch_views(reads_of(LOG.data, reads), len(LOG.data), batch.position, batch.position + 100)
    assert bytes(next(cut)[1]) == LOG.data[batch.position : batch.position + batch.size]
    assert reads == [(batch.position, 100), (batch.position + 100, batch.size - 100)], (
        "completed by what it lacks"
    )


@pytest.mark.parametrize("damage", ["flipped byte", "cut at the end", "cut header"])
def test_batch_views_refuse_damage(damage: str) -> None:
    data = bytearray(LOG.data)
    batch = LOG.batches[3]
    if damage == "flipped byte":
        data[batch.position + batch.size - 5] ^= 0xFF
    else:
        del data[batch.position + (batch.size - 3 if damage == "cut at the end" else 30) :]
    views = kf.iter_batch_views(reads_of(bytes(data), []), len(data), 0, min(len(data), 5000), segment="x")
    with pytest.raises(InvalidLogSegment, match="'x'") as caught:
        list(views)
    assert caught.value.context["position"] == batch.position


def test_the_index_bounds_hold_the_batch_of_every_offset() -> None:
    cache = OffsetIndexCache()
    index = cache.get(uuid.uuid4(), LOG.base_offset, lambda: LOG.offset_index)
    assert len(index.offsets) > 5
    for batch in LOG.batches:
        for offset in range(batch.base_offset, batch.last_offset + 1):
            low, at, high = index.bounds(offset)
            assert low <= batch.position and batch.position + batch.size <= (
                len(LOG.data) if high is None else high
            )
            assert at is None or low <= at


# -- fetches of damaged or vanished remote bytes -------------------------------------------------------


def test_a_fetch_of_damaged_remote_bytes_is_invalid_log_segment(env: Env, tmp_path: Path) -> None:
    """Bytes damaged before the copy (copied without validation) fail the fetch that
    reaches them; the other batches still read."""
    log = build_log(0, 20, records_per_batch=3, seed=1, value_bytes=200)
    folder = tmp_path / "payments-7"
    write_log_dir(folder, log)
    write_log_dir(folder, build_log(log.end_offset + 1, 2, records_per_batch=3, seed=2))
    path = folder / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    bad = log.batches[9]
    data[bad.position + bad.size - 7] ^= 0x55
    path.write_bytes(bytes(data))
    (folder / "leader-epoch-checkpoint").write_bytes(log.leader_epoch_checkpoint)
    from slts.remote.local_log import local_log

    manager = RemoteLogManager(env.open(), validate=False)
    manager.copy_rolled_segments(TP, local_log(folder))
    with pytest.raises(InvalidLogSegment, match="CRC") as caught:
        manager.fetch(TP, bad.base_offset + 1, 1)
    assert caught.value.context["position"] == bad.position
    for good in (log.batches[0], log.batches[-1]):  # before it, and past the index entry after it
        assert decode_records(manager.fetch(TP, good.base_offset, 1).records)[0][0] == good.base_offset


def test_damage_past_the_batch_of_a_fetch_does_not_fail_it(env: Env, tmp_path: Path) -> None:
    """Batches above the index interval, indexed every other one (an older follower's
    index, as Kafka accepts): a fetch in an unindexed batch first tries the batch at the
    next entry, finds it damaged, and reads the stretch before it, which holds the
    fetch's batch; a fetch of the damaged batch itself fails."""
    log = build_log(0, 10, records_per_batch=4, seed=3, value_bytes=3000)
    assert all(batch.size > kf.DEFAULT_INDEX_INTERVAL_BYTES for batch in log.batches)
    sparse = kf.encode_offset_index(
        [kf.OffsetIndexEntry(b.last_offset, b.position) for b in log.batches[2::2]], log.base_offset
    )
    folder = tmp_path / "payments-7"
    write_log_dir(folder, dataclasses.replace(log, offset_index=sparse))
    write_log_dir(folder, build_log(log.end_offset + 1, 2, records_per_batch=3, seed=2))
    (folder / "leader-epoch-checkpoint").write_bytes(log.leader_epoch_checkpoint)
    path = folder / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    damaged, holder = log.batches[4], log.batches[3]
    data[damaged.position + damaged.size - 9] ^= 0x21
    path.write_bytes(bytes(data))
    from slts.remote.local_log import local_log

    manager = RemoteLogManager(env.open(), validate=False)
    manager.copy_rolled_segments(TP, local_log(folder))
    result = manager.fetch(TP, holder.base_offset + 1, 1)
    assert result.records == log.data[holder.position : holder.position + holder.size]
    with pytest.raises(InvalidLogSegment, match="CRC"):
        manager.fetch(TP, damaged.base_offset, 1)


def test_read_log_ranges_and_a_deleted_log(env: Env, tmp_path: Path) -> None:
    partition = make_partition(tmp_path / "payments-7", [20, 20])
    manager = RemoteLogManager(env.open())
    first = manager.copy_rolled_segments(TP, partition.local()).copied[0]
    data = partition.logs[0].data
    assert bytes(manager.rsm.read_log(first, 10, 100)) == data[10:110]
    assert bytes(manager.rsm.read_log(first, len(data), 0)) == b""
    for position, length in ((len(data) - 1, 2), (-1, 1), (0, -1), (True, 1)):
        with pytest.raises(InvalidOffset):
            manager.rsm.read_log(first, position, length)  # type: ignore[arg-type]
    manager.rsm.delete_log_segment(first)
    with pytest.raises(RemoteSegmentNotFound):
        manager.rsm.read_log(first, 10, 100)
