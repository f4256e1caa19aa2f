"""Remote log segment metadata (KIP-405): the records, their states and legal transitions.

A *remote log segment* is one rolled log segment of a topic-partition copied to SLTS. Its
``RemoteLogSegmentMetadata`` says which offsets it holds (``start_offset`` to
``end_offset``, both inclusive, as in Kafka), under which leader epochs
(``leader_epochs``: epoch -> the first offset of that epoch in the segment, ascending in
both), its size, its largest record timestamp, and its ``state``:

::

    COPY_SEGMENT_STARTED ──> COPY_SEGMENT_FINISHED ──> DELETE_SEGMENT_STARTED ──> DELETE_SEGMENT_FINISHED
              └───────────────────────────────────────────────^  (a failed copy is deleted)

A change to the state it already has is legal too (Kafka's rule: retries after a failover
repeat a change). A partition has its own deletion marker: ``DELETE_PARTITION_MARKED ->
DELETE_PARTITION_STARTED -> DELETE_PARTITION_FINISHED``.

The records are ``slts.metadata.records.Record`` subclasses: versioned msgpack maps that
keep unknown fields and check their invariants on encode (``AssertionError``: a bug) and
decode (``MetadataCorrupted``). The checks of *input* (``check_*``) raise
``InvalidArgument`` with a message that says what was wrong.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from slts.chunk_names import unique_hex
from slts.errors import IllegalStateTransition, InvalidArgument
from slts.metadata.records import Record

_EMPTY: Mapping[str, Any] = MappingProxyType({})
#: Kafka's offsets and timestamps are signed 64-bit; epochs and partitions signed 32-bit.
OFFSET_MAX = (1 << 63) - 1
EPOCH_MAX = (1 << 31) - 1
#: Kafka's own limit on a topic name, and its alphabet.
TOPIC_BYTES_MAX = 249
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
#: Custom metadata an RSM may attach to a segment (Kafka's default limit is 128 bytes).
CUSTOM_METADATA_BYTES_MAX = 1 << 16


class SegmentState(enum.IntEnum):
    """The state of a remote log segment (KIP-405 ``RemoteLogSegmentState``)."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


_SEGMENT_TRANSITIONS: Mapping[SegmentState | None, frozenset[SegmentState]] = {
    None: frozenset({SegmentState.COPY_SEGMENT_STARTED}),
    SegmentState.COPY_SEGMENT_STARTED: frozenset(
        {SegmentState.COPY_SEGMENT_FINISHED, SegmentState.DELETE_SEGMENT_STARTED}
    ),
    SegmentState.COPY_SEGMENT_FINISHED: frozenset({SegmentState.DELETE_SEGMENT_STARTED}),
    SegmentState.DELETE_SEGMENT_STARTED: frozenset({SegmentState.DELETE_SEGMENT_FINISHED}),
    SegmentState.DELETE_SEGMENT_FINISHED: frozenset(),
}


class PartitionDeleteState(enum.IntEnum):
    """The deletion marker of a remote partition (KIP-405 ``RemotePartitionDeleteState``)."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


_PARTITION_TRANSITIONS: Mapping[PartitionDeleteState | None, frozenset[PartitionDeleteState]] = {
    None: frozenset({PartitionDeleteState.DELETE_PARTITION_MARKED}),
    PartitionDeleteState.DELETE_PARTITION_MARKED: frozenset({PartitionDeleteState.DELETE_PARTITION_STARTED}),
    PartitionDeleteState.DELETE_PARTITION_STARTED: frozenset(
        {PartitionDeleteState.DELETE_PARTITION_FINISHED}
    ),
    PartitionDeleteState.DELETE_PARTITION_FINISHED: frozenset(),
}


def is_legal(current: SegmentState | None, target: SegmentState) -> bool:
    """Whether a segment in ``current`` (None: unknown) may go to ``target``."""
    return target == current or target in _SEGMENT_TRANSITIONS[current]


def check_transition(current: SegmentState | None, target: SegmentState, *, what: str) -> None:
    """Raise ``IllegalStateTransition`` unless ``current -> target`` is legal."""
    if not is_legal(current, target):
        name = current.name if current is not None else "unknown"
        raise IllegalStateTransition(
            f"{what}: {name} cannot change to {target.name}", current=current, target=target
        )


def check_partition_transition(
    current: PartitionDeleteState | None, target: PartitionDeleteState, *, what: str
) -> None:
    """Raise ``IllegalStateTransition`` unless the partition marker may go ``current -> target``."""
    if target != current and target not in _PARTITION_TRANSITIONS[current]:
        name = current.name if current is not None else "not marked"
        raise IllegalStateTransition(
            f"{what}: {name} cannot change to {target.name}", current=current, target=target
        )


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """A Kafka topic-partition; ``str()`` is Kafka's ``topic-partition`` form."""

    topic: str
    partition: int

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not _TOPIC.fullmatch(self.topic) or self.topic in {".", ".."}:
            raise InvalidArgument(
                f"topic {self.topic!r}: 1 to {TOPIC_BYTES_MAX} of A-Z a-z 0-9 . _ - (not . or ..)",
                topic=self.topic,
            )
        if isinstance(self.partition, bool) or not isinstance(self.partition, int):
            raise InvalidArgument(f"partition {self.partition!r} is not an integer", topic=self.topic)
        if not 0 <= self.partition <= EPOCH_MAX:
            raise InvalidArgument(f"partition {self.partition} is outside 0..{EPOCH_MAX}", topic=self.topic)

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TopicPartition:
        """``"orders-3"`` -> ``TopicPartition("orders", 3)``; ``InvalidArgument`` otherwise."""
        topic, _, number = text.rpartition("-") if isinstance(text, str) else ("", "", "")
        if not topic or not number.isdigit() or not number.isascii():
            raise InvalidArgument(f"{text!r} is not TOPIC-PARTITION (for example orders-3)")
        return cls(topic, int(number))


def check_offset(value: object, what: str) -> int:
    """``value`` if it is a Kafka offset (an int in 0..2**63-1), else ``InvalidArgument``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= OFFSET_MAX:
        raise InvalidArgument(f"{what} {value!r} is not an offset (an integer in 0..{OFFSET_MAX})")
    return value


def check_epoch(value: object, what: str = "leader epoch") -> int:
    """``value`` if it is a leader epoch (an int in 0..2**31-1), else ``InvalidArgument``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= EPOCH_MAX:
        raise InvalidArgument(f"{what} {value!r} is not an integer in 0..{EPOCH_MAX}")
    return value


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata(Record):
    """One remote log segment (KIP-405 ``RemoteLogSegmentMetadata``). Offsets inclusive."""

    KIND: ClassVar[str] = "remote-segment"

    segment_id: bytes  # a UUID's 16 bytes (``id`` gives the ``uuid.UUID``)
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    size_bytes: int
    #: leader epoch -> the first offset of that epoch in this segment, both ascending.
    leader_epochs: Mapping[int, int]
    state: int = SegmentState.COPY_SEGMENT_STARTED
    custom_metadata: bytes | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def id(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.segment_id)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def segment_state(self) -> SegmentState:
        return SegmentState(self.state)

    def epoch_end_offset(self, epoch: int) -> int:
        """The last offset of ``epoch`` in this segment (the next epoch's start - 1, or the end)."""
        assert epoch in self.leader_epochs, (epoch, self.leader_epochs)
        later = [start for other, start in self.leader_epochs.items() if other > epoch]
        return min(later) - 1 if later else self.end_offset

    def epoch_ranges(self) -> list[tuple[int, int, int]]:
        """(epoch, first offset, last offset) of every epoch in the segment, ascending."""
        return [
            (epoch, start, self.epoch_end_offset(epoch))
            for epoch, start in sorted(self.leader_epochs.items())
        ]

    def check(self) -> None:
        assert isinstance(self.segment_id, bytes) and len(self.segment_id) == 16, self.segment_id
        TopicPartition(self.topic, self.partition)
        assert 0 <= self.start_offset <= self.end_offset <= OFFSET_MAX, self
        assert self.size_bytes >= 0 and self.broker_id >= 0, self
        assert self.leader_epochs, "a segment has at least one leader epoch"
        epochs = sorted(self.leader_epochs.items())
        assert epochs[0][1] == self.start_offset, ("the first epoch starts at the segment's start", epochs)
        starts = [start for _, start in epochs]
        assert starts == sorted(set(starts)) and starts[-1] <= self.end_offset, epochs
        assert all(0 <= epoch <= EPOCH_MAX for epoch, _ in epochs), epochs
        assert self.state in SegmentState.__members__.values(), self.state
        assert self.custom_metadata is None or isinstance(self.custom_metadata, bytes), self


def new_segment_metadata(
    topic_partition: TopicPartition,
    *,
    start_offset: int,
    end_offset: int,
    leader_epochs: Mapping[int, int],
    max_timestamp_ms: int,
    size_bytes: int,
    broker_id: int = 0,
    event_timestamp_ms: int = 0,
    segment_id: uuid.UUID | None = None,
    custom_metadata: bytes | None = None,
) -> RemoteLogSegmentMetadata:
    """A COPY_SEGMENT_STARTED record for a new upload, its input checked.

    Raises ``InvalidArgument`` naming the field: offsets outside 0..2**63-1 or end below
    start, no leader epoch, an epoch whose first offset is outside the segment or out of
    order, the first epoch not starting at ``start_offset``, a negative size or broker id,
    custom metadata that is not bytes or longer than ``CUSTOM_METADATA_BYTES_MAX``.
    """
    if not isinstance(topic_partition, TopicPartition):
        raise InvalidArgument(f"{topic_partition!r} is not a TopicPartition")
    where = f"remote segment of {topic_partition}"
    check_offset(start_offset, f"{where}: start offset")
    check_offset(end_offset, f"{where}: end offset")
    if end_offset < start_offset:
        raise InvalidArgument(f"{where}: end offset {end_offset} is below start offset {start_offset}")
    if not isinstance(leader_epochs, Mapping) or not leader_epochs:
        raise InvalidArgument(f"{where}: leader epochs must be a non-empty mapping epoch -> first offset")
    epochs = sorted(
        (check_epoch(e, f"{where}: leader epoch"), check_offset(o, f"{where}: epoch start"))
        for e, o in leader_epochs.items()
    )
    starts = [start for _, start in epochs]
    if starts[0] != start_offset or starts != sorted(set(starts)) or starts[-1] > end_offset:
        raise InvalidArgument(
            f"{where}: leader epochs {dict(epochs)} must start at {start_offset}, "
            f"ascend in epoch and offset and stay within {start_offset}..{end_offset}"
        )
    for value, what in ((max_timestamp_ms, "max timestamp"), (event_timestamp_ms, "event timestamp")):
        if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= OFFSET_MAX:
            raise InvalidArgument(f"{where}: {what} {value!r} is not a timestamp in ms (-1 for none)")
    for value, what in ((size_bytes, "size"), (broker_id, "broker id")):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= OFFSET_MAX:
            raise InvalidArgument(f"{where}: {what} {value!r} is not a non-negative integer")
    if custom_metadata is not None and (
        not isinstance(custom_metadata, bytes) or len(custom_metadata) > CUSTOM_METADATA_BYTES_MAX
    ):
        raise InvalidArgument(
            f"{where}: custom metadata must be bytes of at most {CUSTOM_METADATA_BYTES_MAX}"
        )
    if segment_id is not None and not isinstance(segment_id, uuid.UUID):
        raise InvalidArgument(f"{where}: segment id {segment_id!r} is not a uuid.UUID")
    return RemoteLogSegmentMetadata(
        segment_id=(segment_id or uuid.UUID(hex=unique_hex(), version=4)).bytes,
        topic=topic_partition.topic,
        partition=topic_partition.partition,
        start_offset=start_offset,
        end_offset=end_offset,
        max_timestamp_ms=max_timestamp_ms,
        broker_id=broker_id,
        event_timestamp_ms=event_timestamp_ms,
        size_bytes=size_bytes,
        leader_epochs=dict(epochs),
        state=SegmentState.COPY_SEGMENT_STARTED,
        custom_metadata=custom_metadata,
    )


@dataclass(frozen=True, slots=True)
class RemotePartitionRecord(Record):
    """What the store keeps per remote partition: its deletion marker, the earliest offset
    still readable remotely (moved by retention, never back), the highest offset copied
    per leader epoch (Kafka's ``highestOffsetForEpoch``: never lowered by deletes) and the
    lowest epoch start ever copied per leader epoch (so that a lookup without an epoch
    tries only the epochs whose copied range can hold the offset)."""

    KIND: ClassVar[str] = "remote-partition"

    topic: str
    partition: int
    log_start_offset: int | None
    highest_offsets: Mapping[int, int]
    lowest_offsets: Mapping[int, int]
    delete_state: int | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def check(self) -> None:
        TopicPartition(self.topic, self.partition)
        assert self.log_start_offset is None or 0 <= self.log_start_offset <= OFFSET_MAX + 1, self
        assert all(0 <= e <= EPOCH_MAX and 0 <= o <= OFFSET_MAX for e, o in self.highest_offsets.items()), (
            self
        )
        assert self.lowest_offsets.keys() == self.highest_offsets.keys(), self
        assert all(self.lowest_offsets[e] <= o for e, o in self.highest_offsets.items()), self
        assert self.delete_state is None or self.delete_state in PartitionDeleteState.__members__.values(), (
            self
        )
