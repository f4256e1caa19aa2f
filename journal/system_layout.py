"""The pinned, in-memory layout of a container's system segments, and the journal
records that change it (DESIGN.md §6; PDP-34 "Why SLTS needs System Journal?").

System segments back up the metadata store, so their own layout cannot live in it:
it lives here, in memory, and every change is a journal record on tier-2. This module
is pure (no I/O): ``SystemLayout.apply`` is the one place that decides what a record
means, used alike by the running writer and by boot/restore replay, so they can never
disagree.

Records are msgpack maps with a kind ``k`` and an id ``id = [epoch, number]`` (numbers
grow by one per record within an epoch; a record whose id is not newer than the last
one applied for its epoch is a duplicate):

* ``add``: chunk ``chunk`` joins segment ``seg`` at segment offset ``offset`` holding
  ``length`` bytes; ``prev`` names the segment's last chunk before it (None if none).
* ``append``: ``length`` bytes were appended to the last chunk ``chunk`` at segment
  offset ``offset``.
* ``truncate``: segment ``seg`` now starts at ``start``, inside chunk ``chunk``
  (which starts at segment offset ``chunk_start``); chunks before it are dropped.
* ``snapshot``: the full layout of every system segment (``layouts``); it replaces the
  state. A snapshot record heads every epoch's journal (the boot record) and is the
  content of every journal snapshot object.

``add``, ``append`` and ``truncate`` may carry ``attrs``: small integer attributes of
the segment (the metadata log's last durable sequence, where the latest metadata
snapshot starts and ends). Lengths come only from these records, never from the
chunk storage (Pravega #6712).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class SystemSegmentLayout:
    """A system segment: readable bytes ``[start_offset, length)`` are its chunks' bytes."""

    name: str
    start_offset: int = 0
    length: int = 0
    chunks: list[SystemChunk] = field(default_factory=list)
    attrs: dict[str, int] = field(default_factory=dict)
    names: set[str] = field(init=False, repr=False, compare=False)  # of ``chunks``, for O(1) checks

    def __post_init__(self) -> None:
        self.names = {chunk.name for chunk in self.chunks}

    @property
    def last_chunk(self) -> SystemChunk | None:
        return self.chunks[-1] if self.chunks else None

    def check(self) -> list[str]:
        """Invariant violations of this layout (empty: healthy)."""
        problems = []
        if not 0 <= self.start_offset <= self.length:
            problems.append(f"{self.name}: start {self.start_offset} outside [0, {self.length}]")
        if self.chunks:
            first = self.chunks[0]
            if not first.start <= self.start_offset <= first.end and self.start_offset != self.length:
                problems.append(f"{self.name}: start {self.start_offset} not in first chunk {first}")
            for before, after in zip(self.chunks, self.chunks[1:], strict=False):
                if before.end != after.start:
                    problems.append(
                        f"{self.name}: chunk {after.name} starts at {after.start}, not {before.end}"
                    )
            if self.chunks[-1].end != self.length:
                problems.append(f"{self.name}: chunks end at {self.chunks[-1].end}, length is {self.length}")
        elif self.start_offset != self.length:
            problems.append(f"{self.name}: no chunks but start {self.start_offset} != length {self.length}")
        if len(self.names) != len(self.chunks) or self.names != {chunk.name for chunk in self.chunks}:
            problems.append(f"{self.name}: a chunk appears twice")
        return problems

    def encode(self) -> dict[str, Any]:
        return {
            "start": self.start_offset,
            "length": self.length,
            "chunks": [[c.name, c.start, c.length] for c in self.chunks],
            "attrs": dict(self.attrs),
        }

    @classmethod
    def decode(cls, name: str, raw: Mapping[str, Any]) -> SystemSegmentLayout:
        try:
            chunks = [SystemChunk(str(n), int(s), int(n_)) for n, s, n_ in raw["chunks"]]
            return cls(
                name,
                int(raw["start"]),
                int(raw["length"]),
                chunks,
                {str(k): int(v) for k, v in raw.get("attrs", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InconsistentRecord(f"undecodable layout of system segment {name!r}: {exc}") from exc


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
        clone = SystemLayout(copy.deepcopy(self.segments))
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

    def is_duplicate(self, record: Mapping[str, Any]) -> bool:
        """True if a record with this id (or a later one of its epoch) was applied."""
        epoch, number = record_id(record)
        return number <= self.last_ids.get(epoch, 0)

    def apply(self, record: Mapping[str, Any]) -> None:
        """Apply one record. ``InconsistentRecord`` (state unchanged) if it does not fit."""
        kind = record.get("k")
        epoch, number = record_id(record)
        try:
            if kind == SNAPSHOT:
                layouts = {
                    str(n): SystemSegmentLayout.decode(str(n), raw) for n, raw in record["layouts"].items()
                }
                problems = [p for layout in layouts.values() for p in layout.check()]
                if problems:
                    raise InconsistentRecord(f"snapshot record {epoch}.{number} is invalid: {problems[0]}")
                self.segments = layouts
            elif kind in (ADD, APPEND, TRUNCATE):
                self._apply_change(kind, record)
            else:
                raise InconsistentRecord(f"unknown journal record kind {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise InconsistentRecord(f"malformed {kind} record {epoch}.{number}: {exc!r}") from exc
        self.last_ids[epoch] = max(number, self.last_ids.get(epoch, 0))

    def _apply_change(self, kind: str, record: Mapping[str, Any]) -> None:
        """Check the change against the layout, then make it in place: O(1) for ``add``
        and ``append`` (a log on an object store gains a chunk per flush)."""
        name = str(record["seg"])
        layout = self.segments.get(name) or SystemSegmentLayout(name)
        chunk, offset = str(record["chunk"]), int(record["offset" if kind != TRUNCATE else "start"])
        attrs = {str(k): int(v) for k, v in (record.get("attrs") or {}).items()}
        last = layout.last_chunk
        if kind == ADD:
            prev, length = record["prev"], int(record["length"])
            if prev != (last.name if last else None) or offset != layout.length or length < 0:
                raise InconsistentRecord(
                    f"add of {chunk!r} to {name!r} at {offset} after {prev!r} does not fit "
                    f"(last chunk {last.name if last else None!r}, length {layout.length})"
                )
            if chunk in layout.names:
                raise InconsistentRecord(f"add of {chunk!r} to {name!r}: already in the segment")
            layout.chunks.append(SystemChunk(chunk, offset, length))
            layout.names.add(chunk)
            layout.length = offset + length
        elif kind == APPEND:
            length = int(record["length"])
            if last is None or last.name != chunk or offset != layout.length or length < 0:
                raise InconsistentRecord(
                    f"append to {chunk!r} of {name!r} at {offset} does not fit "
                    f"(last chunk {last.name if last else None!r}, length {layout.length})"
                )
            layout.chunks[-1] = SystemChunk(chunk, last.start, last.length + length)
            layout.length += length
        else:
            if not layout.start_offset <= offset <= layout.length:
                raise InconsistentRecord(
                    f"truncate of {name!r} to {offset} outside [{layout.start_offset}, {layout.length}]"
                )
            index = next((i for i, c in enumerate(layout.chunks) if c.name == chunk), None)
            if offset == layout.length and index is None and chunk == "":
                kept: list[SystemChunk] = []  # truncated to the end: no chunk left
            elif index is None or not layout.chunks[index].start <= offset <= layout.chunks[index].end:
                raise InconsistentRecord(f"truncate of {name!r} to {offset} in {chunk!r} does not fit")
            else:
                kept = layout.chunks[index:]
            layout.chunks = kept
            layout.names = {c.name for c in kept}
            layout.start_offset = offset
        layout.attrs.update(attrs)
        self.segments[name] = layout


def record_id(record: Mapping[str, Any]) -> RecordId:
    """The ``(epoch, number)`` id of a record; ``InconsistentRecord`` if it has none."""
    raw = record.get("id")
    if not isinstance(raw, (list, tuple)) or len(raw) != 2 or not all(isinstance(v, int) for v in raw):
        raise InconsistentRecord(f"journal record without a valid id: {raw!r}")
    return int(raw[0]), int(raw[1])
