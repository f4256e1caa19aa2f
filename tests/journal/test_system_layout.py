"""``SystemLayout.apply`` against a plain model of what each journal record means.

The layout keeps chunk names and starts (chunks are contiguous by construction) and
changes in place; the model below keeps ``[name, start, length]`` lists and is written
straight from the record kinds in ``slts.journal.system_layout``'s module doc. Every
record, valid or not, must have the same outcome in both: applied (same encoded state),
a duplicate (False, nothing changed) or ``InconsistentRecord`` (nothing changed).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slts.journal.system_layout import (
    ADD,
    APPEND,
    SNAPSHOT,
    TRUNCATE,
    InconsistentRecord,
    SystemChunk,
    SystemLayout,
    SystemSegmentLayout,
)

SEGMENTS = ["log", "snaps"]
CHUNKS = ["a", "b", "c", "d", "e", "f", "g", "h", ""]


class Model:
    """The meaning of each record, on plain lists (no shortcuts, no in-place tricks)."""

    def __init__(self) -> None:
        self.segments: dict[str, dict[str, Any]] = {}
        self.last_ids: dict[int, int] = {}

    def encoded(self) -> dict[str, dict[str, Any]]:
        return {
            name: {
                "start": seg["start"],
                "length": seg["length"],
                "chunks": [list(chunk) for chunk in seg["chunks"]],
                "attrs": dict(seg["attrs"]),
            }
            for name, seg in self.segments.items()
        }

    def apply(self, record: dict[str, Any]) -> bool | None:
        """True: applied; False: a duplicate; None: does not fit (nothing changed)."""
        raw = record.get("id")
        if not (isinstance(raw, list) and len(raw) == 2 and all(type(v) is int for v in raw)):
            return None
        epoch, number = raw
        if number <= self.last_ids.get(epoch, 0):
            return False
        seg_name = record.get("seg")
        if type(seg_name) is not str:
            return None
        seg = copy.deepcopy(self.segments.get(seg_name, {"start": 0, "length": 0, "chunks": [], "attrs": {}}))
        attrs = record.get("attrs") or {}
        if type(attrs) is not dict or not all(type(k) is str and type(v) is int for k, v in attrs.items()):
            return None
        if not self._change(seg, record):
            return None
        seg["attrs"].update(attrs)
        self.segments[seg_name] = seg
        self.last_ids[epoch] = number
        return True

    @staticmethod
    def _change(seg: dict[str, Any], record: dict[str, Any]) -> bool:
        kind, chunks = record.get("k"), seg["chunks"]
        last = chunks[-1][0] if chunks else None
        if kind == ADD:
            chunk, offset, length = record.get("chunk"), record.get("offset"), record.get("length")
            if type(chunk) is not str or type(offset) is not int or type(length) is not int or length < 0:
                return False
            if "prev" not in record or record["prev"] != last or offset != seg["length"]:
                return False
            if any(c[0] == chunk for c in chunks):
                return False
            chunks.append([chunk, offset, length])
            seg["length"] = offset + length
            return True
        if kind == APPEND:
            offset, length = record.get("offset"), record.get("length")
            if type(offset) is not int or type(length) is not int or length < 0 or "chunk" not in record:
                return False
            if last is None or record["chunk"] != last or offset != seg["length"]:
                return False
            chunks[-1][2] += length
            seg["length"] += length
            return True
        if kind == TRUNCATE:
            chunk, start = record.get("chunk"), record.get("start")
            if type(start) is not int or not seg["start"] <= start <= seg["length"] or "chunk" not in record:
                return False
            index = next((i for i, c in enumerate(chunks) if c[0] == chunk), None)
            if index is not None:
                if not chunks[index][1] <= start <= chunks[index][1] + chunks[index][2]:
                    return False
                del chunks[:index]
            elif chunk == "" and start == seg["length"]:
                chunks.clear()
            else:
                return False
            seg["start"] = start
            return True
        return False


def _encoded(layout: SystemLayout) -> dict[str, dict[str, Any]]:
    return {name: seg.encode() for name, seg in layout.segments.items()}


def _valid(data: st.DataObject, seg: dict[str, Any]) -> dict[str, Any]:
    """A record of a drawn kind that fits ``seg`` (model state)."""
    chunks = seg["chunks"]
    kind = data.draw(st.sampled_from([ADD, APPEND, APPEND, APPEND, TRUNCATE]))
    if kind == APPEND and chunks:
        return {
            "k": APPEND,
            "chunk": chunks[-1][0],
            "offset": seg["length"],
            "length": data.draw(st.integers(0, 9)),
        }
    if kind == TRUNCATE:
        if not chunks or (seg["start"] == seg["length"] and data.draw(st.booleans())):
            return {"k": TRUNCATE, "chunk": "", "start": seg["length"]}  # to the end: no chunk left
        held = data.draw(st.sampled_from(chunks))
        low, high = max(held[1], seg["start"]), held[1] + held[2]
        if low <= high:
            start = data.draw(st.one_of(st.sampled_from([low, high]), st.integers(low, high)))
            return {"k": TRUNCATE, "chunk": held[0], "start": start}
    unused = [name for name in CHUNKS if name and all(c[0] != name for c in chunks)]
    return {
        "k": ADD,
        "chunk": data.draw(st.sampled_from(unused or ["a"])),  # all in use: a duplicate name
        "offset": seg["length"],
        "length": data.draw(st.integers(0, 9)),
        "prev": chunks[-1][0] if chunks else None,
    }


#: What a damaged field may hold instead: near misses, other names, wrong types.
WRONG = st.one_of(
    st.integers(-2, 40),
    st.sampled_from([*CHUNKS, True, False, 1.0, "1", None, [1], {"n": 1}]),
)


def _record(data: st.DataObject, model: Model, epoch: int, number: int) -> dict[str, Any]:
    """Mostly a record that fits; one in four has a field damaged, missing or off by one."""
    seg_name = data.draw(st.sampled_from(SEGMENTS))
    seg = model.segments.get(seg_name, {"start": 0, "length": 0, "chunks": [], "attrs": {}})
    record: dict[str, Any] = {"seg": seg_name, "id": [epoch, number], **_valid(data, seg)}
    if data.draw(st.booleans()):
        record["attrs"] = data.draw(
            st.dictionaries(st.sampled_from(["n", "m"]), st.integers(0, 99), max_size=2)
        )
    if data.draw(st.integers(0, 3)) == 0:
        victim = data.draw(st.sampled_from(sorted(record)))
        value = record[victim]
        choices = [WRONG]
        if type(value) is int:
            choices.append(st.sampled_from([value - 1, value + 1]))
        if victim == "id":
            choices.append(st.sampled_from([[epoch], [epoch, "2"], [epoch, True], (epoch, 1.0), None]))
        if victim == "attrs":
            choices.append(st.sampled_from([{"n": True}, {1: 2}, {"n": "1"}, [1]]))
        if data.draw(st.integers(0, 4)) == 0:
            del record[victim]
        else:
            record[victim] = data.draw(st.one_of(*choices))
    return record


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_apply_matches_the_model(data: st.DataObject) -> None:
    layout, model = SystemLayout(), Model()
    numbers = {1: 0, 2: 0}
    for _ in range(data.draw(st.integers(1, 40))):
        epoch = data.draw(st.sampled_from([1, 2]))
        number = numbers[epoch] + data.draw(st.sampled_from([1, 1, 1, 0, -1, 2]))
        record = _record(data, model, epoch, number)
        before = _encoded(layout)
        expected = model.apply(record)
        try:
            outcome: bool | None = layout.apply(record)
        except InconsistentRecord:
            outcome = None
        assert outcome == expected, (record, before)
        if outcome:
            numbers[epoch] = max(numbers[epoch], number)
        else:
            assert _encoded(layout) == before, "a record that is not applied changes nothing"
        assert _encoded(layout) == model.encoded(), record
        assert layout.last_ids == model.last_ids
        assert layout.check() == [], (record, layout)


def _filled() -> SystemLayout:
    layout = SystemLayout()
    records = [
        {"k": ADD, "seg": "log", "chunk": "a", "offset": 0, "length": 10, "prev": None},
        {"k": APPEND, "seg": "log", "chunk": "a", "offset": 10, "length": 5, "attrs": {"n": 1}},
        {"k": ADD, "seg": "log", "chunk": "b", "offset": 15, "length": 0, "prev": "a"},
        {"k": APPEND, "seg": "log", "chunk": "b", "offset": 15, "length": 7},
        {"k": ADD, "seg": "log", "chunk": "c", "offset": 22, "length": 3, "prev": "b"},
        {"k": TRUNCATE, "seg": "log", "chunk": "b", "start": 16, "attrs": {"cut": 16}},
    ]
    for number, record in enumerate(records, 1):
        assert layout.apply({**record, "id": [1, number]})
    return layout


def test_derived_chunks_and_copies() -> None:
    layout = _filled()
    log = layout.segment("log")
    assert log.chunks == (SystemChunk("b", 15, 7), SystemChunk("c", 22, 3))
    assert log.last_chunk == SystemChunk("c", 22, 3) and (log.start_offset, log.length) == (16, 25)
    assert log.attrs == {"n": 1, "cut": 16}
    clone = layout.copy()
    assert clone.apply({"k": APPEND, "seg": "log", "chunk": "c", "offset": 25, "length": 1, "id": [1, 7]})
    assert log.length == 25 and clone.segment("log").length == 26, "a copy shares nothing"
    assert SystemSegmentLayout.decode("log", log.encode()) == log
    assert SystemLayout().segment("x").last_chunk is None and SystemLayout().segment("x").chunks == ()


def test_truncate_to_the_end_drops_every_chunk() -> None:
    layout = _filled()
    assert layout.apply({"k": TRUNCATE, "seg": "log", "chunk": "", "start": 25, "id": [1, 7]})
    log = layout.segment("log")
    assert log.chunks == () and log.start_offset == log.length == 25 and log.check() == []
    added = {"k": ADD, "seg": "log", "chunk": "a", "offset": 25, "length": 1, "prev": None, "id": [1, 8]}
    assert layout.apply(added), "a dropped name may come back"


@pytest.mark.parametrize(
    "change",
    [
        {"k": TRUNCATE, "chunk": "b", "start": 23},  # past the end of the chunk it names
        {"k": TRUNCATE, "chunk": "c", "start": 21},  # before its start
        {"k": TRUNCATE, "chunk": "b", "start": 15},  # before the segment's start
        {"k": TRUNCATE, "chunk": "", "start": 24},  # no chunk, but not at the end
        {"k": TRUNCATE, "chunk": "a", "start": 16},  # a dropped chunk
        {"k": APPEND, "chunk": "b", "offset": 25, "length": 1},  # not the last chunk
        {"k": APPEND, "chunk": "c", "offset": 24, "length": 1},
        {"k": APPEND, "chunk": "c", "offset": 25, "length": -1},
        {"k": APPEND, "chunk": "c", "offset": 25, "length": True},
        {"k": ADD, "chunk": "b", "offset": 25, "length": 1, "prev": "c"},  # already there
        {"k": ADD, "chunk": "d", "offset": 25, "length": 1, "prev": "b"},
        {"k": ADD, "chunk": "d", "offset": 25.0, "length": 1, "prev": "c"},
        {"k": ADD, "chunk": 4, "offset": 25, "length": 1, "prev": "c"},
        {"k": ADD, "chunk": "d", "offset": 25, "length": 1},
        {"k": APPEND, "chunk": "c", "offset": 25, "length": 1, "attrs": {"n": 1.5}},
        {"k": "bogus"},
    ],
)
def test_a_change_that_does_not_fit_is_refused_and_changes_nothing(change: dict[str, Any]) -> None:
    layout = _filled()
    before = _encoded(layout)
    with pytest.raises(InconsistentRecord):
        layout.apply({"seg": "log", "id": [1, 7], **change})
    assert _encoded(layout) == before and layout.last_ids == {1: 6}


def test_a_duplicate_changes_nothing_and_says_so() -> None:
    layout = _filled()
    before = _encoded(layout)
    again = {"k": APPEND, "seg": "log", "chunk": "c", "offset": 25, "length": 4, "id": [1, 6]}
    assert layout.apply(again) is False and _encoded(layout) == before
    assert layout.apply({**again, "id": [2, 1]}) is True, "ids are per epoch"


def _snapshot(chunks: list[Any], start: int = 0, length: int = 10, **extra: Any) -> dict[str, Any]:
    raw = {"start": start, "length": length, "chunks": chunks, "attrs": {}, **extra}
    return {"k": SNAPSHOT, "id": [2, 1], "layouts": {"log": raw}}


@pytest.mark.parametrize(
    "record",
    [
        _snapshot([["a", 0, 4], ["b", 5, 5]]),  # a gap
        _snapshot([["a", 0, 6], ["b", 5, 5]]),  # an overlap
        _snapshot([["a", 0, 4]]),  # chunks end before the length
        _snapshot([["a", 0, 5], ["a", 5, 5]]),  # a chunk twice
        _snapshot([["a", 0, 10]], start=11),  # start past the length
        _snapshot([["a", 2, 8]], start=1),  # start before the first chunk
        _snapshot([["a", 0, 12], ["b", 12, -2]]),  # a negative length
        _snapshot([], start=0, length=3),  # no chunks, yet bytes
        _snapshot([["a", 0, 10.0]]),
        _snapshot([[1, 0, 10]]),
        _snapshot([["a", 0]]),
        _snapshot([["a", 0, 10]], attrs={"n": "1"}),
        {"k": SNAPSHOT, "id": [2, 1], "layouts": {7: {"start": 0, "length": 0, "chunks": []}}},
        {"k": SNAPSHOT, "id": [2, 1], "layouts": [1]},
        {"k": SNAPSHOT, "id": [2, 1]},
    ],
)
def test_an_invalid_snapshot_record_is_refused_and_changes_nothing(record: dict[str, Any]) -> None:
    layout = _filled()
    before = _encoded(layout)
    with pytest.raises(InconsistentRecord):
        layout.apply(record)
    assert _encoded(layout) == before and layout.last_ids == {1: 6}


def test_a_valid_snapshot_replaces_the_state() -> None:
    layout = _filled()
    record = _snapshot([["x", 0, 4], ["y", 4, 0], ["z", 4, 6]], start=3)
    assert layout.apply(record)
    assert _encoded(layout) == {"log": record["layouts"]["log"]}
