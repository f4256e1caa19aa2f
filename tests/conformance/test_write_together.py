"""``write_together`` (``bindings/base.py``), run on every binding: each append as ``write``
would do it, one outcome per append, every success durable and every failure its own."""

from __future__ import annotations

import pytest
from slts.bindings import ChunkHandle
from slts.bindings.base import ChunkAppend

from slts.errors import ChunkInvalidOffset, ChunkNameInvalid, ChunkNotFound, ChunkReadOnly, InvalidArgument
from tests.support.conformance import NO_APPEND, content, pattern, require

DATA = pattern(100)


def test_appends_to_several_chunks_land_in_each_and_report_their_lengths(binding):
    """Three appends, three chunks: each holds its bytes, and a reopened instance (a
    restarted process) reads them: durable on return."""
    storage, raw = binding.storage, binding.raw
    require(storage, "supports_append", NO_APPEND)
    handles = [storage.create(f"c{i}", pattern(10, i)) for i in range(3)]
    pieces = [pattern(4096, 7), bytearray(b"x"), memoryview(pattern(3, 1))]
    results = storage.write_together([ChunkAppend(h, 10, p) for h, p in zip(handles, pieces, strict=True)])
    assert results == [4096, 1, 3]
    reopened = binding.reopen()
    try:
        for i, piece in enumerate(pieces):
            assert raw.read(f"c{i}") == pattern(10, i) + bytes(piece)
            assert content(reopened, f"c{i}") == pattern(10, i) + bytes(piece)
    finally:
        reopened.close()


def test_a_failed_append_is_its_own_and_changes_nothing_of_its_chunk(storage, raw):
    """A wrong offset, a missing chunk and a read-only handle among good appends: each is
    that append's typed error (what ``write`` would raise), its chunk unchanged; the good
    appends land."""
    require(storage, "supports_append", NO_APPEND)
    good = storage.create("good", DATA)
    shifted = storage.create("shifted", DATA)
    gone = storage.create("gone", DATA)
    storage.delete(gone)
    read_only = storage.open_read(storage.create("ro", DATA).name)
    last = storage.create("last", DATA)
    results = storage.write_together(
        [
            ChunkAppend(good, 100, b"a"),
            ChunkAppend(shifted, 99, b"b"),
            ChunkAppend(gone, 100, b"c"),
            ChunkAppend(read_only, 100, b"d"),
            ChunkAppend(last, 100, b"e"),
        ]
    )
    assert results[0] == 1 and results[4] == 1
    assert isinstance(results[1], ChunkInvalidOffset)
    assert isinstance(results[2], ChunkNotFound)
    assert isinstance(results[3], ChunkReadOnly)
    assert raw.read("good") == DATA + b"a" and raw.read("last") == DATA + b"e"
    assert raw.read("shifted") == DATA and raw.read("ro") == DATA
    assert not raw.exists("gone")


def test_one_chunk_twice_or_no_appends_at_all_are_refused_whole(storage, raw):
    """Two appends to one chunk, or something that is not a list of ``ChunkAppend``:
    ``InvalidArgument``, nothing written; no appends: no results."""
    handle = storage.create("c")
    other = storage.create("d")
    with pytest.raises(InvalidArgument, match="distinct chunks"):
        storage.write_together(
            [ChunkAppend(other, 0, b"x"), ChunkAppend(handle, 0, b"y"), ChunkAppend(handle, 1, b"z")]
        )
    for bad in (None, [("c", 0, b"x")], ChunkAppend(handle, 0, b"x"), "c"):
        with pytest.raises(InvalidArgument, match="ChunkAppend"):
            storage.write_together(bad)
    assert raw.read("c") == b"" and raw.read("d") == b""
    assert storage.write_together([]) == []


@pytest.mark.parametrize(
    ("offset", "data", "error"),
    [(-1, b"x", ChunkInvalidOffset), (True, b"x", ChunkInvalidOffset), (0, "text", InvalidArgument)],
)
def test_a_bad_offset_or_data_is_that_appends_error(storage, raw, offset, data, error):
    """Bad arguments of one append: its error, checked before anything is written; the
    other append (offset 0 of an empty chunk: valid on every binding) lands."""
    bad = storage.create("bad")
    fine = storage.create("fine")
    results = storage.write_together([ChunkAppend(bad, offset, data), ChunkAppend(fine, 0, b"ok")])
    assert isinstance(results[0], error) and results[1] == 2
    assert raw.read("bad") == b"" and raw.read("fine") == b"ok"


def test_something_else_than_a_handle_is_that_appends_error(storage, raw):
    """A chunk's name where its handle belongs: ``InvalidArgument`` for that append alone
    (not a refusal of the whole call)."""
    fine = storage.create("fine")
    results = storage.write_together([ChunkAppend("fine", 0, b"x"), ChunkAppend(fine, 0, b"ok")])
    assert isinstance(results[0], InvalidArgument) and "ChunkHandle" in str(results[0])
    assert results[1] == 2
    assert raw.read("fine") == b"ok"


def test_a_hand_built_handle_with_a_bad_name_is_that_appends_error(storage, raw):
    """A handle built by hand with a name no binding stores: ``ChunkNameInvalid`` for
    that append alone."""
    fine = storage.create("fine")
    results = storage.write_together(
        [ChunkAppend(ChunkHandle("", readonly=False), 0, b"x"), ChunkAppend(fine, 0, b"ok")]
    )
    assert isinstance(results[0], ChunkNameInvalid) and results[1] == 2
    assert raw.read("fine") == b"ok"
