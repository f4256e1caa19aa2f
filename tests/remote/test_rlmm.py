"""The remote log metadata manager against Kafka's semantics (RemoteLogMetadataCacheTest,
RemoteLogSegmentLifecycleTest, RemoteLogLeaderEpochStateTest) and a plain model.

Runs on memory+memory and filesystem+LMDB: the tables are ordinary tables of the
container's store, changed through its fenced commits.
"""

from __future__ import annotations

import itertools
import random
import struct
import uuid

import pytest

from slts.errors import (
    Fenced,
    IllegalStateTransition,
    InvalidArgument,
    ReadOnlyInstance,
    RemoteSegmentNotFound,
)
from slts.metadata.schema import REMOTE_EPOCHS
from slts.remote import keys
from slts.remote import rlmm as rlmm_module
from slts.remote.records import (
    PartitionDeleteState,
    RemoteLogSegmentMetadata,
    SegmentState,
    TopicPartition,
    new_segment_metadata,
)
from slts.remote.rlmm import RemoteLogMetadataManager
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, env_fixture
from tests.support.faults import faulty_owner

TP = TopicPartition("orders", 3)
S = SegmentState
env = env_fixture([("memory", "memory"), ("filesystem", "lmdb")])


@pytest.fixture
def rlmm(env: Env) -> RemoteLogMetadataManager:
    return RemoteLogMetadataManager(env.open())


def segment(
    start: int, end: int, epochs: dict[int, int] | None = None, tp: TopicPartition = TP
) -> RemoteLogSegmentMetadata:
    return new_segment_metadata(
        tp,
        start_offset=start,
        end_offset=end,
        leader_epochs=epochs or {0: start},
        max_timestamp_ms=1000 + end,
        size_bytes=(end - start + 1) * 100,
    )


def copied(rlmm: RemoteLogMetadataManager, metadata: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
    rlmm.add_segment(metadata)
    return rlmm.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED)


def test_a_segment_is_visible_to_reads_only_while_copy_finished(rlmm: RemoteLogMetadataManager) -> None:
    metadata = segment(0, 99)
    rlmm.add_segment(metadata)
    assert rlmm.segment_for_offset(TP, 50) is None, "COPY_SEGMENT_STARTED is invisible to readers"
    assert rlmm.segment_for_offset(TP, 50, 0) is None
    assert [m.id for m in rlmm.list_segments(TP)] == [metadata.id], "but listed, for cleanup"
    assert rlmm.highest_offset_for_epoch(TP, 0) is None
    assert rlmm.earliest_offset(TP) is None

    finished = rlmm.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED, event_timestamp_ms=7)
    assert finished.segment_state == S.COPY_SEGMENT_FINISHED and finished.event_timestamp_ms == 7
    for offset in (0, 50, 99):
        assert rlmm.segment_for_offset(TP, offset) == finished
        assert rlmm.segment_for_offset(TP, offset, 0) == finished
    assert rlmm.segment_for_offset(TP, 100) is None
    assert rlmm.segment_for_offset(TP, 50, 1) is None, "no segment under another epoch"
    assert rlmm.highest_offset_for_epoch(TP, 0) == 99
    assert rlmm.earliest_offset(TP) == 0
    assert rlmm.segment(metadata.id) == finished

    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED)
    assert rlmm.segment_for_offset(TP, 50) is None, "DELETE_SEGMENT_STARTED is invisible to readers"
    assert [m.segment_state for m in rlmm.list_segments(TP)] == [S.DELETE_SEGMENT_STARTED]
    assert rlmm.highest_offset_for_epoch(TP, 0) == 99, "deletes do not lower the highest offset"

    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_FINISHED)
    assert list(rlmm.list_segments(TP)) == []
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.segment(metadata.id)


def test_a_failed_copy_goes_straight_to_deletion(rlmm: RemoteLogMetadataManager) -> None:
    metadata = segment(0, 9)
    rlmm.add_segment(metadata)
    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED)
    assert rlmm.segment_for_offset(TP, 5) is None
    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_FINISHED)
    assert list(rlmm.list_segments(TP)) == []


LEGAL = {
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED),
    (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED),
    (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED),
    (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED),
}
PATHS = {  # how to bring a segment into each state
    S.COPY_SEGMENT_STARTED: [],
    S.COPY_SEGMENT_FINISHED: [S.COPY_SEGMENT_FINISHED],
    S.DELETE_SEGMENT_STARTED: [S.DELETE_SEGMENT_STARTED],
}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(PATHS, S)))
def test_every_transition_is_legal_or_changes_nothing(
    env: Env, rlmm: RemoteLogMetadataManager, current: SegmentState, target: SegmentState
) -> None:
    metadata = segment(0, 9)
    rlmm.add_segment(metadata)
    for step in PATHS[current]:
        rlmm.update_segment(metadata.id, step)
    before = env.store.dump()
    if target == S.COPY_SEGMENT_STARTED:  # Kafka's RLMM refuses it as an illegal argument
        with pytest.raises(InvalidArgument, match="add_segment"):
            rlmm.update_segment(metadata.id, target)
        assert env.store.dump() == before
        return
    if (current, target) in LEGAL or current == target:
        assert rlmm.update_segment(metadata.id, target).segment_state == target
        if target == S.DELETE_SEGMENT_FINISHED:
            with pytest.raises(RemoteSegmentNotFound):
                rlmm.segment(metadata.id)
        else:
            assert rlmm.segment(metadata.id).segment_state == target
        return
    with pytest.raises(IllegalStateTransition) as caught:
        rlmm.update_segment(metadata.id, target)
    assert caught.value.current == current and caught.value.target == target
    assert env.store.dump() == before, "an illegal transition changed the store"
    assert rlmm.segment(metadata.id).segment_state == current


def test_a_new_segment_must_start_in_copy_started_and_an_id_is_added_once(
    env: Env, rlmm: RemoteLogMetadataManager
) -> None:
    metadata = segment(0, 9)
    with pytest.raises(InvalidArgument, match="COPY_SEGMENT_STARTED"):
        rlmm.add_segment(metadata.replace(state=int(S.COPY_SEGMENT_FINISHED)))
    rlmm.add_segment(metadata)
    rlmm.add_segment(metadata)  # the identical record again: a retry, nothing changes
    rlmm.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED)
    before = env.store.dump()
    with pytest.raises(IllegalStateTransition):
        rlmm.add_segment(metadata)  # the id is past COPY_SEGMENT_STARTED
    with pytest.raises(IllegalStateTransition):
        rlmm.add_segment(metadata.replace(end_offset=8))
    assert env.store.dump() == before


def test_a_leader_change_superset_supersedes_the_older_upload(rlmm: RemoteLogMetadataManager) -> None:
    """Kafka's case 1: leader 0 uploaded 0-100, the next leader re-uploads 0-200 of the
    same epoch; lookups go to the superset, the old one stays listed for cleanup."""
    old = copied(rlmm, segment(0, 100))
    new = copied(rlmm, segment(0, 200))
    assert rlmm.segment_for_offset(TP, 50, 0) == new
    assert rlmm.segment_for_offset(TP, 150) == new
    assert {m.id for m in rlmm.list_segments(TP)} == {old.id, new.id}
    assert rlmm.highest_offset_for_epoch(TP, 0) == 200


def test_overlapping_uploads_after_a_leader_change(rlmm: RemoteLogMetadataManager) -> None:
    """Kafka's case 2: 10-90 by one leader, then 5-100 and 101-200 by the next: 95 is in
    the second upload, and so is 50."""
    first = copied(rlmm, segment(10, 90))
    second = copied(rlmm, segment(5, 100, {0: 5}))
    third = copied(rlmm, segment(101, 200, {0: 101}))
    assert rlmm.segment_for_offset(TP, 95, 0) == second
    assert rlmm.segment_for_offset(TP, 50, 0) == second
    assert rlmm.segment_for_offset(TP, 150, 0) == third
    assert [m.id for m in rlmm.list_segments(TP)] == [second.id, first.id, third.id], "by start offset"


def test_an_unclean_election_new_leaders_lineage_wins(rlmm: RemoteLogMetadataManager) -> None:
    """Leader of epoch 0 uploaded 0-99; after an unclean election the new leader's log
    diverged at 80 (epoch 1 from 80) and it uploads 0-150 with epochs {0: 0, 1: 80}."""
    old = copied(rlmm, segment(0, 99))
    new = copied(rlmm, segment(0, 150, {0: 0, 1: 80}))
    for offset in (0, 79, 80, 99, 150):
        assert rlmm.segment_for_offset(TP, offset) == new, offset
    assert rlmm.segment_for_offset(TP, 79, 0) == new
    assert rlmm.segment_for_offset(TP, 85, 0) is None, "85 is in epoch 1 of the new lineage, not epoch 0"
    assert rlmm.segment_for_offset(TP, 85, 1) == new
    assert rlmm.highest_offset_for_epoch(TP, 0) == 99, "the highest ever copied in epoch 0"
    assert rlmm.highest_offset_for_epoch(TP, 1) == 150
    assert old.id in {m.id for m in rlmm.list_segments(TP)}


def test_lookups_at_every_offset_of_hundreds_of_segments_and_epochs_match_a_model(
    rlmm: RemoteLogMetadataManager,
) -> None:
    """300 segments of 1 to 40 offsets, the leader epoch bumped at random offsets (some
    segments span two or three epochs); every offset and every (epoch, offset) pair."""
    rng = random.Random(5)
    epoch_starts: dict[int, int] = {0: 0}
    owner: dict[int, RemoteLogSegmentMetadata] = {}
    start, epoch = 0, 0
    for _ in range(300):
        end = start + rng.randrange(1, 41) - 1
        epochs = {epoch: start}
        for offset in range(start + 1, end + 1):
            if rng.random() < 0.02:
                epoch += rng.randrange(1, 3)
                epochs[epoch] = offset
                epoch_starts[epoch] = offset
        metadata = copied(rlmm, segment(start, end, epochs))
        for offset in range(start, end + 1):
            owner[offset] = metadata
        start = end + 1
    assert len(epoch_starts) >= 5, "the program has several leader epochs"
    ordered = sorted(epoch_starts.items())
    for offset, expected in owner.items():
        assert rlmm.segment_for_offset(TP, offset) == expected, offset
        epoch_of = max(e for e, first in ordered if first <= offset)
        assert rlmm.segment_for_offset(TP, offset, epoch_of) == expected, (offset, epoch_of)
    assert rlmm.segment_for_offset(TP, start) is None, "past the highest copied offset"
    for e, _ in ordered:
        later = [f for other, f in ordered if other > e]
        assert rlmm.highest_offset_for_epoch(TP, e) == (min(later) - 1 if later else start - 1)


def test_a_lookup_without_an_epoch_tries_only_the_epochs_spanning_the_offset(env: Env) -> None:
    """100 epochs of one 10-offset segment each: a lookup without an epoch searches one
    epoch's offset map, not all of them (the partition keeps each epoch's copied range),
    and deleting segments does not narrow a range below what was copied. The searches are
    the ``floor`` reads of the offset maps the store is asked for."""
    storage, _, store = faulty_owner(env)  # no faults: its read observer only
    rlmm = RemoteLogMetadataManager(storage)
    made = [copied(rlmm, segment(10 * e, 10 * e + 9, {e: 10 * e})) for e in range(100)]
    searched: list[int] = []
    partition = keys.partition_key(TP)

    def observe(method: str, table: str, key: bytes) -> None:
        if method == "floor" and table == REMOTE_EPOCHS:
            assert key.startswith(partition), key
            searched.append(struct.unpack_from(">I", key, len(partition))[0])

    store.on_read = observe
    for offset in (0, 455, 999):
        searched.clear()
        assert rlmm.segment_for_offset(TP, offset) == made[offset // 10]
        assert searched == [offset // 10], (offset, searched)
    for metadata in made[:50]:
        rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED)
        rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_FINISHED)
    searched.clear()
    assert rlmm.segment_for_offset(TP, 5) is None
    assert searched == [0], "epoch 0 still spans offset 5: its copied range is not narrowed"
    assert rlmm.segment_for_offset(TP, 1000) is None


def test_listing_is_sorted_streamed_in_pages_and_filtered(
    rlmm: RemoteLogMetadataManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rlmm_module, "LIST_PAGE", 7)
    made = [segment(i * 10, i * 10 + 9, {i // 10: i * 10}) for i in range(40)]
    for metadata in reversed(made):  # added out of order
        rlmm.add_segment(metadata)
    for metadata in made[::3]:
        rlmm.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED)
    other = TopicPartition("orders", 4)
    rlmm.add_segment(segment(0, 5, tp=other))
    assert [m.start_offset for m in rlmm.list_segments(TP)] == [i * 10 for i in range(40)]
    assert [m.start_offset for m in rlmm.list_segments(TP, 155)] == [i * 10 for i in range(15, 40)]
    assert [m.start_offset for m in rlmm.list_segments(TP, leader_epoch=2)] == [i * 10 for i in range(20, 30)]
    assert [m.start_offset for m in rlmm.list_segments(other)] == [0]
    assert list(rlmm.partitions()) == [TP, other]
    streamed = rlmm.list_segments(TP)
    assert next(streamed).start_offset == 0, "a listing is a lazy stream"


def test_partition_deletion_markers(env: Env, rlmm: RemoteLogMetadataManager) -> None:
    metadata = copied(rlmm, segment(0, 9))
    with pytest.raises(IllegalStateTransition):
        rlmm.mark_partition(TP, PartitionDeleteState.DELETE_PARTITION_STARTED)
    rlmm.mark_partition(TP, PartitionDeleteState.DELETE_PARTITION_MARKED)
    rlmm.mark_partition(TP, PartitionDeleteState.DELETE_PARTITION_MARKED)  # a repeat
    assert rlmm.delete_state(TP) == PartitionDeleteState.DELETE_PARTITION_MARKED
    with pytest.raises(IllegalStateTransition, match="no new segments"):
        rlmm.add_segment(segment(10, 19))
    rlmm.mark_partition(TP, PartitionDeleteState.DELETE_PARTITION_STARTED)
    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED)
    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_FINISHED)
    rlmm.mark_partition(TP, PartitionDeleteState.DELETE_PARTITION_FINISHED)
    assert list(rlmm.partitions()) == [] and not rlmm.has_partition(TP)
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.delete_state(TP)
    copied(rlmm, segment(0, 4))  # the name is free again: a re-created topic
    assert rlmm.earliest_offset(TP) == 0


def test_the_log_start_offset_only_moves_forward(rlmm: RemoteLogMetadataManager) -> None:
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.move_log_start_offset(TP, 5)
    copied(rlmm, segment(0, 99))
    assert rlmm.move_log_start_offset(TP, 40) == 40
    assert rlmm.move_log_start_offset(TP, 10) == 40
    copied(rlmm, segment(100, 199, {0: 100}))
    assert rlmm.earliest_offset(TP) == 40


def test_a_follower_answers_from_the_same_store_and_changes_nothing(env: Env) -> None:
    owner = RemoteLogMetadataManager(env.open())
    metadata = copied(owner, segment(0, 99))
    follower_storage = ChunkedSegmentStorage(0, None, env.binding, env.store, read_only=True)
    env.instances.append(follower_storage)
    follower = RemoteLogMetadataManager(follower_storage)
    assert follower.segment_for_offset(TP, 42) == metadata
    second = copied(owner, segment(100, 199, {1: 100}))
    assert follower.segment_for_offset(TP, 150) == second, "strongly consistent: the change is seen at once"
    before = env.store.dump()
    for change in (
        lambda: follower.add_segment(segment(200, 299, {1: 200})),
        lambda: follower.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED),
        lambda: follower.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED),  # a no-op for an owner
        lambda: follower.move_log_start_offset(TP, 0),
        lambda: follower.mark_partition(TP, PartitionDeleteState.DELETE_PARTITION_MARKED),
    ):
        with pytest.raises(ReadOnlyInstance):
            change()
    assert env.store.dump() == before


def test_a_fenced_instance_changes_nothing(env: Env) -> None:
    old = RemoteLogMetadataManager(env.open())
    metadata = copied(old, segment(0, 99))
    started = segment(100, 199)
    old.add_segment(started)
    RemoteLogMetadataManager(env.open())  # a newer owner takes the container
    before = env.store.dump()
    for change in (
        lambda: old.add_segment(segment(200, 299)),
        lambda: old.add_segment(started),  # identical: a no-op for an owner
        lambda: old.update_segment(started.id, S.COPY_SEGMENT_FINISHED),
        lambda: old.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED),  # a no-op for an owner
        lambda: old.move_log_start_offset(TP, 50),
        lambda: old.move_log_start_offset(TP, 0),  # a no-op for an owner
        lambda: old.mark_partition(TP, PartitionDeleteState.DELETE_PARTITION_MARKED),
    ):
        with pytest.raises(Fenced):
            change()
    assert env.store.dump() == before


def test_bad_input_is_a_typed_error_and_changes_nothing(env: Env, rlmm: RemoteLogMetadataManager) -> None:
    metadata = copied(rlmm, segment(0, 9))
    before = env.store.dump()
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.update_segment(uuid.uuid4(), S.COPY_SEGMENT_FINISHED)
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.segment(uuid.uuid4())
    for call in (
        lambda: rlmm.add_segment("segment"),  # type: ignore[arg-type]
        lambda: rlmm.update_segment(str(metadata.id), S.COPY_SEGMENT_FINISHED),  # type: ignore[arg-type]
        lambda: rlmm.update_segment(metadata.id, 1),  # type: ignore[arg-type]
        lambda: rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED, event_timestamp_ms=-1),
        lambda: rlmm.segment_for_offset(TP, -1),
        lambda: rlmm.segment_for_offset(TP, True),  # type: ignore[arg-type]
        lambda: rlmm.segment_for_offset(TP, 2**63),
        lambda: rlmm.segment_for_offset(TP, 0, -1),
        lambda: rlmm.segment_for_offset(TP, 0, 2**31),
        lambda: rlmm.segment_for_offset("orders-3", 0),  # type: ignore[arg-type]
        lambda: rlmm.list_segments(TP, -5),
        lambda: rlmm.highest_offset_for_epoch(TP, "0"),  # type: ignore[arg-type]
        lambda: TopicPartition("bad topic", 0),
        lambda: TopicPartition("t" * 250, 0),
        lambda: TopicPartition("orders", -1),
        lambda: TopicPartition.parse("orders"),
        lambda: segment(10, 5),
        lambda: segment(0, 9, {0: 1}),
        lambda: segment(0, 9, {0: 0, 1: 20}),
        lambda: segment(0, 9, {1: 0, 0: 5}),
        lambda: new_segment_metadata(
            TP, start_offset=0, end_offset=9, leader_epochs={}, max_timestamp_ms=0, size_bytes=1
        ),
    ):
        with pytest.raises(InvalidArgument):
            call()
    assert env.store.dump() == before
    assert TopicPartition.parse("my-topic-12") == TopicPartition("my-topic", 12)
