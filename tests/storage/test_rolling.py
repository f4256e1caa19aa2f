"""RollingStorage header import/export (PDP-34 backward compatibility)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slts.admin.rolling import (
    RollingHeader,
    export_segment,
    format_header,
    header_name,
    import_segment,
    legacy_chunk_name,
    parse_header,
)
from slts.admin.verify import verify_segment
from slts.errors import ChunkExists, InvalidArgument, MetadataCorrupted, SegmentExists
from tests.support.engine import Env


def test_parse_with_concat_entries() -> None:
    text = "maxsize=100&0=s$offset.0&10=s$offset.10&concat=2@25&0=t$offset.0&5=t$offset.5&40=s$offset.40&"
    header = parse_header(text)
    assert header.max_size == 100
    assert header.chunks == (
        (0, "s$offset.0"),
        (10, "s$offset.10"),
        (25, "t$offset.0"),
        (30, "t$offset.5"),
        (40, "s$offset.40"),
    )


@pytest.mark.parametrize(
    "text",
    ["", "0=a&", "maxsize=0&", "maxsize=x&", "maxsize=5&10=a&5=b&", "maxsize=5&concat=2@3&0=a&", "maxsize"],
)
def test_bad_headers_are_rejected(text: str) -> None:
    with pytest.raises(MetadataCorrupted):
        parse_header(text)


@given(st.integers(1, 1 << 40), st.lists(st.integers(1, 1000), max_size=20))
def test_format_then_parse_round_trips(max_size: int, lengths: list[int]) -> None:
    starts, position = [], 0
    for length in lengths:
        starts.append(position)
        position += length
    header = RollingHeader(max_size, tuple((start, f"seg$offset.{start}") for start in starts))
    assert parse_header(format_header(header)) == header


def test_import_a_legacy_segment(env: Env) -> None:
    storage = env.open()
    parts = [b"first-", b"second-", b"third"]
    header, start = ["maxsize=7&"], 0
    for part in parts:
        env.binding.create(legacy_chunk_name("old/seg", start), part)
        header.append(f"{start}={legacy_chunk_name('old/seg', start)}&")
        start += len(part)
    env.binding.create(header_name("old/seg"), "".join(header).encode())
    info = import_segment(storage, "old/seg")
    assert info.length == 18 and info.sealed and info.chunk_count == 3 and info.max_rolling_length == 7
    assert storage.read(storage.open_read("old/seg"), 0, 18) == b"".join(parts)
    assert verify_segment(storage, "old/seg") == []
    with pytest.raises(SegmentExists):
        import_segment(storage, "old/seg")
    handle = storage.open_write("old/seg")
    storage.unseal(handle)
    storage.write(handle, 18, b"+new")
    assert storage.info("old/seg").chunk_count == 4, "legacy chunks are never appended to"


def test_export_then_import_elsewhere(env: Env) -> None:
    storage = env.open()
    storage.create("x/y", max_rolling_length=4)
    handle = storage.open_write("x/y")
    storage.write(handle, 0, b"0123456789")
    name = export_segment(storage, "x/y")
    assert parse_header(env.binding.read(env.binding.open_read(name), 0, 1000).decode()).max_size == 4
    with pytest.raises(ChunkExists):
        export_segment(storage, "x/y")
    export_segment(storage, "x/y", replace=True)
    storage.truncate(handle, 5)
    with pytest.raises(InvalidArgument):
        export_segment(storage, "x/y", replace=True)
