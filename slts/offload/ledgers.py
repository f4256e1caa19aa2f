"""What the offloader reads from: a ledger's read handle (BookKeeper's ``ReadHandle``
shape), and two sources that have it: a ledger in memory and a ledger in a local file.

A handle has ``ledger_id``, ``last_entry_id`` (-1: empty), ``length`` (payload bytes),
``closed``, ``metadata`` and ``read(first, last)``, which returns the payloads of entries
``first..last`` inclusive (``Entry``: ``bytes``, or a read-only view for the offloaded
ledgers' handles: a ``memoryview`` or the compiled framer's ``Payload``) and raises
``EntryOutOfRange`` outside ``[0, last_entry_id]``. The offloaded ledger's own handles
(``slts.offload.reading``) have the same shape, so a reader cannot tell them apart.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, BinaryIO, Protocol, TypeAlias, runtime_checkable

from slts.errors import EntryOutOfRange, InvalidArgument, InvalidOffloadObject
from slts.offload import framing
from slts.offload.ledger_metadata import LedgerMetadata

if TYPE_CHECKING:
    from slts.offload._framing import Payload

#: An entry's payload as a read handle returns it: ``bytes``, or a read-only view of a
#: buffer the handle read (the offloaded ledgers' handles, ``slts.offload.reading``): a
#: ``memoryview``, or a ``Payload`` where the compiled framer is built.
Entry: TypeAlias = "bytes | memoryview | Payload"

#: The types an ``Entry`` may have (for checks of what a source handle returns).
ENTRY_TYPES: tuple[type, ...] = (bytes, memoryview) + (
    (framing.NATIVE.Payload,) if framing.NATIVE is not None else ()
)

#: Largest ledger id and entry id (Java longs).
ID_MAX = (1 << 63) - 1


@runtime_checkable
class LedgerReadHandle(Protocol):
    """The read side of a ledger."""

    @property
    def ledger_id(self) -> int: ...

    @property
    def last_entry_id(self) -> int: ...

    @property
    def length(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def metadata(self) -> LedgerMetadata: ...

    def read(self, first: int, last: int) -> Sequence[Entry]: ...


def check_entry_range(handle: LedgerReadHandle, first: object, last: object) -> tuple[int, int]:
    """``(first, last)`` if ``0 <= first <= last <= handle.last_entry_id``; otherwise
    ``EntryOutOfRange`` (``InvalidArgument`` for non-integers) naming the ledger."""
    for value in (first, last):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"ledger {handle.ledger_id}: entry id {value!r} is not an integer")
    assert isinstance(first, int) and isinstance(last, int)
    if not 0 <= first <= last <= handle.last_entry_id:
        raise EntryOutOfRange(
            f"ledger {handle.ledger_id}: entries {first}..{last} are outside 0..{handle.last_entry_id}",
            ledger=handle.ledger_id,
            first=first,
            last=last,
        )
    return first, last


def check_ledger_id(value: object) -> int:
    """``value`` if it is a ledger id (0..2**63-1); otherwise ``InvalidArgument``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= ID_MAX:
        raise InvalidArgument(f"ledger id {value!r} is not an integer in 0..2**63-1")
    return value


class MemoryLedger:
    """A ledger whose entries are in memory (closed unless ``closed=False``)."""

    def __init__(
        self,
        ledger_id: int,
        entries: Sequence[bytes],
        *,
        closed: bool = True,
        metadata: LedgerMetadata | None = None,
    ) -> None:
        self._ledger_id = check_ledger_id(ledger_id)
        if not all(isinstance(entry, bytes) for entry in entries):
            raise InvalidArgument(f"ledger {ledger_id}: entries must be bytes")
        self._entries = list(entries)
        self._closed = closed
        self._length = sum(len(entry) for entry in self._entries)
        base = metadata if metadata is not None else LedgerMetadata()
        self._metadata = dataclasses.replace(
            base, last_entry_id=len(self._entries) - 1, length=self._length, closed=closed
        )

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def last_entry_id(self) -> int:
        return len(self._entries) - 1

    @property
    def length(self) -> int:
        return self._length

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    def read(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last``; ``EntryOutOfRange`` outside the ledger."""
        first, last = check_entry_range(self, first, last)
        return self._entries[first : last + 1]


_FILE_ENTRY = struct.Struct(">iq")


def write_ledger_file(path: str | os.PathLike[str], entries: Sequence[bytes]) -> None:
    """Write ``entries`` as a ledger file: ``[length i32][entry id i64][payload]`` per
    entry, ids from 0 (the framing of an offloaded block's entries), synced."""
    with open(path, "wb") as file:
        write_ledger_entries(file, entries)
        file.flush()
        os.fsync(file.fileno())


def write_ledger_entries(out: BinaryIO, entries: Sequence[Entry], *, first_entry_id: int = 0) -> None:
    """Write ``entries`` to ``out`` in the ledger file's framing, ids from
    ``first_entry_id`` (a whole ledger from 0 is a ledger file ``FileLedger`` opens)."""
    assert first_entry_id >= 0, first_entry_id
    for entry_id, payload in enumerate(entries, start=first_entry_id):
        out.write(_FILE_ENTRY.pack(len(payload), entry_id))
        out.write(payload)


class FileLedger:
    """A closed ledger in a local file written by ``write_ledger_file``. Opening reads the
    entry positions once (``InvalidOffloadObject`` for a file that does not parse); reads
    are positioned reads of the entries asked for."""

    def __init__(
        self, ledger_id: int, path: str | os.PathLike[str], *, metadata: LedgerMetadata | None = None
    ) -> None:
        self._ledger_id = check_ledger_id(ledger_id)
        self.path = os.fspath(path)
        try:
            self._file: BinaryIO = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise InvalidArgument(f"cannot open the ledger file {self.path!r}: {exc.strerror}") from exc
        self._positions: list[int] = []
        self._length = 0
        size = os.fstat(self._file.fileno()).st_size
        position = 0
        while position < size:
            head = os.pread(self._file.fileno(), _FILE_ENTRY.size, position)
            if len(head) < _FILE_ENTRY.size:
                self.close()
                raise InvalidOffloadObject(f"ledger file {self.path!r}: truncated entry at byte {position}")
            length, entry_id = _FILE_ENTRY.unpack(head)
            if length < 0 or entry_id != len(self._positions) or position + _FILE_ENTRY.size + length > size:
                self.close()
                raise InvalidOffloadObject(
                    f"ledger file {self.path!r}: bad entry at byte {position}"
                    f" (id {entry_id}, length {length})",
                    object=self.path,
                    offset=position,
                )
            self._positions.append(position)
            self._length += length
            position += _FILE_ENTRY.size + length
        base = metadata if metadata is not None else LedgerMetadata()
        self._metadata = dataclasses.replace(
            base, last_entry_id=len(self._positions) - 1, length=self._length, closed=True
        )

    @property
    def ledger_id(self) -> int:
        return self._ledger_id

    @property
    def last_entry_id(self) -> int:
        return len(self._positions) - 1

    @property
    def length(self) -> int:
        return self._length

    @property
    def closed(self) -> bool:
        return True

    @property
    def metadata(self) -> LedgerMetadata:
        return self._metadata

    def read(self, first: int, last: int) -> list[bytes]:
        """Entries ``first..last``; ``EntryOutOfRange`` outside the ledger."""
        first, last = check_entry_range(self, first, last)
        start = self._positions[first]
        end_entry = self._positions[last]
        head = os.pread(self._file.fileno(), _FILE_ENTRY.size, end_entry)
        end = end_entry + _FILE_ENTRY.size + _FILE_ENTRY.unpack(head)[0]
        data = memoryview(os.pread(self._file.fileno(), end - start, start))
        entries = []
        for position in self._positions[first : last + 1]:
            at = position - start
            length = _FILE_ENTRY.unpack_from(data, at)[0]
            entries.append(bytes(data[at + _FILE_ENTRY.size : at + _FILE_ENTRY.size + length]))
        return entries

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> FileLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
