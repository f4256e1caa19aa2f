"""The offset-index cache of remote fetches: parsed and checked once, the same answers as
``kafka_formats.lookup_position``, least recently used out first, nothing kept on error."""

from __future__ import annotations

import random
import uuid

import pytest

from slts.errors import InvalidArgument, InvalidLogSegment
from slts.remote import kafka_formats as kf
from slts.remote.index_cache import OffsetIndexCache

BASE = 1_000


def index_bytes(count: int, seed: int = 0) -> tuple[bytes, list[kf.OffsetIndexEntry]]:
    rng = random.Random(seed)
    entries, offset, position = [], BASE, 0
    for _ in range(count):
        offset += rng.randrange(1, 50)
        position += rng.randrange(1, 5000)
        entries.append(kf.OffsetIndexEntry(offset, position))
    return kf.encode_offset_index(entries, BASE), entries


def test_positions_match_the_parsed_index_at_every_offset() -> None:
    data, entries = index_bytes(300)
    index = OffsetIndexCache().get(uuid.uuid4(), BASE, lambda: data)
    for offset in range(BASE, entries[-1].offset + 60):
        assert index.position_for(offset) == kf.lookup_position(entries, offset), offset


def test_an_index_is_read_once_and_the_least_recently_used_goes_first() -> None:
    cache = OffsetIndexCache(max_entries=250)
    loads: list[uuid.UUID] = []
    ids = [uuid.uuid4() for _ in range(3)]

    def loader(segment_id: uuid.UUID):  # type: ignore[no-untyped-def]
        def load() -> bytes:
            loads.append(segment_id)
            return index_bytes(100, seed=ids.index(segment_id))[0]

        return load

    first = cache.get(ids[0], BASE, loader(ids[0]))
    assert cache.get(ids[0], BASE, loader(ids[0])) is first and loads == [ids[0]]
    cache.get(ids[1], BASE, loader(ids[1]))
    cache.get(ids[0], BASE, loader(ids[0]))  # now the most recently used
    cache.get(ids[2], BASE, loader(ids[2]))  # 300 entries > 250: the oldest use goes
    assert len(cache) == 2
    cache.get(ids[0], BASE, loader(ids[0]))
    assert loads == [ids[0], ids[1], ids[2]], "ids[0] stayed, ids[1] was evicted"
    cache.get(ids[1], BASE, loader(ids[1]))
    assert loads[-1] == ids[1]


def test_a_bad_index_raises_and_is_not_kept() -> None:
    cache = OffsetIndexCache()
    segment_id = uuid.uuid4()
    data, _ = index_bytes(10)
    with pytest.raises(InvalidLogSegment, match="orders-3 segment x"):
        cache.get(segment_id, BASE, lambda: data[:-3], segment="orders-3 segment x")
    assert len(cache) == 0
    assert cache.get(segment_id, BASE, lambda: data).position_for(BASE) == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_the_size_must_be_a_non_negative_integer(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="max_entries"):
        OffsetIndexCache(bad)  # type: ignore[arg-type]
