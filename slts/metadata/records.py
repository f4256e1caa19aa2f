"""Metadata records: frozen, slotted dataclasses with a versioned msgpack codec.

Each record encodes as a msgpack map ``{"v": FORMAT_VERSION, <field>: <value>, ...}``.
Fields this code does not know (written by a newer version) are kept in ``extra`` and
written back unchanged on re-encode, so an older reader can round-trip a newer record.
A record checks its own invariants before encoding and after decoding
(``MetadataCorrupted`` on decode, ``AssertionError`` on encode: that is a bug).

Invariants of a ``SegmentRecord`` (asserted by ``check``):

* ``0 <= first_chunk_start_offset <= start_offset <= length`` when it has chunks,
  ``start_offset <= length`` always;
* ``first_chunk_start_offset <= last_chunk_start_offset <= length``;
* no chunks  <=>  ``chunk_count == 0``  <=>  ``first_chunk is None``  <=>  ``last_chunk is None``;
* one chunk  =>  ``first_chunk == last_chunk`` and both start offsets are equal;
* ``max_rolling_length > 0``; a deleted segment is not active.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import operator
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import msgpack

from slts.errors import MetadataCorrupted

FORMAT_VERSION = 1
_VERSION_KEY = "v"
_EMPTY: Mapping[str, Any] = MappingProxyType({})

R = TypeVar("R", bound="Record")


class SegmentStatus(enum.IntFlag):
    """Status bits of a segment."""

    ACTIVE = 1
    SEALED = 2
    DELETED = 4
    SYSTEM = 8


# The bits as plain ints: ``int & IntFlag`` goes through the enum (microseconds a test).
_ACTIVE, _SEALED, _DELETED = int(SegmentStatus.ACTIVE), int(SegmentStatus.SEALED), int(SegmentStatus.DELETED)


@dataclass(frozen=True, slots=True)
class Record:
    """Base of every record: the codec and the ``extra`` (unknown fields) carrier."""

    KIND: ClassVar[str] = "record"

    def check(self) -> None:
        """Raise ``AssertionError`` if the record breaks an invariant (override)."""

    @classmethod
    @functools.cache
    def _field_names(cls) -> tuple[str, ...]:
        """The record's own fields (not ``extra``), in declaration order, computed once
        per class."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")

    @classmethod
    @functools.cache
    def _field_values(cls) -> operator.attrgetter[Any]:
        """Reads the values of ``_field_names()``, then ``extra``, off a record as one tuple."""
        return operator.attrgetter(*cls._field_names(), "extra")

    @classmethod
    @functools.cache
    def _decoding(cls) -> tuple[tuple[str, ...], tuple[tuple[str, Any], ...]]:
        """The fields every encoding of this kind holds, and (name, default) of those added
        after the kind first shipped (a record written before them decodes with the
        default); in declaration order, so required then optional (dataclass rule)."""
        fields = [f for f in dataclasses.fields(cls) if f.name != "extra"]
        required = tuple(f.name for f in fields if f.default is dataclasses.MISSING)
        optional = tuple((f.name, f.default) for f in fields if f.default is not dataclasses.MISSING)
        assert [f.name for f in fields] == [*required, *(name for name, _ in optional)], cls
        return required, optional

    def encode(self) -> bytes:
        """msgpack bytes of this record, unknown fields included."""
        self.check()
        *values, extra = self._field_values()(self)
        payload = dict(zip(self._field_names(), values, strict=True))
        if extra:  # unknown fields first, as they were read
            payload = {**extra, **payload}
        payload[_VERSION_KEY] = FORMAT_VERSION
        return msgpack.packb(payload, use_bin_type=True)

    @classmethod
    def decode(cls: type[R], data: bytes) -> R:
        """The record encoded in ``data``; ``MetadataCorrupted`` if it is not a valid one."""
        try:
            payload = msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise MetadataCorrupted(f"{cls.KIND} record is not valid msgpack") from exc
        if not isinstance(payload, dict) or not isinstance(payload.get(_VERSION_KEY), int):
            raise MetadataCorrupted(f"{cls.KIND} record has no format version")
        del payload[_VERSION_KEY]
        required, optional = cls._decoding()
        try:
            values = [payload.pop(name) for name in required]
        except KeyError as exc:
            raise MetadataCorrupted(f"{cls.KIND} record lacks field {exc}") from exc
        values.extend(payload.pop(name, default) for name, default in optional)
        # Every concrete record declares ``extra`` last (a dataclass base cannot: defaults first).
        values.append(MappingProxyType(payload) if payload else _EMPTY)
        record = cls(*values)
        try:
            record.check()
        except (AssertionError, TypeError) as exc:
            raise MetadataCorrupted(f"{cls.KIND} record breaks an invariant: {exc}") from exc
        return record

    @classmethod
    @functools.cache
    def _positions(cls) -> dict[str, int]:
        """Each field's position among ``__init__``'s arguments (``extra`` last)."""
        return {name: i for i, name in enumerate((*cls._field_names(), "extra"))}

    def replace(self: R, **changes: Any) -> R:
        """A copy with ``changes`` applied (unknown fields carried over); ``TypeError`` for
        a name that is not a field (as ``dataclasses.replace``). Built positionally: the
        write path replaces two records per write."""
        cls = type(self)
        values = list(cls._field_values()(self))
        positions = cls._positions()
        for name, value in changes.items():
            position = positions.get(name)
            if position is None:
                raise TypeError(f"{cls.__name__} has no field {name!r}")
            values[position] = value
        return cls(*values)


@dataclass(frozen=True, slots=True)
class SegmentRecord(Record):
    """Header of one segment: its state and the ends of its chunk list."""

    KIND: ClassVar[str] = "segment"

    name: str
    segment_id: int
    status: int
    start_offset: int
    length: int
    first_chunk: str | None
    last_chunk: str | None
    first_chunk_start_offset: int
    last_chunk_start_offset: int
    max_rolling_length: int
    owner_epoch: int
    chunk_count: int
    created_ms: int
    modified_ms: int
    #: Most index links a lookup in this segment follows (concat of a concat ...); None
    #: in records written before it was kept (computed from the index when needed).
    index_depth: int | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def sealed(self) -> bool:
        return bool(self.status & _SEALED)

    @property
    def deleted(self) -> bool:
        return bool(self.status & _DELETED)

    def check(self) -> None:
        assert isinstance(self.name, str) and self.name, self.name
        assert isinstance(self.segment_id, int) and self.segment_id > 0, self.segment_id
        assert 0 <= self.start_offset <= self.length, (self.start_offset, self.length)
        assert self.max_rolling_length > 0, self.max_rolling_length
        assert self.owner_epoch >= 0 and self.chunk_count >= 0
        assert self.index_depth is None or self.index_depth >= 0, self
        has_chunks = self.chunk_count > 0
        assert (self.first_chunk is not None) == has_chunks == (self.last_chunk is not None), self
        if has_chunks:
            assert 0 <= self.first_chunk_start_offset <= self.start_offset, self
            assert self.first_chunk_start_offset <= self.last_chunk_start_offset <= self.length, self
        if self.chunk_count == 1:
            assert self.first_chunk == self.last_chunk, self
            assert self.first_chunk_start_offset == self.last_chunk_start_offset, self
        if self.status & _DELETED:
            assert not self.status & _ACTIVE, self


@dataclass(frozen=True, slots=True)
class ChunkRecord(Record):
    """One chunk of a segment: a node of the segment's linked list.

    ``index_id``/``index_offset``: where the chunk's own offset-index entry lives (the
    namespace of the segment it was written to, and its offset there); they never
    change, even when a concat moves the chunk into another segment.
    """

    KIND: ClassVar[str] = "chunk"

    name: str
    index_id: int
    index_offset: int
    length: int
    next_chunk: str | None
    epoch: int
    checksum: int | None
    #: The CRC32C of each block, packed ``(length u32, crc u32)`` pairs summing to
    #: ``length`` (``slts.storage.block_checksums``); None for chunks written before.
    blocks: bytes | None = None
    #: A transformed chunk (compressed and/or encrypted, docs/security.md): its frame map
    #: (``slts.transforms.frames.FrameMap``, packed), decoding to ``length`` bytes from
    #: ``stored_length`` stored ones; ``checksum`` is then the CRC32C of the stored bytes
    #: and ``blocks`` is None (the frames carry their own checks). None: stored as written.
    frames: bytes | None = None
    stored_length: int | None = None
    #: Its data keys, wrapped: ``[key id, blob, the chunk the key was made for]`` each, in
    #: the order the frames' key indexes count them (several after a defrag).
    data_keys: tuple[tuple[str, bytes, str], ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def transformed(self) -> bool:
        """Whether the chunk holds frames (its stored bytes are not its bytes)."""
        return self.frames is not None

    @property
    def stored(self) -> int:
        """How many bytes the chunk storage holds of it."""
        return self.stored_length if self.stored_length is not None else self.length

    def check(self) -> None:
        assert isinstance(self.name, str) and self.name, self.name
        assert self.blocks is None or (isinstance(self.blocks, bytes) and len(self.blocks) % 8 == 0), self
        assert (self.frames is None) == (self.stored_length is None), self
        assert self.frames is None or (isinstance(self.frames, bytes) and self.blocks is None), self
        assert self.data_keys is None or self.frames is not None, self
        assert self.index_id > 0 and self.index_offset >= 0, self
        assert self.length >= 0 and self.epoch >= 0, self
        assert self.next_chunk != self.name, self
        assert self.checksum is None or 0 <= self.checksum < 1 << 32, self


@dataclass(frozen=True, slots=True)
class ContainerRecord(Record):
    """The container's ownership: the epoch of the instance that owns it now."""

    KIND: ClassVar[str] = "container"

    container_id: int
    epoch: int
    started_ms: int
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def check(self) -> None:
        assert self.container_id >= 0 and self.epoch >= 1, self


class GcReason(enum.StrEnum):
    """Why a chunk is in the GC queue."""

    #: Registered before the chunk is created; removed when its metadata commits.
    INTENT = "intent"
    #: Dropped from a segment's layout by a committed change.
    DROPPED = "dropped"
    #: Found on the chunk storage with nothing referencing it (the orphan reconciler).
    ORPHAN = "orphan"


_GC_REASONS = frozenset(GcReason)


@dataclass(frozen=True, slots=True)
class GcEntry(Record):
    """Chunks waiting in the GC queue: ``chunk`` and, for a run of chunks dropped by one
    commit (a truncate's batch), the ``more`` chunks of that run. ``claimed`` once the
    collector decided to delete them. An entry of one chunk is the common case; an entry
    of a run costs one record for the whole run."""

    KIND: ClassVar[str] = "gc"

    chunk: str
    reason: str
    queued_ms: int
    claimed: bool
    #: The run's other chunks (added after the kind first shipped: older entries have none).
    more: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.more, list):  # as msgpack decodes it
            object.__setattr__(self, "more", tuple(self.more))

    @property
    def chunks(self) -> tuple[str, ...]:
        """Every chunk of the entry: ``chunk``, then ``more``."""
        return (self.chunk, *self.more)

    def check(self) -> None:
        assert self.chunk and self.reason in _GC_REASONS, self
        assert isinstance(self.more, tuple) and all(isinstance(n, str) and n for n in self.more), self


class DecodedRecords:
    """A bounded memo of decoded records, keyed by (table, key) and valid for one version.

    Versions are store-wide commit sequence numbers, never reused, so a memo entry whose
    version equals the stored one holds exactly the stored bytes, decoded. It saves the
    decode (and its self-check) on hot reads. At most ``capacity`` entries (LRU).
    """

    def __init__(self, capacity: int) -> None:
        assert capacity > 0, capacity
        self._capacity = capacity
        self._entries: OrderedDict[tuple[str, bytes], tuple[int, Record]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, table: str, key: bytes, version: int, record: Record) -> None:
        """Keep ``record``, just committed under ``key`` at ``version`` (its encoding is
        what the store holds there): the next read of it needs no decode."""
        name = (table, key)
        with self._lock:
            self._entries[name] = (version, record)
            self._entries.move_to_end(name)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def decode(self, table: str, key: bytes, version: int, value: bytes, kind: type[R]) -> R:
        """``kind.decode(value)``, from the memo when ``version`` matches."""
        name = (table, key)
        with self._lock:
            hit = self._entries.get(name)
            if hit is not None and hit[0] == version:
                self._entries.move_to_end(name)
                return hit[1]  # type: ignore[return-value]
        record = kind.decode(value)
        with self._lock:
            self._entries[name] = (version, record)
            self._entries.move_to_end(name)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return record
