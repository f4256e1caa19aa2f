"""The record of one offload attempt of a ledger (PIP-17), kept in the container's store.

An attempt is recorded STARTED, with the owner's epoch, before it writes anything, and
COMPLETE once its data and index objects are written and sealed; a delete marks it
DELETING before it deletes the objects, and removes the record last. So a crash leaves a
record that says what to clean up: a STARTED attempt of an earlier epoch (its owner is
gone) or a DELETING one. Attempts never share objects: their names carry the uid.

Key: ledger id (u64 BE) + uid (16 bytes), so a ledger's attempts are one key range.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from slts.metadata.records import Record
from slts.offload.formats import FORMAT_VERSION

_LEDGER = struct.Struct(">Q")
_EMPTY: Mapping[str, Any] = {}


class OffloadState(enum.IntEnum):
    """Where an offload attempt stands."""

    STARTED = 1
    COMPLETE = 2
    DELETING = 3


def record_key(ledger_id: int, uid: uuid.UUID) -> bytes:
    """The key of ``ledger_id``'s attempt ``uid``."""
    return _LEDGER.pack(ledger_id) + uid.bytes


def ledger_prefix(ledger_id: int) -> bytes:
    """The prefix of every key of ``ledger_id``."""
    return _LEDGER.pack(ledger_id)


@dataclass(frozen=True, slots=True)
class OffloadRecord(Record):
    """One offload attempt: its ledger and uid, state, the epoch that started it, and,
    once COMPLETE, what was written (the index object has the rest) and in which format."""

    KIND: ClassVar[str] = "offloaded-ledger"

    ledger_id: int
    uid: bytes
    state: int
    epoch: int
    max_block_bytes: int
    extra_metadata: Mapping[str, str]
    entries: int = 0
    length: int = 0
    data_length: int = 0
    blocks: int = 0
    #: The objects' format version (Pulsar keeps it in their user metadata; readers refuse others).
    format_version: str = FORMAT_VERSION
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def id(self) -> uuid.UUID:
        """The attempt's uid."""
        return uuid.UUID(bytes=self.uid)

    @property
    def key(self) -> bytes:
        """This record's key."""
        return record_key(self.ledger_id, self.id)

    def check(self) -> None:
        assert 0 <= self.ledger_id < 1 << 63 and len(self.uid) == 16, self
        assert self.state in OffloadState.__members__.values() and self.epoch >= 0, self
        assert min(self.entries, self.length, self.data_length, self.blocks) >= 0, self
        assert self.state == OffloadState.STARTED or self.blocks >= 1, self
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in self.extra_metadata.items()), self


# -- streaming offload (PIP-76) -------------------------------------------------------------------


class StreamState(enum.IntEnum):
    """Where a streaming segment stands. FAILED: a write of it failed; its objects are
    removed and its entries are offloaded again, from its begin, by the next segment (the
    redo), which drops its record."""

    OPEN = 1
    COMPLETE = 2
    DELETING = 3
    FAILED = 4


def stream_key(managed_ledger: str, number: int) -> bytes:
    """The key of segment ``number`` (or of ledger ``number``) of ``managed_ledger``."""
    return stream_prefix(managed_ledger) + _LEDGER.pack(number)


def stream_prefix(managed_ledger: str) -> bytes:
    """The prefix of every key of ``managed_ledger`` (its name, then a zero byte)."""
    return managed_ledger.encode() + b"\x00"


@dataclass(frozen=True, slots=True)
class StreamSegmentRecord(Record):
    """One streaming offload segment (PIP-76's ``OffloadSegment`` with what resuming it
    needs): its place in the managed ledger's sequence, uid, state, the epoch that wrote
    it last, the first and the last durable (ledger, entry), the data object's length, its
    blocks ``[ledger id, first entry, part id, offset, length, last entry]`` and per ledger
    ``[entries, bytes]``, timestamps (ms) and the driver metadata."""

    KIND: ClassVar[str] = "stream-segment"

    managed_ledger: str
    sequence: int
    uid: bytes
    state: int
    epoch: int
    begin_ledger: int
    begin_entry: int
    end_ledger: int
    end_entry: int
    data_length: int
    blocks: list[list[int]]
    ledgers: Mapping[int, list[int]]
    assigned_ms: int
    offloaded_ms: int
    block_bytes: int
    driver_metadata: Mapping[str, str]
    #: The objects' format version, as for ``OffloadRecord``.
    format_version: str = FORMAT_VERSION
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def id(self) -> uuid.UUID:
        """The segment's uid."""
        return uuid.UUID(bytes=self.uid)

    @property
    def key(self) -> bytes:
        """This record's key."""
        return stream_key(self.managed_ledger, self.sequence)

    def check(self) -> None:
        assert self.managed_ledger and len(self.uid) == 16 and self.sequence >= 0, self
        assert self.state in StreamState.__members__.values(), self
        assert (self.end_ledger, self.end_entry) == (-1, -1) or (self.end_ledger, self.end_entry) >= (
            self.begin_ledger,
            self.begin_entry,
        ), self
        assert sum(block[4] for block in self.blocks) == self.data_length, self
        assert [block[2] for block in self.blocks] == list(range(1, len(self.blocks) + 1)), self


@dataclass(frozen=True, slots=True)
class StreamLedgerRecord(Record):
    """A ledger's offload context in one managed ledger (PIP-76's ``OffloadContext``): the
    segments holding its entries, in order, and whether it was deleted (a segment goes
    once every ledger in it is)."""

    KIND: ClassVar[str] = "stream-ledger"

    managed_ledger: str
    ledger_id: int
    segments: list[int]
    deleted: bool
    extra: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def key(self) -> bytes:
        """This record's key."""
        return stream_key(self.managed_ledger, self.ledger_id)

    def check(self) -> None:
        assert self.managed_ledger and 0 <= self.ledger_id < 1 << 63, self
        assert self.segments == sorted(set(self.segments)), self
