"""The RLMM case by case against Kafka's own tests of its RLMM.

Each test names the Kafka test case it ports (``RemoteLogMetadataCacheTest``,
``RemoteLogSegmentLifecycleTest``, ``RemoteLogLeaderEpochStateTest``,
``RemoteLogMetadataManagerTest``, ``TopicBasedRemoteLogMetadataManagerTest``) and states
the behaviour it pins, in SLTS terms: Kafka's leader-epoch state objects are SLTS's
per-epoch offset maps, a segment "referenced" in them is one ``is_referenced`` reports,
an epoch's "unreferenced" set is the rest of ``list_segments(tp, leader_epoch=e)``. Where
Kafka drops an illegal change silently, SLTS raises ``IllegalStateTransition``; in both
nothing changes. Kafka's cases of an uninitialised cache (events replayed from its
metadata topic) and of an inconsistent cache (a listed id with no metadata) have no
counterpart: the store is consistent after every commit.

The last tests pin where SLTS does more than Kafka's tests say: partitions never seen or
forgotten, forgetting a partition in several commits, the two start offsets.
"""

from __future__ import annotations

import uuid

import pytest

from slts.errors import IllegalStateTransition, InvalidArgument, MetadataError, RemoteSegmentNotFound
from slts.metadata.schema import REMOTE_EPOCHS, REMOTE_OFFSETS, REMOTE_PARTITIONS, REMOTE_SEGMENTS
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
from tests.support.engine import Env, env_fixture
from tests.support.faults import faulty_owner

TP = TopicPartition("foo", 0)
OTHER = TopicPartition("foo", 1)
S = SegmentState
P = PartitionDeleteState
SEGMENT_BYTES = 1 << 20
env = env_fixture([("memory", "memory"), ("filesystem", "lmdb")])


@pytest.fixture
def rlmm(env: Env) -> RemoteLogMetadataManager:
    return RemoteLogMetadataManager(env.open())


def segment(
    start: int,
    end: int,
    epochs: dict[int, int] | None = None,
    tp: TopicPartition = TP,
    size: int = SEGMENT_BYTES,
) -> RemoteLogSegmentMetadata:
    return new_segment_metadata(
        tp,
        start_offset=start,
        end_offset=end,
        leader_epochs=epochs or {0: start},
        max_timestamp_ms=-1,
        size_bytes=size,
    )


def upsert(
    rlmm: RemoteLogMetadataManager, metadata: RemoteLogSegmentMetadata, state: SegmentState
) -> RemoteLogSegmentMetadata:
    """Add ``metadata`` and move it to ``state`` in one update (Kafka's ``upsertSegmentState``)."""
    rlmm.add_segment(metadata)
    return rlmm.update_segment(metadata.id, state)


def finished(
    rlmm: RemoteLogMetadataManager, start: int, end: int, epoch: int = 0
) -> RemoteLogSegmentMetadata:
    """A one-epoch segment copied: Kafka's epoch-state cases give (start, epoch end) pairs."""
    return upsert(rlmm, segment(start, end, {epoch: start}), S.COPY_SEGMENT_FINISHED)


def ids(segments: object) -> list[uuid.UUID]:
    return [m.id for m in segments]  # type: ignore[attr-defined]


def partition_records(env: Env, tp: TopicPartition) -> dict[str, int]:
    """How many records of ``tp`` each remote table holds."""
    prefix = keys.partition_key(tp)
    dump = env.store.dump()
    counts = {
        table: sum(1 for key in dump[table] if key.startswith(prefix))
        for table in (REMOTE_EPOCHS, REMOTE_OFFSETS, REMOTE_PARTITIONS)
    }
    counts[REMOTE_SEGMENTS] = sum(
        1
        for stored in dump[REMOTE_SEGMENTS].values()
        if RemoteLogSegmentMetadata.decode(stored.value).topic_partition == tp
    )
    return counts


# -- RemoteLogMetadataCacheTest -----------------------------------------------------------------


@pytest.mark.parametrize(
    "state", [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]
)
def test_a_new_segment_in_any_state_but_copy_started_is_refused(
    env: Env, rlmm: RemoteLogMetadataManager, state: SegmentState
) -> None:
    """testCacheAddMetadataOnInvalidArgs: adding a record not in COPY_SEGMENT_STARTED (or
    no record) is an illegal argument."""
    before = env.store.dump()
    with pytest.raises(InvalidArgument, match="COPY_SEGMENT_STARTED"):
        rlmm.add_segment(segment(0, 100).replace(state=int(state)))
    with pytest.raises(InvalidArgument):
        rlmm.add_segment(None)  # type: ignore[arg-type]
    assert env.store.dump() == before


@pytest.mark.parametrize(
    "state", [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED]
)
def test_an_update_of_an_unknown_segment_is_not_found(
    env: Env, rlmm: RemoteLogMetadataManager, state: SegmentState
) -> None:
    """testCacheUpdateMetadataOnInvalidArgs (initialised cache): an update of a segment
    id never added raises not found (or an illegal argument for no id)."""
    finished(rlmm, 0, 100)
    before = env.store.dump()
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.update_segment(uuid.uuid4(), state)
    with pytest.raises(InvalidArgument):
        rlmm.update_segment(None, state)  # type: ignore[arg-type]
    assert env.store.dump() == before


def test_an_invalid_transition_leaves_the_segment_as_it_was(env: Env, rlmm: RemoteLogMetadataManager) -> None:
    """testDropEventOnInvalidStateTransition: one segment at epoch 5 walks through eight
    updates; after each, the listing of epoch 5 holds it in the expected state (or, after
    DELETE_SEGMENT_FINISHED, is empty). Invalid updates change nothing: SLTS raises
    IllegalStateTransition, and InvalidArgument for an update to COPY_SEGMENT_STARTED."""
    metadata = segment(10, 100, {5: 10})
    rlmm.add_segment(metadata)
    steps: list[tuple[SegmentState, type[Exception] | None, SegmentState | None]] = [
        (S.DELETE_SEGMENT_FINISHED, IllegalStateTransition, S.COPY_SEGMENT_STARTED),
        (S.COPY_SEGMENT_FINISHED, None, S.COPY_SEGMENT_FINISHED),
        (S.DELETE_SEGMENT_FINISHED, IllegalStateTransition, S.COPY_SEGMENT_FINISHED),
        (S.COPY_SEGMENT_STARTED, InvalidArgument, S.COPY_SEGMENT_FINISHED),
        (S.DELETE_SEGMENT_STARTED, None, S.DELETE_SEGMENT_STARTED),
        (S.COPY_SEGMENT_FINISHED, IllegalStateTransition, S.DELETE_SEGMENT_STARTED),
        (S.COPY_SEGMENT_STARTED, InvalidArgument, S.DELETE_SEGMENT_STARTED),
        (S.DELETE_SEGMENT_FINISHED, None, None),
    ]
    for target, error, expected in steps:
        before = env.store.dump()
        if error is None:
            rlmm.update_segment(metadata.id, target)
        else:
            with pytest.raises(error):
                rlmm.update_segment(metadata.id, target)
            assert env.store.dump() == before, target
        listed = list(rlmm.list_segments(TP, leader_epoch=5))
        if expected is None:
            assert listed == []
        else:
            assert [(m.id, m.segment_state) for m in listed] == [(metadata.id, expected)], target


def test_an_update_to_copy_started_is_an_illegal_argument_even_from_copy_started(
    env: Env, rlmm: RemoteLogMetadataManager
) -> None:
    """Kafka's RLMM refuses every update to COPY_SEGMENT_STARTED as an illegal argument,
    the repeat of a segment's own state COPY_SEGMENT_STARTED too (its cache: "can not be
    updated"); a repeat of any other state stays legal (isValidTransition)."""
    metadata = segment(0, 9)
    rlmm.add_segment(metadata)
    before = env.store.dump()
    with pytest.raises(InvalidArgument, match="COPY_SEGMENT_STARTED"):
        rlmm.update_segment(metadata.id, S.COPY_SEGMENT_STARTED)
    with pytest.raises(InvalidArgument, match="COPY_SEGMENT_STARTED"):
        rlmm.update_segment(uuid.uuid4(), S.COPY_SEGMENT_STARTED)  # refused before the lookup
    assert env.store.dump() == before
    for state in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED):
        rlmm.update_segment(metadata.id, state)
        assert rlmm.update_segment(metadata.id, state).segment_state == state, "a repeat is legal"


# -- RemoteLogSegmentLifecycleTest --------------------------------------------------------------


def test_the_segment_lifecycle_across_leader_epochs(rlmm: RemoteLogMetadataManager) -> None:
    """testRemoteLogSegmentLifeCycle: four segments over epochs 0-4; lookups by (epoch,
    offset), then the first segment deleted, then the highest offset of every epoch
    (deletes do not lower it)."""
    first = segment(0, 100, {0: 0, 1: 20, 2: 80})
    rlmm.add_segment(first)
    assert rlmm.segment_for_offset(TP, 40, 1) is None, "not readable while being copied"
    for epoch in (0, 1, 2):
        assert rlmm.highest_offset_for_epoch(TP, epoch) is None, "a copy in progress has no highest offset"
    first = rlmm.update_segment(first.id, S.COPY_SEGMENT_FINISHED)
    second = upsert(rlmm, segment(101, 200, {2: 101}), S.COPY_SEGMENT_FINISHED)
    third = upsert(rlmm, segment(201, 300, {2: 201, 3: 240}), S.COPY_SEGMENT_FINISHED)
    fourth = upsert(rlmm, segment(250, 400, {3: 250, 4: 370}), S.COPY_SEGMENT_FINISHED)

    expected = {
        (1, 40): first,
        (2, 110): second,
        (3, 240): third,
        (3, 250): fourth,
        (4, 375): fourth,
        (1, 110): None,  # 110 is not in epoch 1
        (4, 401): None,  # past the last offset
        (5, 301): None,  # no such epoch
    }
    for (epoch, offset), metadata in expected.items():
        assert rlmm.segment_for_offset(TP, offset, epoch) == metadata, (epoch, offset)

    rlmm.update_segment(first.id, S.DELETE_SEGMENT_STARTED)
    assert rlmm.segment_for_offset(TP, 10, 0) is None
    rlmm.update_segment(first.id, S.DELETE_SEGMENT_FINISHED)
    assert rlmm.segment_for_offset(TP, 10, 0) is None

    highest = {0: 19, 1: 79, 2: 239, 3: 369, 4: 400}
    for epoch, offset in highest.items():
        assert rlmm.highest_offset_for_epoch(TP, epoch) == offset, epoch
    assert rlmm.highest_offset_for_epoch(TP, 5) is None


def test_a_segment_being_copied_is_listed_but_not_found(rlmm: RemoteLogMetadataManager) -> None:
    """testCacheSegmentWithCopySegmentStartedState."""
    metadata = segment(0, 50)
    rlmm.add_segment(metadata)
    assert rlmm.segment_for_offset(TP, 0, 0) is None
    assert list(rlmm.list_segments(TP, leader_epoch=0)) == [metadata]
    assert list(rlmm.list_segments(TP)) == [metadata]


def test_a_copied_segment_is_found_and_listed(rlmm: RemoteLogMetadataManager) -> None:
    """testCacheSegmentWithCopySegmentFinishedState."""
    metadata = upsert(rlmm, segment(101, 200), S.COPY_SEGMENT_FINISHED)
    assert rlmm.segment_for_offset(TP, 150, 0) == metadata
    assert list(rlmm.list_segments(TP, leader_epoch=0)) == [metadata]
    assert list(rlmm.list_segments(TP)) == [metadata]


def test_a_segment_being_deleted_is_listed_but_not_found(rlmm: RemoteLogMetadataManager) -> None:
    """testCacheSegmentWithDeleteSegmentStartedState (straight from COPY_SEGMENT_STARTED)."""
    metadata = upsert(rlmm, segment(201, 300), S.DELETE_SEGMENT_STARTED)
    assert rlmm.segment_for_offset(TP, 250, 0) is None
    assert list(rlmm.list_segments(TP, leader_epoch=0)) == [metadata]
    assert list(rlmm.list_segments(TP)) == [metadata]


def test_a_deleted_segment_is_neither_found_nor_listed(rlmm: RemoteLogMetadataManager) -> None:
    """testCacheSegmentsWithDeleteSegmentFinishedState."""
    metadata = upsert(rlmm, segment(301, 400), S.DELETE_SEGMENT_STARTED)
    assert rlmm.segment_for_offset(TP, 350, 0) is None
    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_FINISHED)
    assert list(rlmm.list_segments(TP, leader_epoch=0)) == []
    assert list(rlmm.list_segments(TP)) == []


def test_listing_by_epoch_is_ordered_by_start_offset(rlmm: RemoteLogMetadataManager) -> None:
    """testCacheListSegments: epoch 0 lists all three in start-offset order, epoch 1 the
    one segment that holds it; the whole listing has the same three."""
    first = upsert(rlmm, segment(0, 100), S.COPY_SEGMENT_FINISHED)
    second = upsert(rlmm, segment(101, 200), S.COPY_SEGMENT_FINISHED)
    third = upsert(rlmm, segment(201, 400, {0: 201, 1: 301}), S.COPY_SEGMENT_FINISHED)
    assert list(rlmm.list_segments(TP, leader_epoch=0)) == [first, second, third]
    assert list(rlmm.list_segments(TP)) == [first, second, third], "Kafka: any order; SLTS: by start"
    assert list(rlmm.list_segments(TP, leader_epoch=1)) == [third]


# -- RemoteLogLeaderEpochStateTest --------------------------------------------------------------


def test_an_epoch_without_segments_lists_nothing(rlmm: RemoteLogMetadataManager) -> None:
    """testListAllRemoteLogSegmentsOnEmpty."""
    finished(rlmm, 0, 10, epoch=0)
    assert list(rlmm.list_segments(TP, leader_epoch=1)) == []


def test_an_epochs_listing_holds_unreferenced_segments_in_start_order(rlmm: RemoteLogMetadataManager) -> None:
    """testListAllRemoteLogSegmentsShouldReturnSortedSegments: a copy never finished at 0,
    5-10, 11-100, then 9-150 (which supersedes 11-100 but not 5-10, whose start is below
    its own): listed by start offset whatever their state."""
    started = segment(0, 4)
    rlmm.add_segment(started)
    low = finished(rlmm, 5, 10)
    superseded = finished(rlmm, 11, 100)
    wide = finished(rlmm, 9, 150)
    assert ids(rlmm.list_segments(TP, leader_epoch=0)) == [started.id, low.id, wide.id, superseded.id]
    assert [rlmm.is_referenced(m) for m in (low, superseded, wide)] == [True, False, True]
    assert rlmm.segment_for_offset(TP, 7, 0) == low
    assert rlmm.segment_for_offset(TP, 9, 0) == wide and rlmm.segment_for_offset(TP, 50, 0) == wide


def test_a_copy_in_progress_is_unreferenced(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithCopySegmentStartedState."""
    metadata = segment(0, 10)
    rlmm.add_segment(metadata)
    assert not rlmm.is_referenced(metadata)
    assert list(rlmm.list_segments(TP, leader_epoch=0)) == [metadata]


def test_consecutive_copies_are_both_referenced(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithCopySegmentFinishedState."""
    first, second = finished(rlmm, 10, 100), finished(rlmm, 101, 200)
    assert rlmm.is_referenced(first) and rlmm.is_referenced(second)
    assert rlmm.segment_for_offset(TP, 90, 0) == first
    assert rlmm.segment_for_offset(TP, 150, 0) == second
    assert rlmm.highest_offset_for_epoch(TP, 0) == 200


def test_an_overlapping_wider_copy_supersedes(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithCopySegmentFinishedStateForOverlappingSegments: 10-100, then 5-150."""
    first, second = finished(rlmm, 10, 100), finished(rlmm, 5, 150)
    assert not rlmm.is_referenced(first) and rlmm.is_referenced(second)
    assert rlmm.segment_for_offset(TP, 11, 0) == second
    assert rlmm.highest_offset_for_epoch(TP, 0) == 150
    assert ids(rlmm.list_segments(TP, leader_epoch=0)) == [second.id, first.id], "the superseded one stays"


def test_several_overlapping_copies_leave_the_widest(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithCopySegmentFinishedStateForMultipleOverlappingSegments: 10-100,
    5-150, 148-155, 4-200: only the last is referenced."""
    made = [finished(rlmm, 10, 100), finished(rlmm, 5, 150), finished(rlmm, 148, 155), finished(rlmm, 4, 200)]
    assert [rlmm.is_referenced(m) for m in made] == [False, False, False, True]
    assert rlmm.segment_for_offset(TP, 11, 0) == made[3]
    assert rlmm.highest_offset_for_epoch(TP, 0) == 200
    assert len(list(rlmm.list_segments(TP, leader_epoch=0))) == 4


def test_a_duplicate_copy_replaces_the_first(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithCopySegmentFinishedStateForDuplicateSegments: 10-100 twice."""
    first, second = finished(rlmm, 10, 100), finished(rlmm, 10, 100)
    assert rlmm.segment_for_offset(TP, 11, 0) == second
    assert not rlmm.is_referenced(first) and rlmm.is_referenced(second)
    assert rlmm.highest_offset_for_epoch(TP, 0) == 100


def test_a_longer_copy_at_the_same_start_replaces_the_first(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithCopySegmentFinishedStateForSegmentsWithSameStartOffset: 10-100,
    then 10-150."""
    first, second = finished(rlmm, 10, 100), finished(rlmm, 10, 150)
    assert rlmm.segment_for_offset(TP, 11, 0) == second
    assert rlmm.segment_for_offset(TP, 111, 0) == second
    assert not rlmm.is_referenced(first)
    assert rlmm.highest_offset_for_epoch(TP, 0) == 150


def test_segments_being_deleted_are_unreferenced_but_listed(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithDeleteSegmentStartedState."""
    first, second = finished(rlmm, 10, 100), finished(rlmm, 101, 200)
    for metadata in (first, second):
        rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED)
    assert not rlmm.is_referenced(first) and not rlmm.is_referenced(second)
    assert ids(rlmm.list_segments(TP, leader_epoch=0)) == [first.id, second.id]
    assert rlmm.segment_for_offset(TP, 50, 0) is None and rlmm.segment_for_offset(TP, 150) is None


def test_a_deleted_copy_in_progress_is_forgotten(rlmm: RemoteLogMetadataManager) -> None:
    """handleSegmentWithDeleteSegmentFinishedState (through DELETE_SEGMENT_STARTED: a
    copy in progress cannot jump to DELETE_SEGMENT_FINISHED)."""
    metadata = segment(0, 10)
    rlmm.add_segment(metadata)
    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED)
    rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_FINISHED)
    assert list(rlmm.list_segments(TP, leader_epoch=0)) == []


# -- RemoteLogMetadataManagerTest, TopicBasedRemoteLogMetadataManagerTest -----------------------


def test_a_segment_is_found_once_copied(rlmm: RemoteLogMetadataManager) -> None:
    """testFetchSegments."""
    metadata = segment(101, 200, {0: 101})
    rlmm.add_segment(metadata)
    assert rlmm.segment_for_offset(TP, 150, 0) is None
    copied = rlmm.update_segment(metadata.id, S.COPY_SEGMENT_FINISHED)
    assert rlmm.segment_for_offset(TP, 150, 0) == copied


def test_a_finished_partition_deletion_forgets_the_partition_whatever_remains(
    env: Env, rlmm: RemoteLogMetadataManager
) -> None:
    """testRemotePartitionDeletion: a copied segment stays readable while the partition is
    MARKED and STARTED; FINISHED (the segment still there) forgets the partition: a lookup
    raises not found. SLTS also drops every record of it, and its name is free again."""
    copied = upsert(rlmm, segment(0, 100, {0: 0, 1: 20, 2: 50, 3: 80}), S.COPY_SEGMENT_FINISHED)
    started = segment(101, 120, {3: 101})
    rlmm.add_segment(started)
    other = upsert(rlmm, segment(0, 100, tp=OTHER), S.COPY_SEGMENT_FINISHED)
    assert rlmm.segment_for_offset(TP, 30, 1) == copied
    for marker in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED):
        rlmm.mark_partition(TP, marker)
        assert rlmm.segment_for_offset(TP, 30, 1) == copied
    others_before = partition_records(env, OTHER)
    rlmm.mark_partition(TP, P.DELETE_PARTITION_FINISHED)
    with pytest.raises(RemoteSegmentNotFound, match="foo-0"):
        rlmm.segment_for_offset(TP, 30, 1)
    assert not rlmm.has_partition(TP)
    assert partition_records(env, TP) == dict.fromkeys(partition_records(env, TP), 0)
    for metadata in (copied, started):
        with pytest.raises(RemoteSegmentNotFound):
            rlmm.segment(metadata.id)
    assert partition_records(env, OTHER) == others_before, "another partition keeps everything"
    assert rlmm.segment_for_offset(OTHER, 50) == other
    with pytest.raises(RemoteSegmentNotFound):
        rlmm.mark_partition(TP, P.DELETE_PARTITION_FINISHED)  # nothing left to finish

    reborn = upsert(rlmm, segment(0, 9), S.COPY_SEGMENT_FINISHED)  # a re-created topic
    assert rlmm.segment_for_offset(TP, 30, 1) is None and rlmm.segment_for_offset(TP, 5) == reborn
    assert rlmm.leader_epochs(TP) == {0: 9} and rlmm.delete_state(TP) is None


def test_the_size_of_an_epochs_segments(rlmm: RemoteLogMetadataManager) -> None:
    """testRemoteLogSizeCalculation*: the sizes of the segments listed under an epoch
    (one epoch, three epochs, an epoch no segment has)."""
    for start, size in ((0, 1), (101, 2), (201, 3)):
        rlmm.add_segment(segment(start, start + 99, {0: start}, size=size * SEGMENT_BYTES))
    assert sum(m.size_bytes for m in rlmm.list_segments(TP, leader_epoch=0)) == 6 * SEGMENT_BYTES
    for epoch, (start, size) in enumerate(((0, 1), (101, 2), (201, 3))):
        rlmm.add_segment(segment(start, start + 99, {epoch: start}, tp=OTHER, size=size * SEGMENT_BYTES))
    for epoch, size in enumerate((1, 2, 3)):
        assert (
            sum(m.size_bytes for m in rlmm.list_segments(OTHER, leader_epoch=epoch)) == size * SEGMENT_BYTES
        )
    assert list(rlmm.list_segments(OTHER, leader_epoch=9001)) == []


def test_every_lookup_of_an_unknown_partition_raises_not_found(
    env: Env, rlmm: RemoteLogMetadataManager
) -> None:
    """testNewPartitionUpdates, testRemoteLogSizeCalculationForUnknownTopicIdPartitionThrows,
    RemotePartitionMetadataStore: a partition the RLMM does not know raises not found from
    every lookup; a listing raises at the call, not at its first item. ``has_partition``
    asks first."""
    finished(rlmm, 0, 9)
    unknown = TopicPartition("never-seen", 0)
    assert rlmm.has_partition(TP) and not rlmm.has_partition(unknown)
    lookups = {
        "segment_for_offset": lambda: rlmm.segment_for_offset(unknown, 5),
        "segment_for_offset under an epoch": lambda: rlmm.segment_for_offset(unknown, 5, 0),
        "earliest_offset": lambda: rlmm.earliest_offset(unknown),
        "log_start_offset": lambda: rlmm.log_start_offset(unknown),
        "highest_offset_for_epoch": lambda: rlmm.highest_offset_for_epoch(unknown, 0),
        "highest_offset": lambda: rlmm.highest_offset(unknown),
        "leader_epochs": lambda: rlmm.leader_epochs(unknown),
        "delete_state": lambda: rlmm.delete_state(unknown),
        "list_segments": lambda: rlmm.list_segments(unknown),
        "list_segments under an epoch": lambda: rlmm.list_segments(unknown, leader_epoch=0),
        "move_log_start_offset": lambda: rlmm.move_log_start_offset(unknown, 0),
        "mark_partition": lambda: rlmm.mark_partition(unknown, P.DELETE_PARTITION_MARKED),
    }
    before = env.store.dump()
    for name, lookup in lookups.items():
        with pytest.raises(RemoteSegmentNotFound, match="never-seen-0") as caught:
            lookup()
        assert caught.value.partition == "never-seen-0", name
    assert env.store.dump() == before
    with pytest.raises(InvalidArgument):
        rlmm.has_partition("never-seen-0")  # type: ignore[arg-type]


def test_the_lookups_of_a_known_partition_with_nothing_copied(rlmm: RemoteLogMetadataManager) -> None:
    """A partition whose only segment is being copied is known: its lookups answer empty."""
    metadata = segment(0, 9)
    rlmm.add_segment(metadata)
    assert rlmm.has_partition(TP)
    assert rlmm.segment_for_offset(TP, 5) is None and rlmm.segment_for_offset(TP, 5, 0) is None
    assert rlmm.earliest_offset(TP) is None and rlmm.log_start_offset(TP) is None
    assert rlmm.highest_offset(TP) is None and rlmm.highest_offset_for_epoch(TP, 0) is None
    assert rlmm.leader_epochs(TP) == {} and rlmm.delete_state(TP) is None
    assert list(rlmm.list_segments(TP)) == [metadata]


# -- the lookup under an epoch at its edges ---------------------------------------------------------


def test_the_lookup_under_an_epoch_at_its_edges(rlmm: RemoteLogMetadataManager) -> None:
    """RemoteLogMetadataCache.remoteLogSegmentMetadata: the floor entry of the epoch's map,
    and nothing if the offset is past that segment's part of the epoch; no other entry is
    tried. Epoch 2: 100-199, a gap, 300-349 (epoch 3 from 350 in the same segment)."""
    low = upsert(rlmm, segment(100, 199, {2: 100}), S.COPY_SEGMENT_FINISHED)
    high = upsert(rlmm, segment(300, 399, {2: 300, 3: 350}), S.COPY_SEGMENT_FINISHED)
    assert rlmm.segment_for_offset(TP, 99, 2) is None, "below the epoch's first entry"
    assert rlmm.segment_for_offset(TP, 100, 2) == low and rlmm.segment_for_offset(TP, 199, 2) == low
    assert rlmm.segment_for_offset(TP, 250, 2) is None, "past the floor segment's end: a gap"
    assert rlmm.segment_for_offset(TP, 349, 2) == high, "the epoch's last segment, to the epoch's end"
    assert rlmm.segment_for_offset(TP, 350, 2) is None, "350 is epoch 3's, even in the same segment"
    assert rlmm.segment_for_offset(TP, 350, 3) == high and rlmm.segment_for_offset(TP, 399, 3) == high
    assert rlmm.segment_for_offset(TP, 400, 3) is None, "past the epoch's last segment"
    assert rlmm.segment_for_offset(TP, 300, 3) is None, "before epoch 3 started"
    assert rlmm.highest_offset_for_epoch(TP, 2) == 349 and rlmm.highest_offset_for_epoch(TP, 3) == 399


def test_a_shorter_copy_does_not_supersede_and_the_floor_decides(rlmm: RemoteLogMetadataManager) -> None:
    """RemoteLogLeaderEpochState: a finished copy that does not reach the epoch's highest
    offset supersedes nothing; it takes the entry of its own start, and a lookup past its
    end finds nothing although an older segment holds the offset (Kafka's floor rule)."""
    wide = finished(rlmm, 0, 100)
    narrow = finished(rlmm, 50, 60)
    assert rlmm.is_referenced(wide) and rlmm.is_referenced(narrow)
    assert rlmm.segment_for_offset(TP, 40, 0) == wide
    assert rlmm.segment_for_offset(TP, 55, 0) == narrow
    assert rlmm.segment_for_offset(TP, 80, 0) is None
    assert rlmm.highest_offset_for_epoch(TP, 0) == 100


# -- forgetting a partition ---------------------------------------------------------------------------


def _many_segments(rlmm: RemoteLogMetadataManager, count: int) -> list[RemoteLogSegmentMetadata]:
    """``count`` segments of two epochs each, copied, plus one being copied."""
    made = [
        upsert(
            rlmm, segment(10 * i, 10 * i + 9, {2 * i: 10 * i, 2 * i + 1: 10 * i + 5}), S.COPY_SEGMENT_FINISHED
        )
        for i in range(count)
    ]
    started = segment(10 * count, 10 * count + 9, {2 * count: 10 * count})
    rlmm.add_segment(started)
    return [*made, started]


def test_a_partition_is_forgotten_in_one_commit(env: Env) -> None:
    storage, _, store = faulty_owner(env)
    rlmm = RemoteLogMetadataManager(storage)
    _many_segments(rlmm, 20)
    rlmm.mark_partition(TP, P.DELETE_PARTITION_MARKED)
    rlmm.mark_partition(TP, P.DELETE_PARTITION_STARTED)
    commits = store.calls["commit"]
    rlmm.mark_partition(TP, P.DELETE_PARTITION_FINISHED)
    assert store.calls["commit"] == commits + 1, "atomic: one commit"
    assert partition_records(env, TP) == dict.fromkeys(partition_records(env, TP), 0)


def test_a_huge_partition_is_forgotten_in_parts_and_a_repeat_carries_on(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ``FORGET_COMMIT_ITEMS`` records, FINISHED takes several commits: offset maps
    first, then segments with their listing entries, the partition record last. A crash
    between them leaves the partition known, still STARTED, its remaining records
    consistent (every lookup works); repeating FINISHED carries on."""
    monkeypatch.setattr(rlmm_module, "FORGET_COMMIT_ITEMS", 7)
    storage, _, store = faulty_owner(env)
    rlmm = RemoteLogMetadataManager(storage)
    made = _many_segments(rlmm, 12)
    rlmm.mark_partition(TP, P.DELETE_PARTITION_MARKED)
    rlmm.mark_partition(TP, P.DELETE_PARTITION_STARTED)
    assert partition_records(env, TP) == {
        REMOTE_EPOCHS: 24,
        REMOTE_OFFSETS: 13,
        REMOTE_PARTITIONS: 1,
        REMOTE_SEGMENTS: 13,
    }
    store.crash_at(5, landed=True)  # 4 commits of the 24 map entries (and 2 segments), then 3 segments
    with pytest.raises(MetadataError):
        rlmm.mark_partition(TP, P.DELETE_PARTITION_FINISHED)
    left = partition_records(env, TP)
    assert left[REMOTE_EPOCHS] == 0 and left[REMOTE_PARTITIONS] == 1
    assert 0 < left[REMOTE_SEGMENTS] == left[REMOTE_OFFSETS] < 13, left

    after = RemoteLogMetadataManager(env.open())  # the next owner
    assert after.has_partition(TP) and after.delete_state(TP) == P.DELETE_PARTITION_STARTED
    listed = list(after.list_segments(TP))
    assert len(listed) == left[REMOTE_SEGMENTS] and {m.id for m in listed} <= {m.id for m in made}
    assert all(after.segment_for_offset(TP, offset) is None for offset in range(0, 130, 3))
    after.mark_partition(TP, P.DELETE_PARTITION_FINISHED)
    assert partition_records(env, TP) == dict.fromkeys(left, 0)
    assert not after.has_partition(TP)


# -- the two start offsets -----------------------------------------------------------------------------


def test_nothing_left_to_read_has_no_earliest_offset_but_keeps_its_log_start(
    rlmm: RemoteLogMetadataManager,
) -> None:
    """``earliest_offset`` is where the remote log can be read from, None once nothing
    readable reaches the log start offset; ``log_start_offset`` is the stored floor, moved
    forward only."""
    first, second = finished(rlmm, 0, 99), finished(rlmm, 100, 199)
    assert rlmm.earliest_offset(TP) == rlmm.log_start_offset(TP) == 0
    rlmm.move_log_start_offset(TP, 100)
    assert rlmm.earliest_offset(TP) == rlmm.log_start_offset(TP) == 100
    rlmm.move_log_start_offset(TP, 200)  # retention moves the start past everything ...
    assert rlmm.earliest_offset(TP) is None, "nothing readable at or after 200"
    assert rlmm.log_start_offset(TP) == 200
    for metadata in (first, second):  # ... then deletes
        rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_STARTED)
        rlmm.update_segment(metadata.id, S.DELETE_SEGMENT_FINISHED)
    assert rlmm.earliest_offset(TP) is None and rlmm.log_start_offset(TP) == 200
    assert rlmm.highest_offset(TP) == 199, "deletes do not lower the highest offset"
    assert rlmm.move_log_start_offset(TP, 150) == 200, "never back"
    later = finished(rlmm, 200, 299)
    assert rlmm.earliest_offset(TP) == 200 and rlmm.segment_for_offset(TP, 200) == later


def test_the_earliest_offset_follows_what_lookups_can_resolve(rlmm: RemoteLogMetadataManager) -> None:
    """Deleting the last segment empties the readable log even though the start never
    moved; a segment being deleted, or one a later upload superseded and which is not
    readable any more, does not count."""
    only = finished(rlmm, 0, 99)
    rlmm.update_segment(only.id, S.DELETE_SEGMENT_STARTED)
    assert rlmm.earliest_offset(TP) is None and rlmm.log_start_offset(TP) == 0
    rlmm.update_segment(only.id, S.DELETE_SEGMENT_FINISHED)
    assert rlmm.earliest_offset(TP) is None

    old = finished(rlmm, 0, 150, epoch=1)
    new = upsert(rlmm, segment(0, 150, {1: 0, 2: 80}), S.COPY_SEGMENT_FINISHED)  # supersedes it in epoch 1
    assert not rlmm.is_referenced(old) and rlmm.earliest_offset(TP) == 0
    rlmm.move_log_start_offset(TP, 100)
    assert rlmm.earliest_offset(TP) == 100, "epoch 2 of the new upload reaches 100"
    rlmm.update_segment(new.id, S.DELETE_SEGMENT_STARTED)
    assert rlmm.segment_for_offset(TP, 120) is None, "the superseded upload is not readable"
    assert rlmm.earliest_offset(TP) is None
