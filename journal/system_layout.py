"""The pinned, in-memory layout of a container's system segments, and the journal
records that change it (DESIGN.md §6; PDP-34 "Why SLTS needs System Journal?").

System segments back up the metadata store, so their own layout cannot live in it:
it lives here, in memory, and every change is a journal record on tier-2. This module
is pure (no I/O): ``SystemLayout.apply`` (with the ``SystemSegmentLayout`` methods it
calls) is the one place that decides what a record means, used alike by the running
writer and by boot/restore replay, so they can never disagree. It parses and checks a
record once and changes the layout in place, in O(1) for ``add`` and ``append``: replay
applies every journal record since the last journal snapshot this way.

Records are msgpack maps with a kind ``k`` and an id ``id = [epoch, number]`` (numbers
grow by one per record within an epoch; a record whose id is not newer than the last
one applied for its epoch is a duplicate):

* ``add``: chunk ``chunk`` joins segment ``seg`` at segment offset ``offset`` holding
  ``length`` bytes; ``prev`` names the segment's last chunk before it (None if none).
* ``append``: ``length`` bytes were appended to the last chunk ``chunk`` at segment
  offset ``offset``.
* ``truncate``: segment ``seg`` now starts at ``start``, inside chunk ``chunk``
  (``""`` with ``start`` at the end: no chunk is left); chunks before it are dropped.
* ``snapshot``: the full layout of every system segment (``layouts``); it replaces the
  state. A snapshot record heads every epoch's journal (the boot record) and is the
  content of every journal snapshot object.

**Replay in runs.** Most of a journal is appends to the metadata log's last chunk.
``SystemLayout.apply_appends`` takes a run of them straight from the framed bytes: the
compiled walk (``slts.journal._replay``, optional) checks each frame's CRC and every
field in one pass over its bytes and makes no Python object per record, where decoding a
record alone costs more than a microsecond. It takes only records whose meaning is plain
(``appends_python``, its pure-Python twin and reference, says which) and stops at any
other frame, which replay then reads and applies one by one; so both paths give the
same state, and the tests hold them to it.

``add``, ``append`` and ``truncate`` may carry ``attrs``: small integer attributes of
the segment (the metadata log's last durable sequence, where the latest metadata
snapshot starts and ends). Lengths come only from these records, never from the
chunk storage (Pravega #6712).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
from slts.journal import framing

from slts.compiled import twin
from slts.errors import MetadataCorrupted

RecordId = tuple[int, int]

ADD = "add"
APPEND = "append"
TRUNCATE = "truncate"
SNAPSHOT = "snapshot"
KINDS = (ADD, APPEND, TRUNCATE, SNAPSHOT)


class InconsistentRecord(MetadataCorrupted):
    """A journal record that does not fit the layout it is applied to."""


@dataclass(frozen=True, slots=True)
class SystemChunk:
    """One chunk of a system segment: ``length`` bytes starting at segment offset ``start``."""

    name: str
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


class SystemSegmentLayout:
    """A system segment: readable bytes ``[start_offset, length)`` are its chunks' bytes.

    Chunks are contiguous by construction: the layout keeps each chunk's name and the
    segment offset it starts at, and a chunk ends where the next one starts (the last one
    at ``length``). So the changes records make are O(1) and make no object: an append to
    the last chunk is ``length += n``, an ``add`` appends a name and a start. Replay and
    the writer change the layout in place through ``add``, ``append`` and ``truncate``,
    which check first and change nothing when they raise ``InconsistentRecord``.
    ``chunks`` and ``last_chunk`` build ``SystemChunk`` values on demand.

    Invariants (``check``): ``0 <= start_offset <= length``; ``start_offset`` lies in the
    first chunk (or equals ``length``); chunk starts are >= 0 and never decrease; no
    chunk appears twice; no chunks means ``start_offset == length``.
    """

    __slots__ = ("_members", "_names", "_starts", "attrs", "length", "name", "start_offset")

    def __init__(self, name: str) -> None:
        """An empty segment; ``decode`` builds a filled one."""
        self.name = name
        self.start_offset = 0
        self.length = 0
        self.attrs: dict[str, int] = {}
        self._names: list[str] = []  # chunk names, in segment order
        self._starts: list[int] = []  # the segment offset each chunk starts at
        self._members: set[str] = set()  # of ``_names``, for O(1) duplicate checks

    def __repr__(self) -> str:
        return f"SystemSegmentLayout({self.name!r}, {self.encode()!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SystemSegmentLayout):
            return NotImplemented
        return self.name == other.name and self.encode() == other.encode()

    __hash__ = None  # type: ignore[assignment]  # mutable

    @property
    def chunks(self) -> tuple[SystemChunk, ...]:
        """The chunks in segment order (built on each call: O(chunks))."""
        if not self._names:
            return ()
        ends = [*self._starts[1:], self.length]
        lengths = [end - start for start, end in zip(self._starts, ends, strict=True)]
        return tuple(map(SystemChunk, self._names, self._starts, lengths))

    @property
    def last_chunk_name(self) -> str | None:
        """The name of the last chunk (None if none), without making a ``SystemChunk``."""
        return self._names[-1] if self._names else None

    @property
    def last_chunk(self) -> SystemChunk | None:
        if not self._names:
            return None
        return SystemChunk(self._names[-1], self._starts[-1], self.length - self._starts[-1])

    def copy(self) -> SystemSegmentLayout:
        """An independent copy (O(chunks), no ``SystemChunk`` made)."""
        clone = SystemSegmentLayout(self.name)
        clone.start_offset, clone.length, clone.attrs = self.start_offset, self.length, dict(self.attrs)
        clone._names, clone._starts = list(self._names), list(self._starts)
        clone._members = set(self._members)
        return clone

    def check(self) -> list[str]:
        """Invariant violations of this layout (empty: healthy)."""
        problems = []
        if not 0 <= self.start_offset <= self.length:
            problems.append(f"{self.name}: start {self.start_offset} outside [0, {self.length}]")
        if self._names:
            first_end = self._starts[1] if len(self._starts) > 1 else self.length
            if not self._starts[0] <= self.start_offset <= first_end and self.start_offset != self.length:
                problems.append(
                    f"{self.name}: start {self.start_offset} not in first chunk "
                    f"{self._names[0]!r} [{self._starts[0]}, {first_end})"
                )
            if self._starts[0] < 0 or any(b < a for a, b in itertools.pairwise(self._starts)):
                problems.append(f"{self.name}: chunk starts {self._starts} are negative or decrease")
            if self.length < self._starts[-1]:
                problems.append(
                    f"{self.name}: last chunk starts at {self._starts[-1]}, past length {self.length}"
                )
        elif self.start_offset != self.length:
            problems.append(f"{self.name}: no chunks but start {self.start_offset} != length {self.length}")
        if len(self._members) != len(self._names) or self._members != set(self._names):
            problems.append(f"{self.name}: a chunk appears twice")
        return problems

    def encode(self) -> dict[str, Any]:
        return {
            "start": self.start_offset,
            "length": self.length,
            "chunks": [[chunk.name, chunk.start, chunk.length] for chunk in self.chunks],
            "attrs": dict(self.attrs),
        }

    @classmethod
    def decode(cls, name: str, raw: Mapping[str, Any]) -> SystemSegmentLayout:
        """The layout ``encode`` made. ``InconsistentRecord`` if a field is missing or of the
        wrong type, or if the chunks are not contiguous up to ``length`` (the other
        invariants are ``check``'s)."""
        layout = cls(name)
        try:
            layout.start_offset, layout.length = _integer(raw["start"]), _integer(raw["length"])
            layout.attrs = _attributes(raw.get("attrs"))
            end = None
            for chunk, start, length in raw["chunks"]:
                if type(chunk) is not str:
                    raise InconsistentRecord(f"chunk name {chunk!r} is not a string")
                if end is not None and _integer(start) != end:
                    raise InconsistentRecord(f"chunk {chunk!r} starts at {start}, not {end}")
                layout._names.append(chunk)
                layout._starts.append(_integer(start))
                end = start + _integer(length)
        except (KeyError, TypeError, ValueError, AttributeError, InconsistentRecord) as exc:
            raise InconsistentRecord(f"undecodable layout of system segment {name!r}: {exc}") from exc
        if end is not None and end != layout.length:
            raise InconsistentRecord(
                f"system segment {name!r}: chunks end at {end}, length is {layout.length}"
            )
        layout._members = set(layout._names)
        return layout

    # -- changes (``SystemLayout.apply``): check, then change in place -------------------------

    def add(self, chunk: str, offset: int, length: int, prev: str | None) -> None:
        """Chunk ``chunk`` of ``length`` bytes joins at ``offset`` after chunk ``prev``."""
        last = self._names[-1] if self._names else None
        if (
            prev != last
            or type(offset) is not int
            or offset != self.length
            or type(length) is not int
            or length < 0
            or type(chunk) is not str
        ):
            raise InconsistentRecord(
                f"add of {chunk!r} of {length!r} bytes to {self.name!r} at {offset!r} after {prev!r} "
                f"does not fit (last chunk {last!r}, length {self.length})"
            )
        if chunk in self._members:
            raise InconsistentRecord(f"add of {chunk!r} to {self.name!r}: already in the segment")
        self._names.append(chunk)
        self._starts.append(offset)
        self._members.add(chunk)
        self.length = offset + length

    def append(self, chunk: str, offset: int, length: int) -> None:
        """``length`` bytes were appended at ``offset`` to the last chunk, ``chunk``."""
        if (
            not self._names
            or self._names[-1] != chunk
            or type(offset) is not int
            or offset != self.length
            or type(length) is not int
            or length < 0
        ):
            raise InconsistentRecord(
                f"append of {length!r} bytes to {chunk!r} of {self.name!r} at {offset!r} does not fit "
                f"(last chunk {self._names[-1] if self._names else None!r}, length {self.length})"
            )
        self.length += length

    def truncate(self, chunk: str, start: int) -> None:
        """The segment now starts at ``start``, inside ``chunk`` (``""``: at the end, with no
        chunk left); the chunks before ``chunk`` are dropped."""
        if type(start) is not int or not self.start_offset <= start <= self.length:
            raise InconsistentRecord(
                f"truncate of {self.name!r} to {start!r} outside [{self.start_offset}, {self.length}]"
            )
        if chunk in self._members:
            index = self._names.index(chunk)
            end = self._starts[index + 1] if index + 1 < len(self._starts) else self.length
            if not self._starts[index] <= start <= end:
                raise InconsistentRecord(f"truncate of {self.name!r} to {start} in {chunk!r} does not fit")
        elif chunk == "" and start == self.length:
            index = len(self._names)  # truncated to the end: no chunk left
        else:
            raise InconsistentRecord(f"truncate of {self.name!r} to {start} in {chunk!r}: no such chunk")
        self._members.difference_update(self._names[:index])
        del self._names[:index], self._starts[:index]
        self.start_offset = start


class SystemLayout:
    """The layouts of all system segments, and the ids of the records applied so far."""

    def __init__(self, segments: Mapping[str, SystemSegmentLayout] | None = None) -> None:
        self.segments: dict[str, SystemSegmentLayout] = dict(segments or {})
        self.last_ids: dict[int, int] = {}  # epoch -> last record number applied

    def segment(self, name: str) -> SystemSegmentLayout:
        """The layout of ``name`` (an empty one is made on first use)."""
        if name not in self.segments:
            self.segments[name] = SystemSegmentLayout(name)
        return self.segments[name]

    def copy(self) -> SystemLayout:
        clone = SystemLayout({name: layout.copy() for name, layout in self.segments.items()})
        clone.last_ids = dict(self.last_ids)
        return clone

    def check(self) -> list[str]:
        """Invariant violations of every segment (empty: healthy)."""
        return [problem for layout in self.segments.values() for problem in layout.check()]

    def snapshot_record(self, record_id: RecordId) -> dict[str, Any]:
        """A ``snapshot`` record of the current state."""
        return {
            "k": SNAPSHOT,
            "id": list(record_id),
            "layouts": {name: layout.encode() for name, layout in sorted(self.segments.items())},
        }

    def apply(self, record: Mapping[str, Any]) -> bool:
        """Apply one record, parsing and validating it once. Returns False, changing
        nothing, for a duplicate: a record whose id is not newer than the last one applied
        for its epoch (a retried write that had landed). Raises ``InconsistentRecord``
        (state unchanged) if the record is malformed or does not fit the layout.

        Replay calls this once per journal record, so the common kinds (``append``,
        ``add``) take the shortest path; the segment's methods do the checks."""
        epoch, number = record_id(record)
        if number <= self.last_ids.get(epoch, 0):
            return False
        kind = record.get("k")
        try:
            if kind == SNAPSHOT:
                self._apply_snapshot(record["layouts"], epoch, number)
            elif kind in (APPEND, ADD, TRUNCATE):
                name = record["seg"]
                layout = self.segments.get(name)
                if layout is None:
                    if type(name) is not str:
                        raise InconsistentRecord(f"system segment name {name!r} is not a string")
                    layout = SystemSegmentLayout(name)
                attrs = record.get("attrs")
                if attrs:  # checked before the change, applied after it
                    _check_attributes(attrs)
                if kind == APPEND:
                    layout.append(record["chunk"], record["offset"], record["length"])
                elif kind == ADD:
                    layout.add(record["chunk"], record["offset"], record["length"], record["prev"])
                else:
                    layout.truncate(record["chunk"], record["start"])
                if attrs:
                    layout.attrs.update(attrs)
                self.segments[name] = layout
            else:
                raise InconsistentRecord(f"unknown journal record kind {kind!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InconsistentRecord(f"malformed {kind} record {epoch}.{number}: {exc!r}") from exc
        except InconsistentRecord as exc:
            raise InconsistentRecord(f"{kind} record {epoch}.{number}: {exc}") from exc
        self.last_ids[epoch] = number
        return True

    def apply_appends(
        self, data: bytes | memoryview, offset: int, epoch: int, segment: str
    ) -> tuple[int, int]:
        """Apply the run of plain ``append`` records of ``epoch`` to ``segment``'s last chunk
        that starts at ``offset`` of the framed journal bytes ``data``; return where the run
        ends and how many records it applied (see ``appends_python``). The frame it ends at
        is for ``framing.read_records`` and ``apply``: the run takes only records whose
        meaning is plain, so the state is what ``apply`` makes of the same records.

        Replay's batch path: on the compiled twin (``NATIVE``) a record costs a CRC and one
        pass over its bytes, no Python object; without it the pure-Python twin (a test
        reference, as slow as ``apply``) does the same."""
        layout = self.segments.get(segment)
        chunk = layout.last_chunk_name if layout is not None else None
        if layout is None or chunk is None:
            return offset, 0
        walk = NATIVE.appends if NATIVE is not None else appends_python
        last_number = self.last_ids.get(epoch, 0)
        stop, length, last, count = walk(
            data, offset, segment, chunk, layout.length, epoch, last_number, layout.attrs
        )
        if count:
            layout.length = length
            self.last_ids[epoch] = last
        return stop, count

    def _apply_snapshot(self, raw: Mapping[str, Any], epoch: int, number: int) -> None:
        layouts = {}
        for name, encoded in raw.items():
            if type(name) is not str:
                raise InconsistentRecord(f"system segment name {name!r} is not a string")
            layouts[name] = SystemSegmentLayout.decode(name, encoded)
        problems = [problem for layout in layouts.values() for problem in layout.check()]
        if problems:
            raise InconsistentRecord(f"snapshot record {epoch}.{number} is invalid: {problems[0]}")
        self.segments = layouts


def _integer(value: Any) -> int:
    """``value`` if it is an int (not a bool); ``InconsistentRecord`` otherwise."""
    if type(value) is not int:
        raise InconsistentRecord(f"{value!r} is not an integer")
    return value


def _check_attributes(raw: Any) -> None:
    """``InconsistentRecord`` unless ``raw`` maps strings to integers."""
    if type(raw) is not dict:
        raise InconsistentRecord(f"segment attributes {raw!r} are not a map")
    for key, value in raw.items():
        if type(key) is not str or type(value) is not int:
            raise InconsistentRecord(f"segment attribute {key!r}: {value!r} is not a string to an integer")


def _attributes(raw: Any) -> dict[str, int]:
    """A copy of the attributes ``raw`` (None: none); ``InconsistentRecord`` if malformed."""
    if raw is None:
        return {}
    _check_attributes(raw)
    return dict(raw)


def record_id(record: Mapping[str, Any]) -> RecordId:
    """The ``(epoch, number)`` id of a record; ``InconsistentRecord`` if it has none."""
    raw = record.get("id")
    if isinstance(raw, (list, tuple)) and len(raw) == 2:
        epoch, number = raw
        if type(epoch) is int and type(number) is int:
            return epoch, number
    raise InconsistentRecord(f"journal record without a valid id: {raw!r}")


# -- the batch path of replay: runs of plain appends ------------------------------------------------

#: The integers ``appends`` handles (the compiled twin works in signed 64 bits).
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
#: The most attributes a record ``appends`` takes may carry.
APPEND_ATTRS_MAX = 8
_APPEND_KEYS = frozenset(("k", "seg", "chunk", "offset", "length", "id", "attrs"))
_APPEND_REQUIRED = _APPEND_KEYS - {"attrs"}


class _Pairs(list[Any]):
    """A msgpack map as its (key, value) pairs: repeated keys stay visible."""


def _int64(value: Any) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def appends_python(
    data: bytes | memoryview,
    offset: int,
    segment: str,
    chunk: str,
    length: int,
    epoch: int,
    last: int,
    attrs: dict[str, int],
) -> tuple[int, int, int, int]:
    """The reference of the compiled ``appends`` (``_replay.c``): walk the frames of
    ``data`` from ``offset`` while each is a plain append to ``chunk``, the last chunk of
    ``segment`` (whose length is ``length``), by ``epoch``, newer than record ``last``;
    return ``(offset, length, last, count)``: where the walk stopped, the new length, the
    last record number taken, and how many records it took. ``attrs`` gets each taken
    record's attributes, in order.

    A plain append is a whole frame whose CRC holds, whose payload is not sealed and is
    exactly one msgpack map of the keys ``k`` ("append"), ``seg`` (== ``segment``),
    ``chunk`` (== ``chunk``), ``offset`` (== the length so far), ``length`` (>= 0), ``id``
    ([``epoch``, number > the last one]) and optionally ``attrs`` (nil, or a map of at
    most ``APPEND_ATTRS_MAX`` distinct strings to integers), each once, integers within
    64 bits. ``SystemLayout.apply`` does to such a record exactly what this does; anything
    else stops the walk, and ``apply`` decides what it is."""
    if offset < 0 or not (_int64(length) and length >= 0 and _int64(epoch) and _int64(last)):
        return offset, length, last, 0
    count = 0
    for stop, body in framing.plain_bodies(data, offset):
        taken = _plain_append(body, segment, chunk, length, epoch, last)
        if taken is None:
            break
        added, last, pairs = taken
        attrs.update(pairs)
        length += added
        offset = stop
        count += 1
    return offset, length, last, count


def _plain_append(
    body: bytes, segment: str, chunk: str, length: int, epoch: int, last: int
) -> tuple[int, int, list[tuple[str, int]]] | None:
    """(bytes added, record number, attributes) of a plain append payload (see
    ``appends_python``), or None."""
    try:
        pairs = msgpack.unpackb(body, raw=False, strict_map_key=False, object_pairs_hook=_Pairs)
    except (ValueError, msgpack.UnpackException):
        return None
    if type(pairs) is not _Pairs or not 6 <= len(pairs) <= 7 or any(type(key) is not str for key, _ in pairs):
        return None
    fields = dict(pairs)
    if len(fields) != len(pairs) or not _APPEND_REQUIRED <= fields.keys() <= _APPEND_KEYS:
        return None
    kind, seg, name, at, added, raw_id = (
        fields[key] for key in ("k", "seg", "chunk", "offset", "length", "id")
    )
    if not (
        type(kind) is str
        and kind == "append"
        and type(seg) is str
        and seg == segment
        and type(name) is str
        and name == chunk
        and _int64(at)
        and at == length
        and _int64(added)
        and 0 <= added <= _INT64_MAX - length
        and type(raw_id) is list
        and len(raw_id) == 2
        and _int64(raw_id[0])
        and raw_id[0] == epoch
        and _int64(raw_id[1])
        and raw_id[1] > last
    ):
        return None
    raw_attrs = fields.get("attrs")
    if raw_attrs is None:
        return added, raw_id[1], []
    if (
        type(raw_attrs) is not _Pairs
        or len(raw_attrs) > APPEND_ATTRS_MAX
        or any(type(key) is not str or not _int64(value) for key, value in raw_attrs)
        or len({key for key, _ in raw_attrs}) != len(raw_attrs)
    ):
        return None
    return added, raw_id[1], list(raw_attrs)


#: The compiled ``appends`` (``slts.journal._replay``), or None: ``apply_appends`` then
#: uses ``appends_python``, and replay applies records one by one (``replay``).
NATIVE = twin("slts.journal._replay")
