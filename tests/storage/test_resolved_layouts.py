"""Resolved layouts (``slts.storage.resolved_layouts``): reads of known ranges skip the
offset index and the chunk records, and never return another version's layout.

The module's invariants: extents are found only for the version they were learned at
(1), are ordered and disjoint (2, asserted as they are added) and bounded in number (3).
The engine's side: a read of a range read before is served from the extents (hits), an
owner's own appends keep them (``advance``), and every change of the segment by anyone
else (truncate, defrag and GC, delete and create again) is seen by the next read.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slts.errors import InvalidArgument, SegmentNotFound, SegmentTruncated
from slts.metadata.records import ChunkRecord, SegmentRecord
from slts.storage.chunked import ChunkedSegmentStorage
from slts.storage.context import EngineContext
from slts.storage.resolved_layouts import ResolvedLayouts
from tests.support.engine import Env, env_fixture

env = env_fixture([("filesystem", "lmdb"), ("memory", "memory")])


def _chunk(name: str, length: int) -> ChunkRecord:
    return ChunkRecord(
        name=name, index_id=1, index_offset=0, length=length, next_chunk=None, epoch=1, checksum=None
    )


def _record(name: str, length: int) -> SegmentRecord:
    return SegmentRecord(
        name=name,
        segment_id=1,
        status=1,
        start_offset=0,
        length=length,
        first_chunk="c0" if length else None,
        last_chunk="c0" if length else None,
        first_chunk_start_offset=0,
        last_chunk_start_offset=0,
        max_rolling_length=1 << 20,
        owner_epoch=1,
        chunk_count=1 if length else 0,
        created_ms=0,
        modified_ms=0,
    )


def _extents(lengths: list[int]) -> list[tuple[int, ChunkRecord]]:
    starts = [0, *itertools.accumulate(lengths)]
    return [(starts[i], _chunk(f"c{i}", length)) for i, length in enumerate(lengths)]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    learned=st.lists(st.booleans(), min_size=12, max_size=12),
    offset=st.integers(0, 60),
    length=st.integers(0, 30),
)
def test_find_returns_exactly_the_covering_extents_or_nothing(
    lengths: list[int], learned: list[bool], offset: int, length: int
) -> None:
    total = sum(lengths)
    offset, length = min(offset, total), min(length, total - min(offset, total))
    extents = _extents(lengths)
    known = [extent for extent, keep in zip(extents, learned, strict=False) if keep]
    layouts = ResolvedLayouts(100)
    layouts.learn("s", 7, _record("s", total), known)
    found = layouts.find("s", 7, offset, length)
    assert layouts.find("s", 8, offset, length) is None, "another version's layout is never found"
    covering = [(s, c) for s, c in extents if c.length and s < offset + length and s + c.length > offset]
    if length == 0:
        assert found is not None and found[1] == []
        return
    names_known = {c.name for _, c in known}
    if all(c.name in names_known for _, c in covering):
        assert found is not None and found[1] == covering
    else:
        assert found is None


def test_capacity_bounds_the_extents_and_the_least_recent_segment_goes_first() -> None:
    layouts = ResolvedLayouts(10)
    layouts.learn("a", 1, _record("a", 6), _extents([1] * 6))
    layouts.learn("b", 1, _record("b", 6), _extents([1] * 6))
    assert len(layouts) <= 10
    assert layouts.find("a", 1, 0, 1) is None and layouts.find("b", 1, 0, 6) is not None


def test_advance_keeps_every_extent_but_the_last_chunks() -> None:
    layouts = ResolvedLayouts(100)
    layouts.learn("s", 1, _record("s", 9), _extents([3, 3, 3]))
    layouts.advance("s", 1, 2, _record("s", 12))
    assert layouts.find("s", 2, 0, 6) is not None, "chunks an append cannot change stay"
    assert layouts.find("s", 2, 6, 1) is None, "the last chunk grew: resolved again"
    layouts.advance("s", 1, 3, _record("s", 15))  # not from the version kept: forgotten
    assert layouts.find("s", 3, 0, 1) is None and len(layouts) == 0


def test_find_unchanged_needs_the_marker_a_version_was_confirmed_at() -> None:
    layouts = ResolvedLayouts(100)
    layouts.learn("s", 1, _record("s", 9), _extents([3, 3, 3]))
    assert layouts.find_unchanged("s", 7, 0, 3) is None, "learned, never confirmed"
    assert layouts.find("s", 1, 0, 3, marker=7) is not None
    found = layouts.find_unchanged("s", 7, 3, 6)
    assert found is not None and [chunk.name for _, chunk in found[1]] == ["c1", "c2"]
    assert layouts.find_unchanged("s", 8, 0, 3) is None, "the marker moved: a commit may have landed"
    assert layouts.find_unchanged("t", 7, 0, 3) is None
    assert layouts.find("s", 2, 0, 3, marker=8) is None, "another version confirms nothing"
    assert layouts.find_unchanged("s", 8, 0, 3) is None
    misses = layouts.misses
    assert layouts.find_unchanged("s", 7, 9, 1) is None and layouts.misses == misses, "unknown range"
    layouts.advance("s", 1, 2, _record("s", 12))
    assert layouts.find_unchanged("s", 7, 0, 3) is None, "an append forgets the confirmation"
    assert layouts.find("s", 2, 0, 3, marker=9) is not None
    layouts.learn("s", 3, _record("s", 12), _extents([3, 3, 3, 3]))
    assert layouts.find_unchanged("s", 9, 0, 3) is None, "a new version forgets it too"


def test_a_read_at_an_unchanged_marker_reads_no_version(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = env.open(checksum_block_bytes=256)
    data = _data(5000)
    _segment(storage, data)
    handle = storage.open_read("s")
    assert storage.read(handle, 1000, 2000) == data[1000:3000]  # resolved, version confirmed
    versions: list[str] = []
    read_version = EngineContext.version

    def counted(context: EngineContext, name: str) -> int:
        versions.append(name)
        return read_version(context, name)

    monkeypatch.setattr(EngineContext, "version", counted)
    assert storage.read(handle, 1500, 1000) == data[1500:2500]
    assert versions == [], "no commit since the confirmation: the extents stand"
    storage.create("other")  # a commit of another segment moves the marker
    assert storage.read(handle, 1500, 1000) == data[1500:2500]
    assert versions == ["s"], "the marker moved: the version is read again"
    assert storage.read(handle, 1000, 500) == data[1000:1500]
    assert versions == ["s"], "confirmed again at the new marker"
    more = _data(700, seed=5)
    storage.write(storage.open_write("s"), len(data), more)
    assert storage.read(handle, 4000, 1700) == (data + more)[4000:5700]
    assert versions[-1] == "s" and len(versions) >= 2


@pytest.mark.parametrize("capacity", [0, -1, True, 1.5])
def test_a_bad_capacity_is_refused(capacity: object) -> None:
    with pytest.raises(InvalidArgument, match="capacity"):
        ResolvedLayouts(capacity)  # type: ignore[arg-type]


def _data(length: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(length))


def _segment(storage: ChunkedSegmentStorage, data: bytes, chunk_bytes: int = 1000) -> None:
    storage.create("s", max_rolling_length=chunk_bytes)
    handle = storage.open_write("s")
    for at in range(0, len(data), 700):
        storage.write(handle, at, data[at : at + 700])


def test_a_range_read_again_is_served_from_its_extents(env: Env) -> None:
    storage = env.open(checksum_block_bytes=256)
    data = _data(10_000)
    _segment(storage, data)
    handle = storage.open_read("s")
    layouts = storage._layouts
    assert storage.read(handle, 2500, 3000) == data[2500:5500]
    hits = layouts.hits
    assert storage.read(handle, 2600, 2000) == data[2600:4600]
    assert storage.read(handle, 2500, 3000) == data[2500:5500]
    assert layouts.hits == hits + 2
    assert storage.read(handle, 9000, 1000) == data[9000:]  # not resolved yet: a miss, then kept
    assert layouts.hits == hits + 2
    assert storage.read(handle, 9500, 500) == data[9500:]
    assert layouts.hits == hits + 3


def test_an_owners_appends_keep_what_its_readers_resolved(env: Env) -> None:
    storage = env.open()
    data = _data(5000)
    _segment(storage, data)
    handle = storage.open_write("s")
    assert storage.read(handle, 0, 5000) == data
    for round_ in range(3):
        more = _data(700, seed=round_ + 1)
        storage.write(handle, len(data), more)
        data += more
        hits = storage._layouts.hits
        assert storage.read(handle, 0, 3000) == data[:3000]
        assert storage._layouts.hits == hits + 1, "an append left the earlier chunks' extents"
        assert storage.read(handle, 0, len(data)) == data  # the grown end: resolved afresh


def test_another_instances_changes_are_seen_by_the_next_read(env: Env) -> None:
    owner = env.open(gc_delay_s=0.0, defrag_small_chunk_bytes=4000)
    data = _data(10_000)
    _segment(owner, data)
    reader = ChunkedSegmentStorage(0, None, env.binding, env.store, owner.config, read_only=True)
    env.instances.append(reader)
    handle = reader.open_read("s")
    assert reader.read(handle, 0, 10_000) == data  # every extent resolved

    owner.defrag("s")
    owner.gc.run_once()  # the chunks the reader resolved are gone
    assert reader.read(handle, 0, 10_000) == data

    owner.truncate(owner.open_write("s"), 4000)
    with pytest.raises(SegmentTruncated):
        reader.read(handle, 1000, 10)
    assert reader.read(handle, 4000, 6000) == data[4000:]

    owner.delete(owner.open_write("s"))
    owner.gc.run_once()
    with pytest.raises(SegmentNotFound):
        reader.read(handle, 4000, 10)
    other = _data(10_000, seed=3)
    _segment(owner, other)
    assert reader.read(reader.open_read("s"), 4000, 6000) == other[4000:], "a new segment, not the old one"


def test_continues_says_whether_a_known_extent_ends_at_an_offset() -> None:
    layouts = ResolvedLayouts(100)
    layouts.learn("s", 1, _record("s", 9), _extents([3, 3, 3])[1:2])  # [3, 6) known
    assert layouts.continues("s", 1, 6)
    assert not layouts.continues("s", 1, 3), "the start of a known extent is not its end"
    assert not layouts.continues("s", 1, 9) and not layouts.continues("s", 1, 5)
    assert not layouts.continues("s", 2, 6), "another version's extents say nothing"
    assert not layouts.continues("t", 1, 6)


def test_a_reader_walking_past_what_it_resolved_resolves_chunks_ahead(env: Env) -> None:
    from slts.storage.chunked import RESOLVE_AHEAD_CHUNKS

    storage = env.open(checksum_block_bytes=256)
    chunks = RESOLVE_AHEAD_CHUNKS + 10
    data = _data(1000 * chunks)
    _segment(storage, data)
    handle = storage.open_read("s")
    layouts = storage._layouts
    assert storage.read(handle, 0, 1000) == data[:1000]  # a first read: its own chunk only
    assert len(layouts) == 1
    assert storage.read(handle, 1000, 1000) == data[1000:2000]  # walks on: chunks ahead too
    assert len(layouts) == 2 + RESOLVE_AHEAD_CHUNKS
    hits = layouts.hits
    for at in range(2000, 1000 * (2 + RESOLVE_AHEAD_CHUNKS), 1000):
        assert storage.read(handle, at, 1000) == data[at : at + 1000]
    assert layouts.hits == hits + RESOLVE_AHEAD_CHUNKS, "every chunk resolved ahead was found"
    assert storage.read(handle, 1000 * chunks - 1000, 1000) == data[-1000:]
    assert storage.read(handle, 500, 2000) == data[500:2500]


def test_a_random_reader_resolves_no_chunk_it_does_not_read(env: Env) -> None:
    storage = env.open(checksum_block_bytes=256)
    data = _data(40_000)
    _segment(storage, data)
    handle = storage.open_read("s")
    for at in (17_000, 3_000, 29_500, 8_250):  # none starts where a resolved chunk ends
        assert storage.read(handle, at, 400) == data[at : at + 400]
    assert len(storage._layouts) == 4
