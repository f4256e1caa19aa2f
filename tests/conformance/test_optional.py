"""Optional operations (concat, truncate, set_readonly), on every binding that announces them,
and ``UnsupportedOperation`` on every binding that does not."""

from __future__ import annotations

import pytest
from slts.bindings import ChunkInfo, ConcatSource

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkReadOnly,
    UnsupportedOperation,
)
from tests.support.conformance import (
    NO_APPEND,
    NO_CONCAT,
    NO_READONLY,
    NO_TRUNCATE,
    content,
    pattern,
    require,
    require_missing,
)

DATA = pattern(100)
A = pattern(50, seed=1)
B = pattern(30, seed=2)


@pytest.fixture
def sources(storage):
    storage.create("src/a", A)
    storage.create("src/b", B)
    storage.create("src/empty")
    return storage


# -- concat ------------------------------------------------------------------------------------


def test_concat_builds_a_new_chunk_from_source_ranges(sources, raw):
    storage = sources
    require(storage, "supports_concat", NO_CONCAT)
    pieces = [
        ConcatSource("src/a", 2, 8),
        ConcatSource("src/b", 0, 30),
        ConcatSource("src/empty", 0, 0),
        ConcatSource("src/a", 0, 0),
        ConcatSource("src/a", 40, 10),  # up to the very end
        ConcatSource("src/a", 2, 8),  # the same range twice
        ConcatSource("src/a", 50, 0),  # empty range at the end
    ]
    expected = A[2:10] + B + A[40:50] + A[2:10]
    assert storage.concat("target", pieces) == ChunkInfo("target", len(expected))
    assert content(storage, "target") == expected
    assert raw.read("target") == expected
    assert raw.read("src/a") == A  # sources are left untouched
    assert raw.read("src/b") == B
    assert list(storage.list()) == ["src/a", "src/b", "src/empty", "target"]


def test_a_concat_target_is_an_ordinary_chunk(sources, raw):
    storage = sources
    require(storage, "supports_concat", NO_CONCAT)
    require(storage, "supports_append", NO_APPEND)
    storage.concat("target", [ConcatSource("src/b", 0, 5)])
    handle = storage.open_write("target")
    storage.write(handle, 5, b"+")
    assert raw.read("target") == B[:5] + b"+"
    storage.delete(handle)
    assert not storage.exists("target")


def test_concat_copies_large_ranges_exactly(storage, raw):
    require(storage, "supports_concat", NO_CONCAT)
    big = pattern((8 << 20) + 13, seed=7)  # beyond one 8 MiB copy step
    storage.create("big", big)
    storage.concat("target", [ConcatSource("big", 3, len(big) - 3), ConcatSource("big", 0, 3)])
    assert raw.read("target") == big[3:] + big[:3]


def test_concat_onto_an_existing_target_raises_and_changes_nothing(sources, raw):
    storage = sources
    require(storage, "supports_concat", NO_CONCAT)
    storage.create("target", DATA)
    with pytest.raises(ChunkExists) as caught:
        storage.concat("target", [ConcatSource("src/a", 0, 10)])
    assert caught.value.chunk == "target"
    assert raw.read("target") == DATA
    with pytest.raises(ChunkExists):
        storage.concat("src/a", [ConcatSource("src/b", 0, 10)])
    assert raw.read("src/a") == A


def test_concat_from_a_missing_source_raises_and_creates_nothing(sources, raw):
    storage = sources
    require(storage, "supports_concat", NO_CONCAT)
    with pytest.raises(ChunkNotFound) as caught:
        storage.concat("target", [ConcatSource("src/a", 0, 10), ConcatSource("src/missing", 0, 0)])
    assert caught.value.chunk == "src/missing"
    assert not storage.exists("target")
    assert not raw.exists("target")


@pytest.mark.parametrize(
    ("offset", "length"), [(45, 6), (0, 51), (51, 0), (50, 1), (10**9, 1), (-1, 1), (0, -1)]
)
def test_concat_of_a_range_outside_a_source_raises_and_creates_nothing(sources, raw, offset, length):
    storage = sources
    require(storage, "supports_concat", NO_CONCAT)
    with pytest.raises(ChunkInvalidOffset):
        storage.concat("target", [ConcatSource("src/b", 0, 5), ConcatSource("src/a", offset, length)])
    assert not storage.exists("target")
    assert not raw.exists("target")
    assert list(storage.list()) == ["src/a", "src/b", "src/empty"]


def test_concat_of_no_sources_raises(storage):
    require(storage, "supports_concat", NO_CONCAT)
    with pytest.raises(ChunkInvalidOffset):
        storage.concat("target", [])
    assert not storage.exists("target")


def test_concat_without_the_capability_raises_unsupported(sources):
    storage = sources
    require_missing(storage, "supports_concat", "concat is unsupported")
    with pytest.raises(UnsupportedOperation) as caught:
        storage.concat("target", [ConcatSource("src/a", 0, 10)])
    assert isinstance(caught.value, NotImplementedError)
    assert not storage.exists("target")


# -- truncate ----------------------------------------------------------------------------------


def test_truncate_shortens_the_chunk(storage, raw):
    require(storage, "supports_truncate", NO_TRUNCATE)
    handle = storage.create("c", DATA)
    for length in (60, 60, 1, 0):
        assert storage.truncate(handle, length) is None
        assert storage.get_info("c").length == length
        assert content(storage, "c") == DATA[:length]
        assert raw.read("c") == DATA[:length]


def test_appends_continue_at_the_truncated_end(storage, raw):
    require(storage, "supports_truncate", NO_TRUNCATE)
    require(storage, "supports_append", NO_APPEND)
    handle = storage.create("c", DATA)
    storage.truncate(handle, 10)
    with pytest.raises(ChunkInvalidOffset):
        storage.write(handle, len(DATA), b"x")
    storage.write(handle, 10, b"tail")
    assert raw.read("c") == DATA[:10] + b"tail"


@pytest.mark.parametrize("length", [101, 10**9, -1])
def test_truncate_outside_the_chunk_raises_and_changes_nothing(storage, raw, length):
    require(storage, "supports_truncate", NO_TRUNCATE)
    handle = storage.create("c", DATA)
    with pytest.raises(ChunkInvalidOffset):
        storage.truncate(handle, length)
    assert raw.read("c") == DATA


def test_truncate_of_a_missing_chunk_raises_not_found(storage):
    require(storage, "supports_truncate", NO_TRUNCATE)
    handle = storage.create("c", DATA)
    storage.delete(handle)
    with pytest.raises(ChunkNotFound):
        storage.truncate(handle, 0)
    assert not storage.exists("c")


def test_truncate_through_a_read_only_handle_raises(storage, raw):
    require(storage, "supports_truncate", NO_TRUNCATE)
    storage.create("c", DATA)
    with pytest.raises(ChunkReadOnly):
        storage.truncate(storage.open_read("c"), 10)
    assert raw.read("c") == DATA


def test_truncate_of_a_read_only_chunk_raises(storage, raw):
    require(storage, "supports_truncate", NO_TRUNCATE)
    require(storage, "supports_readonly", NO_READONLY)
    handle = storage.create("c", DATA)
    storage.set_readonly(handle, True)
    with pytest.raises(ChunkReadOnly):
        storage.truncate(handle, 10)
    assert raw.read("c") == DATA


def test_truncate_without_the_capability_raises_unsupported(storage, raw):
    require_missing(storage, "supports_truncate", "truncate is unsupported")
    handle = storage.create("c", DATA)
    with pytest.raises(UnsupportedOperation):
        storage.truncate(handle, 10)
    assert raw.read("c") == DATA


# -- read-only chunks --------------------------------------------------------------------------


def test_a_read_only_chunk_refuses_writers(storage, raw):
    require(storage, "supports_readonly", NO_READONLY)
    handle = storage.create("c")  # empty: offset 0 is valid on every binding
    storage.set_readonly(handle, True)
    with pytest.raises(ChunkReadOnly) as caught:
        storage.open_write("c")
    assert caught.value.chunk == "c"
    with pytest.raises(ChunkReadOnly):
        storage.write(handle, 0, b"x")  # a handle taken before the change
    assert raw.read("c") == b""


def test_a_read_only_chunk_stays_readable(storage):
    require(storage, "supports_readonly", NO_READONLY)
    handle = storage.create("c", DATA)
    storage.set_readonly(handle, True)
    assert storage.exists("c")
    assert storage.get_info("c").length == len(DATA)
    assert storage.read(storage.open_read("c"), 5, 10) == DATA[5:15]
    assert list(storage.list()) == ["c"]


def test_set_readonly_false_makes_the_chunk_writable_again(storage, raw):
    require(storage, "supports_readonly", NO_READONLY)
    handle = storage.create("c")
    storage.set_readonly(handle, True)
    storage.set_readonly(handle, True)  # idempotent
    storage.set_readonly(storage.open_read("c"), False)
    handle = storage.open_write("c")
    storage.write(handle, 0, b"x")
    assert raw.read("c") == b"x"


def test_a_read_only_chunk_can_be_deleted(storage, raw):
    # The garbage collector deletes sealed chunks.
    require(storage, "supports_readonly", NO_READONLY)
    handle = storage.create("c", DATA)
    storage.set_readonly(handle, True)
    storage.delete(handle)
    assert not storage.exists("c")
    assert not raw.exists("c")


def test_set_readonly_of_a_missing_chunk_raises_not_found(storage):
    require(storage, "supports_readonly", NO_READONLY)
    handle = storage.create("c")
    storage.delete(handle)
    with pytest.raises(ChunkNotFound):
        storage.set_readonly(handle, True)
    assert not storage.exists("c")


def test_set_readonly_without_the_capability_raises_unsupported(storage):
    require_missing(storage, "supports_readonly", "set_readonly is unsupported")
    handle = storage.create("c")
    with pytest.raises(UnsupportedOperation):
        storage.set_readonly(handle, True)
    assert storage.open_write("c") == handle
