"""The required operations of ``bindings/base.py``'s contract, run on every binding.

Each test names the guarantee it checks. Optional operations (concat, truncate,
read-only) are in ``test_optional.py``; names and listing in ``test_names.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import crc32c
import pytest
from slts.bindings import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource

from slts.errors import (
    ChunkCorrupted,
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNameInvalid,
    ChunkNotFound,
    ChunkReadOnly,
    InvalidArgument,
    UnsupportedOperation,
)
from tests.support.conformance import (
    CAPABILITY_FLAGS,
    NO_APPEND,
    content,
    pattern,
    require,
    require_missing,
)

DATA = pattern(100)


def test_capability_flags_are_booleans(storage):
    for flag in CAPABILITY_FLAGS:
        assert isinstance(getattr(storage, flag), bool), flag


# -- exclusive, atomic create ------------------------------------------------------------------


def test_create_stores_exactly_the_bytes_given(storage, raw):
    handle = storage.create("c", DATA)
    assert handle == ChunkHandle("c", readonly=False)
    assert storage.exists("c")
    assert storage.get_info("c") == ChunkInfo("c", len(DATA))
    assert content(storage, "c") == DATA
    assert raw.read("c") == DATA  # no header, no footer


def test_create_without_data_makes_an_empty_chunk(storage, raw):
    storage.create("empty")
    assert storage.exists("empty")
    assert storage.get_info("empty").length == 0
    assert content(storage, "empty") == b""
    assert raw.read("empty") == b""


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_create_takes_bytes_like_data_and_copies_it(storage, kind):
    buffer = bytearray(DATA)
    storage.create("c", kind(buffer))
    buffer[:] = bytes(len(buffer))  # the caller reuses its buffer
    assert content(storage, "c") == DATA


@pytest.mark.parametrize("second", [b"", b"other bytes", DATA])
def test_create_is_exclusive_and_leaves_the_chunk_unchanged(storage, raw, second):
    storage.create("c", DATA)
    with pytest.raises(ChunkExists) as caught:
        storage.create("c", second)
    assert caught.value.chunk == "c"
    assert isinstance(caught.value, FileExistsError)
    assert content(storage, "c") == DATA
    assert raw.read("c") == DATA


def test_bytes_stored_by_another_writer_read_back_exactly(storage, raw):
    raw.write("planted", DATA)
    assert storage.exists("planted")
    assert storage.get_info("planted").length == len(DATA)
    assert content(storage, "planted") == DATA
    assert list(storage.list()) == ["planted"]
    with pytest.raises(ChunkExists):
        storage.create("planted", b"x")


# -- exists, open, get_info --------------------------------------------------------------------


def test_exists_is_false_for_missing_chunks(storage):
    storage.create("a/b", b"x")
    assert not storage.exists("missing")
    assert not storage.exists("a")  # a "folder" of other chunks is not a chunk
    assert not storage.exists("a/")
    assert not storage.exists("a/b/c")
    assert storage.exists("a/b")


@pytest.mark.parametrize("operation", ["open_read", "open_write", "get_info"])
def test_missing_chunk_raises_chunk_not_found(storage, operation):
    storage.create("other", b"x")
    with pytest.raises(ChunkNotFound) as caught:
        getattr(storage, operation)("missing")
    assert caught.value.chunk == "missing"
    assert isinstance(caught.value, FileNotFoundError)
    assert not storage.exists("missing")


def test_open_gives_handles_of_the_right_kind(storage):
    storage.create("c", DATA)
    assert storage.open_read("c") == ChunkHandle("c", readonly=True)
    assert storage.open_write("c") == ChunkHandle("c", readonly=False)


# -- reads are exact ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "length"),
    [
        (0, 100),
        (0, 0),
        (0, 1),
        (10, 20),
        (99, 1),
        (99, 5),
        (90, 50),
        (100, 0),
        (100, 7),
        (0, 1000),
        (50, 10**12),
    ],
)
def test_read_returns_the_range_clipped_at_the_end(storage, offset, length):
    writable = storage.create("c", DATA)
    expected = DATA[offset : offset + length]
    for handle in (writable, storage.open_read("c")):
        result = storage.read(handle, offset, length)
        assert isinstance(result, bytes)
        assert result == expected


@pytest.mark.parametrize(("offset", "length"), [(0, 0), (0, 100), (10, 20), (99, 5), (100, 7), (50, 10**12)])
def test_read_view_returns_read_s_bytes_read_only(storage, offset, length):
    writable = storage.create("c", DATA)
    for handle in (writable, storage.open_read("c")):
        view = storage.read_view(handle, offset, length)
        assert isinstance(view, memoryview) and view.readonly
        assert view.tobytes() == storage.read(handle, offset, length) == DATA[offset : offset + length]


@pytest.mark.parametrize(("offset", "length"), [(0, 0), (0, 100), (10, 20), (99, 5), (100, 7), (50, 1000)])
def test_read_into_writes_read_s_bytes_into_the_view(storage, offset, length):
    writable = storage.create("c", DATA)
    for handle in (writable, storage.open_read("c")):
        buffer = bytearray(b"\xee" * length)
        count = storage.read_into(handle, offset, memoryview(buffer))
        expected = storage.read(handle, offset, length)
        assert count == len(expected) and bytes(buffer[:count]) == expected
        assert buffer[count:] == b"\xee" * (length - count), "nothing written past the chunk's end"


def test_read_into_past_the_end_of_a_missing_chunk_or_into_a_bad_view_raises(storage):
    handle = storage.create("c", DATA)
    with pytest.raises(ChunkInvalidOffset):
        storage.read_into(handle, len(DATA) + 1, memoryview(bytearray(1)))
    for view in (memoryview(b"read-only"), bytearray(4), memoryview(bytearray(8)).cast("I")):
        with pytest.raises(InvalidArgument, match="memoryview"):
            storage.read_into(handle, 0, view)
    storage.delete(handle)
    with pytest.raises(ChunkNotFound):
        storage.read_into(handle, 0, memoryview(bytearray(1)))


def _blocks(data: bytes, lengths: list[int], bad: int = -1) -> bytes:
    """``read_into_checked``'s list of ``data`` cut into ``lengths`` (past its end: CRCs of
    nothing), block ``bad``'s CRC wrong."""
    pairs, at = [], 0
    for index, length in enumerate(lengths):
        crc = crc32c.crc32c(data[at : at + length])
        pairs.append(struct.pack(">II", length, crc ^ 1 if index == bad else crc))
        at += length
    return b"".join(pairs)


@pytest.mark.parametrize(
    ("offset", "lengths"),
    [(0, [100]), (0, [30, 30, 40]), (10, [20]), (99, [1, 4]), (40, [25, 25, 25]), (95, [5, 1000])],
)
def test_read_into_checked_writes_read_s_bytes_into_the_view(storage, offset, lengths):
    writable = storage.create("c", DATA)
    for handle in (writable, storage.open_read("c")):
        buffer = bytearray(b"\xee" * sum(lengths))
        count = storage.read_into_checked(handle, offset, memoryview(buffer), _blocks(DATA[offset:], lengths))
        expected = DATA[offset : offset + sum(lengths)]
        assert count == len(expected) and bytes(buffer[:count]) == expected


@pytest.mark.parametrize(("offset", "lengths", "bad", "at"), [(0, [30, 30, 40], 1, 30), (7, [50, 43], 0, 7)])
def test_read_into_checked_names_the_first_block_that_fails(storage, offset, lengths, bad, at):
    handle = storage.create("c", DATA)
    with pytest.raises(ChunkCorrupted) as caught:
        storage.read_into_checked(
            handle, offset, memoryview(bytearray(sum(lengths))), _blocks(DATA[offset:], lengths, bad)
        )
    assert caught.value.chunk == "c" and caught.value.offset == at
    # A block cut short by the chunk's end is not checked: the caller knows the length.
    view = memoryview(bytearray(60))
    assert storage.read_into_checked(handle, 90, view, _blocks(DATA[90:], [10, 50], bad=1)) == 10


def test_read_into_checked_refuses_bad_arguments_and_a_missing_chunk(storage):
    handle = storage.create("c", DATA)
    for view in (memoryview(b"read-only"), bytearray(4), memoryview(bytearray(8)).cast("I")):
        with pytest.raises(InvalidArgument, match="memoryview"):
            storage.read_into_checked(handle, 0, view, _blocks(DATA, [4]))
    for blocks in (
        b"",
        b"\x00" * 7,
        _blocks(DATA, [3]),
        _blocks(DATA, [2, 3]),
        bytearray(_blocks(DATA, [4])),
    ):
        with pytest.raises(InvalidArgument, match="crc32c"):
            storage.read_into_checked(handle, 0, memoryview(bytearray(4)), blocks)  # type: ignore[arg-type]
    with pytest.raises(ChunkInvalidOffset):
        storage.read_into_checked(handle, len(DATA) + 1, memoryview(bytearray(1)), _blocks(b"", [1]))
    storage.delete(handle)
    with pytest.raises(ChunkNotFound):
        storage.read_into_checked(handle, 0, memoryview(bytearray(4)), _blocks(DATA, [4]))


def test_read_view_at_the_end_gives_nothing_and_past_it_or_of_a_missing_chunk_raises(storage):
    handle = storage.create("c", DATA)
    assert storage.read_view(handle, len(DATA), 10).tobytes() == b""
    with pytest.raises(ChunkInvalidOffset) as caught:
        storage.read_view(handle, len(DATA) + 1, 1)
    assert caught.value.chunk == "c"
    storage.delete(handle)
    with pytest.raises(ChunkNotFound):
        storage.read_view(handle, 0, 1)


def test_a_view_keeps_its_bytes_through_appends_delete_and_a_new_chunk_of_its_name(storage):
    """The bytes of a view never change (module doc): not when the chunk grows, nor when
    it is deleted, and a chunk created again under the name is read anew."""
    handle = storage.create("c", DATA)
    view = storage.read_view(handle, 10, 50)
    if storage.supports_append:
        storage.write(handle, len(DATA), b"appended")
        assert storage.read_view(handle, 95, 20).tobytes() == DATA[95:] + b"appended"
    storage.delete(handle)
    assert view.tobytes() == DATA[10:60]
    again = storage.create("c", b"other bytes " * 10)
    assert storage.read_view(again, 0, 11).tobytes() == b"other bytes"
    assert view.tobytes() == DATA[10:60]


def test_read_at_the_end_gives_nothing_and_past_it_raises(storage):
    handle = storage.create("c", DATA)
    assert storage.read(handle, len(DATA), 10) == b""
    for offset in (len(DATA) + 1, 10**9):
        with pytest.raises(ChunkInvalidOffset) as caught:
            storage.read(handle, offset, 1)
        assert isinstance(caught.value, IndexError)
        assert caught.value.chunk == "c"
    empty = storage.create("empty")
    assert storage.read(empty, 0, 10) == b""
    with pytest.raises(ChunkInvalidOffset):
        storage.read(empty, 1, 0)


def test_read_of_a_deleted_chunk_raises_not_found(storage):
    handle = storage.create("c", DATA)
    storage.delete(handle)
    with pytest.raises(ChunkNotFound):
        storage.read(handle, 0, 1)


# -- writes only at the end --------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 1, 99, 101, 1000, -1])
def test_write_not_at_the_end_raises_and_changes_nothing(storage, raw, offset):
    handle = storage.create("c", DATA)
    with pytest.raises(ChunkInvalidOffset):
        storage.write(handle, offset, b"xyz")
    assert content(storage, "c") == DATA
    assert raw.read("c") == DATA


def test_appends_build_the_chunk_in_order(storage, raw):
    require(storage, "supports_append", NO_APPEND)
    handle = storage.create("c")
    expected = bytearray()
    for seed, size in enumerate([1, 0, 7, 4096, 3, 65537, 2]):
        piece = pattern(size, seed)
        assert storage.write(handle, len(expected), piece) == size
        expected += piece
        assert storage.get_info("c").length == len(expected)
    assert content(storage, "c") == expected
    assert raw.read("c") == expected


def test_append_through_a_handle_from_open_write(storage, raw):
    require(storage, "supports_append", NO_APPEND)
    storage.create("c", DATA)
    handle = storage.open_write("c")
    assert storage.write(handle, len(DATA), bytearray(b"more")) == 4
    assert storage.write(handle, len(DATA) + 4, memoryview(b"!")) == 1
    assert raw.read("c") == DATA + b"more!"


def test_without_append_only_an_empty_chunk_is_written_at_zero(storage, raw):
    require_missing(storage, "supports_append", "without append only offset 0 of an empty chunk")
    handle = storage.create("c")
    assert storage.write(handle, 0, DATA) == len(DATA)
    assert raw.read("c") == DATA
    for offset in (len(DATA), 0):
        with pytest.raises(ChunkInvalidOffset):
            storage.write(handle, offset, b"more")
    assert content(storage, "c") == DATA


def test_write_through_a_read_only_handle_raises(storage, raw):
    storage.create("c")
    handle = storage.open_read("c")
    with pytest.raises(ChunkReadOnly) as caught:
        storage.write(handle, 0, b"x")  # offset 0 of an empty chunk: valid on every binding
    assert isinstance(caught.value, PermissionError)
    assert raw.read("c") == b""


def test_write_to_a_deleted_chunk_raises_and_does_not_recreate_it(storage, raw):
    handle = storage.create("c")
    storage.delete(handle)
    with pytest.raises(ChunkNotFound):
        storage.write(handle, 0, b"x")
    assert not storage.exists("c")
    assert not raw.exists("c")


# -- delete ------------------------------------------------------------------------------------


def test_delete_removes_the_chunk_and_frees_its_name(storage, raw):
    handle = storage.create("c", DATA)
    storage.create("keep", b"k")
    storage.delete(handle)
    assert not storage.exists("c")
    assert not raw.exists("c")
    assert list(storage.list()) == ["keep"]
    with pytest.raises(ChunkNotFound):
        storage.open_read("c")
    storage.create("c", b"new")
    assert content(storage, "c") == b"new"


def test_delete_through_a_handle_from_open_read(storage):
    storage.create("c", DATA)
    storage.delete(storage.open_read("c"))
    assert not storage.exists("c")


def test_delete_of_a_missing_chunk_raises_not_found(storage):
    handle = storage.create("c")
    storage.delete(handle)
    with pytest.raises(ChunkNotFound) as caught:
        storage.delete(handle)
    assert caught.value.chunk == "c"
    with pytest.raises(ChunkNotFound):
        storage.delete(ChunkHandle("never-created", readonly=False))


# -- bad input: refused alike by every binding, before anything changes ----------------------
#
# ``ChunkStorage`` checks the arguments of every public method before a binding's hook runs
# (``bindings/base.py``), so one table holds for every binding: the same bad input raises the
# same error everywhere, and the chunks and their bytes are what they were. An optional
# operation whose flag is off raises ``UnsupportedOperation`` first, whatever its arguments.

INVALID_NAMES = ["", "\x00", "a\x00b", "x" * 1025, "é" * 513, "/" * 1025, "\ud800", None, b"bytes"]
#: Things passed where a ``ChunkHandle`` belongs (``InvalidArgument``).
NOT_HANDLES = [None, "c", ("c", False)]
#: Hand-built handles whose name no binding may hold (``ChunkNameInvalid``).
BAD_NAME_HANDLES = [ChunkHandle("", False), ChunkHandle("a\x00b", True)]
#: Data that is not bytes-like (``InvalidArgument``; bytes-like data is taken, see above).
NOT_BYTES = ["text", 5, None, [1, 2]]


@dataclass(frozen=True)
class BadInput:
    """One call with one bad argument, on a storage holding ``c`` (``DATA``) and ``e`` (empty).

    ``call(storage, handles)`` gets the handles ``wc``/``we`` (writable) and ``rc``/``re``
    (read-only) of those chunks. ``flag`` names the capability the operation needs.
    """

    id: str
    call: Callable[[ChunkStorage, dict[str, ChunkHandle]], object]
    error: type[Exception]
    flag: str | None = None


def _bad_inputs() -> list[BadInput]:
    cases = []
    for name in INVALID_NAMES:
        shown = repr(name)[:12]
        for op in ("exists", "create", "open_read", "open_write", "get_info"):
            cases.append(
                BadInput(
                    f"{op}-name-{shown}", lambda s, h, op=op, n=name: getattr(s, op)(n), ChunkNameInvalid
                )
            )
        cases.append(
            BadInput(
                f"concat-target-{shown}",
                lambda s, h, n=name: s.concat(n, [ConcatSource("c", 0, 1)]),
                ChunkNameInvalid,
                "supports_concat",
            )
        )
        cases.append(
            BadInput(
                f"concat-source-{shown}",
                lambda s, h, n=name: s.concat("t", [ConcatSource(n, 0, 1)]),
                ChunkNameInvalid,
                "supports_concat",
            )
        )
    for offset, length in [
        (-1, 1),
        (0, -1),
        (-5, -5),
        (1.5, 1),
        (0, 2.0),
        ("0", 1),
        (None, 1),
        (True, 1),
        (0, False),
    ]:
        cases += [
            BadInput(
                f"read-range-{offset!r}-{length!r}",
                lambda s, h, o=offset, n=length: s.read(h["rc"], o, n),
                ChunkInvalidOffset,
            ),
            BadInput(
                f"read_view-range-{offset!r}-{length!r}",
                lambda s, h, o=offset, n=length: s.read_view(h["rc"], o, n),
                ChunkInvalidOffset,
            ),
        ]
    for offset in (-1, 100.0, None, True):
        cases.append(
            BadInput(
                f"write-offset-{offset!r}",
                lambda s, h, o=offset: s.write(h["wc"], o, b"x"),
                ChunkInvalidOffset,
            )
        )
    for length in (-1, 1.5, "1", False):
        cases.append(
            BadInput(
                f"truncate-length-{length!r}",
                lambda s, h, n=length: s.truncate(h["wc"], n),
                ChunkInvalidOffset,
                "supports_truncate",
            )
        )
    for offset, length in [(-1, 1), (0, -1), (0, 1.5)]:
        cases.append(
            BadInput(
                f"concat-range-{offset!r}-{length!r}",
                lambda s, h, o=offset, n=length: s.concat("t", [ConcatSource("c", o, n)]),
                ChunkInvalidOffset,
                "supports_concat",
            )
        )
    cases.append(
        BadInput("concat-no-sources", lambda s, h: s.concat("t", []), ChunkInvalidOffset, "supports_concat")
    )
    for thing in NOT_HANDLES:
        shown = repr(thing)
        cases += [
            BadInput(f"read-handle-{shown}", lambda s, h, x=thing: s.read(x, 0, 1), InvalidArgument),
            BadInput(f"view-handle-{shown}", lambda s, h, x=thing: s.read_view(x, 0, 1), InvalidArgument),
            BadInput(f"write-handle-{shown}", lambda s, h, x=thing: s.write(x, 0, b"x"), InvalidArgument),
            BadInput(f"delete-handle-{shown}", lambda s, h, x=thing: s.delete(x), InvalidArgument),
            BadInput(
                f"truncate-handle-{shown}",
                lambda s, h, x=thing: s.truncate(x, 0),
                InvalidArgument,
                "supports_truncate",
            ),
            BadInput(
                f"set_readonly-handle-{shown}",
                lambda s, h, x=thing: s.set_readonly(x, True),
                InvalidArgument,
                "supports_readonly",
            ),
        ]
    for handle in BAD_NAME_HANDLES:
        shown = repr(handle.name)
        cases += [
            BadInput(f"read-named-{shown}", lambda s, h, x=handle: s.read(x, 0, 1), ChunkNameInvalid),
            BadInput(f"view-named-{shown}", lambda s, h, x=handle: s.read_view(x, 0, 1), ChunkNameInvalid),
            BadInput(f"delete-named-{shown}", lambda s, h, x=handle: s.delete(x), ChunkNameInvalid),
        ]
    cases += [
        # Offset 0 of an empty chunk and the end of a full one: valid on every binding but for the handle.
        BadInput("write-read-only-handle-empty", lambda s, h: s.write(h["re"], 0, b"x"), ChunkReadOnly),
        BadInput("write-read-only-handle-end", lambda s, h: s.write(h["rc"], len(DATA), b"x"), ChunkReadOnly),
        BadInput(
            "truncate-read-only-handle",
            lambda s, h: s.truncate(h["rc"], 1),
            ChunkReadOnly,
            "supports_truncate",
        ),
    ]
    for data in NOT_BYTES:
        shown = repr(data)
        cases += [
            BadInput(f"create-data-{shown}", lambda s, h, d=data: s.create("n", d), InvalidArgument),
            BadInput(f"write-data-{shown}", lambda s, h, d=data: s.write(h["we"], 0, d), InvalidArgument),
        ]
    return cases


BAD_INPUTS = _bad_inputs()


def _everything(storage: ChunkStorage, raw) -> dict[str, bytes]:
    """Every chunk's bytes, as listed by the binding and read past it."""
    return {name: raw.read(name) for name in storage.list()}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[case.id for case in BAD_INPUTS])
def test_bad_input_raises_the_same_error_everywhere_and_changes_nothing(storage, raw, case):
    handles = {"wc": storage.create("c", DATA), "we": storage.create("e")}
    handles["rc"], handles["re"] = storage.open_read("c"), storage.open_read("e")
    before = _everything(storage, raw)
    expected = case.error if case.flag is None or getattr(storage, case.flag) else UnsupportedOperation
    with pytest.raises(expected):
        case.call(storage, handles)
    assert _everything(storage, raw) == before == {"c": DATA, "e": b""}
    assert not raw.exists("n") and not raw.exists("t")


@pytest.mark.parametrize("name", ["", "a\x00b", "\ud800", None], ids=repr)
def test_invalid_names_raise_a_value_error_naming_the_chunk(storage, name):
    with pytest.raises(ChunkNameInvalid) as caught:
        storage.open_read(name)
    assert isinstance(caught.value, ValueError)
    assert caught.value.chunk == name


# -- durable on return -------------------------------------------------------------------------


def test_a_reopened_instance_sees_every_acknowledged_change(binding):
    storage = binding.storage
    storage.create("created", DATA)
    storage.delete(storage.create("deleted", b"gone"))
    expected = {"created": DATA}
    if storage.supports_append:
        handle = storage.create("appended", b"head")
        storage.write(handle, 4, b"tail")
        expected["appended"] = b"headtail"
    if storage.supports_concat:
        storage.concat("concat", [ConcatSource("created", 10, 5), ConcatSource("created", 0, 2)])
        expected["concat"] = DATA[10:15] + DATA[0:2]
    if storage.supports_truncate:
        storage.create("truncated", DATA)
        storage.truncate(storage.open_write("truncated"), 30)
        expected["truncated"] = DATA[:30]
    reopened = binding.reopen()
    assert list(reopened.list()) == sorted(expected)
    for name, data in expected.items():
        assert content(reopened, name) == data
        assert binding.raw.read(name) == data
