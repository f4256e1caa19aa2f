"""A ledger's metadata as Pulsar's offload indexes store it: BookKeeper's
``LedgerMetadataFormat`` protobuf (proto2, ``bookkeeper-proto/.../DataFormats.proto``) in a
ledger offload's index, Pulsar's ``ManagedLedgerInfo.LedgerInfo`` (``MLDataFormats.proto``:
ledger id, entries, size, timestamp) in a streaming segment's index.

The message is encoded and decoded by the protobuf library from a descriptor built here
with BookKeeper's field numbers and types, so the bytes are what Pulsar's offloader
(``OffloadUtils.buildLedgerMetadataFormat``) writes: quorum sizes, length, last entry id,
state, one segment per ensemble, digest type, creation time and custom metadata, in field
number order, the password and the token left out.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from slts.errors import InvalidArgument, InvalidOffloadObject


class DigestType(enum.IntEnum):
    """BookKeeper's entry digest (``LedgerMetadataFormat.DigestType``)."""

    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """What a ledger's read handle says about it (BookKeeper's ``LedgerMetadata``).

    ``ensembles``: (first entry id, bookie addresses) per ensemble, ascending from entry 0.
    ``custom_metadata`` keeps its order (it is serialized in it)."""

    ensemble_size: int = 3
    write_quorum_size: int = 3
    ack_quorum_size: int = 2
    last_entry_id: int = -1
    length: int = 0
    closed: bool = True
    digest_type: DigestType = DigestType.CRC32C
    ctime: int = 0
    ensembles: Sequence[tuple[int, Sequence[str]]] = (
        (0, ("127.0.0.1:3181", "127.0.0.2:3181", "127.0.0.3:3181")),
    )
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 1 <= self.ack_quorum_size <= self.write_quorum_size <= self.ensemble_size:
            raise InvalidArgument(
                f"quorums must satisfy 1 <= ack {self.ack_quorum_size} <= write {self.write_quorum_size}"
                f" <= ensemble {self.ensemble_size}"
            )
        if self.last_entry_id < -1 or self.length < 0:
            raise InvalidArgument(f"last entry id {self.last_entry_id} or length {self.length} out of range")
        firsts = [first for first, _ in self.ensembles]
        if not firsts or firsts[0] != 0 or firsts != sorted(set(firsts)):
            raise InvalidArgument(f"ensembles must start at entry 0 and increase: {firsts}")
        if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in self.custom_metadata.items()):
            raise InvalidArgument("custom metadata maps str keys to bytes values")


_STATE_OPEN, _STATE_CLOSED = 1, 3


def encode_ledger_metadata(metadata: LedgerMetadata) -> bytes:
    """``metadata`` as a ``LedgerMetadataFormat`` message."""
    message = _messages()["LedgerMetadataFormat"]()
    message.quorumSize = metadata.write_quorum_size
    message.ensembleSize = metadata.ensemble_size
    message.length = metadata.length
    message.lastEntryId = metadata.last_entry_id
    message.state = _STATE_CLOSED if metadata.closed else _STATE_OPEN
    for first_entry_id, members in metadata.ensembles:
        segment = message.segment.add()
        segment.ensembleMember.extend(members)
        segment.firstEntryId = first_entry_id
    message.digestType = int(metadata.digest_type)
    message.ackQuorumSize = metadata.ack_quorum_size
    message.ctime = metadata.ctime
    for key, value in metadata.custom_metadata.items():
        entry = message.customMetadata.add()
        entry.key = key
        entry.value = value
    return bytes(message.SerializeToString())


def decode_ledger_metadata(data: bytes, *, name: str = "") -> LedgerMetadata:
    """The ``LedgerMetadataFormat`` in ``data``. Raises ``InvalidOffloadObject`` if it does
    not parse or lacks a required field."""
    message = _messages()["LedgerMetadataFormat"]()
    try:
        message.ParseFromString(data)
        if not message.IsInitialized():
            raise DecodeError("required fields missing: " + ", ".join(message.FindInitializationErrors()))
        return LedgerMetadata(
            ensemble_size=message.ensembleSize,
            write_quorum_size=message.quorumSize,
            ack_quorum_size=message.ackQuorumSize
            if message.HasField("ackQuorumSize")
            else message.quorumSize,
            last_entry_id=message.lastEntryId,
            length=message.length,
            closed=message.state == _STATE_CLOSED,
            digest_type=DigestType(message.digestType)
            if message.HasField("digestType")
            else DigestType.CRC32,
            ctime=message.ctime,
            ensembles=tuple((s.firstEntryId, tuple(s.ensembleMember)) for s in message.segment),
            custom_metadata={entry.key: bytes(entry.value) for entry in message.customMetadata},
        )
    except (DecodeError, ValueError, InvalidArgument) as exc:
        where = f"offload object {name!r}" if name else "offload index"
        raise InvalidOffloadObject(f"{where}: ledger metadata does not parse: {exc}", object=name) from exc


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """Pulsar's ``LedgerInfo`` of one ledger: its id, entry count, payload bytes and the
    time it was closed (milliseconds; 0: unknown)."""

    ledger_id: int
    entries: int
    size: int
    timestamp: int = 0


def encode_ledger_info(info: LedgerInfo) -> bytes:
    """``info`` as a ``LedgerInfo`` message (fields in number order, as Java writes them)."""
    message = _messages()["LedgerInfo"]()
    message.ledgerId = info.ledger_id
    message.entries = info.entries
    message.size = info.size
    if info.timestamp:
        message.timestamp = info.timestamp
    return bytes(message.SerializeToString())


def decode_ledger_info(data: bytes, *, name: str = "") -> LedgerInfo:
    """The ``LedgerInfo`` in ``data``; ``InvalidOffloadObject`` if it does not parse."""
    message = _messages()["LedgerInfo"]()
    try:
        message.ParseFromString(data)
        if not message.IsInitialized():
            raise DecodeError("the ledger id is missing")
    except DecodeError as exc:
        raise InvalidOffloadObject(
            f"offload object {name!r}: ledger info does not parse: {exc}", object=name
        ) from exc
    return LedgerInfo(message.ledgerId, message.entries, message.size, message.timestamp)


@functools.cache
def _messages() -> dict[str, Any]:
    """The message classes, from descriptors with BookKeeper's and Pulsar's field numbers."""
    fd = descriptor_pb2.FieldDescriptorProto
    required, optional, repeated = fd.LABEL_REQUIRED, fd.LABEL_OPTIONAL, fd.LABEL_REPEATED
    proto = descriptor_pb2.FileDescriptorProto(
        name="slts/offload/offload_formats.proto", package="slts.offload", syntax="proto2"
    )
    message = proto.message_type.add(name="LedgerMetadataFormat")
    segment = message.nested_type.add(name="Segment")
    custom = message.nested_type.add(name="cMetadataMapEntry")
    _field(segment, "ensembleMember", 1, fd.TYPE_STRING, repeated)
    _field(segment, "firstEntryId", 2, fd.TYPE_INT64, required)
    _field(custom, "key", 1, fd.TYPE_STRING, optional)
    _field(custom, "value", 2, fd.TYPE_BYTES, optional)
    prefix = ".slts.offload.LedgerMetadataFormat."
    for name, number, kind, label in (
        ("quorumSize", 1, fd.TYPE_INT32, required),
        ("ensembleSize", 2, fd.TYPE_INT32, required),
        ("length", 3, fd.TYPE_INT64, required),
        ("lastEntryId", 4, fd.TYPE_INT64, optional),
        ("state", 5, fd.TYPE_INT32, required),  # an enum on the wire is a varint
        ("digestType", 7, fd.TYPE_INT32, optional),
        ("password", 8, fd.TYPE_BYTES, optional),
        ("ackQuorumSize", 9, fd.TYPE_INT32, optional),
        ("ctime", 10, fd.TYPE_INT64, optional),
        ("cToken", 12, fd.TYPE_INT64, optional),
    ):
        _field(message, name, number, kind, label)
    _field(message, "segment", 6, fd.TYPE_MESSAGE, repeated, prefix + "Segment")
    _field(message, "customMetadata", 11, fd.TYPE_MESSAGE, repeated, prefix + "cMetadataMapEntry")
    info = proto.message_type.add(name="LedgerInfo")
    _field(info, "ledgerId", 1, fd.TYPE_INT64, required)
    _field(info, "entries", 2, fd.TYPE_INT64, optional)
    _field(info, "size", 3, fd.TYPE_INT64, optional)
    _field(info, "timestamp", 4, fd.TYPE_INT64, optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {
        kind: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"slts.offload.{kind}"))
        for kind in ("LedgerMetadataFormat", "LedgerInfo")
    }


def _field(message: Any, name: str, number: int, kind: int, label: int, type_name: str = "") -> None:
    added = message.field.add(name=name, number=number, type=kind, label=label)
    if type_name:
        added.type_name = type_name
