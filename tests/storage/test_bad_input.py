"""Every bad input raises its typed error and changes nothing (data or metadata)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from slts.errors import (
    Fenced,
    InvalidArgument,
    InvalidName,
    InvalidOffset,
    ReadOnlyInstance,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SltsError,
    StorageClosed,
)
from slts.storage.chunked import ChunkedSegmentStorage, SegmentHandle
from tests.support.engine import Env

BAD_NAMES = [
    "",
    "x" * 257,
    "a/" + "y" * 81,
    "nul\x00inside",
    "tab\there",
    "..",
    "a/../b",
    "./a",
    "/absolute",
    "trailing/",
    "double//slash",
    "_system/journal",
    123,
    None,
    b"bytes",
]


@pytest.fixture
def populated(env: Env) -> tuple[Env, ChunkedSegmentStorage]:
    storage = env.open()
    storage.create("ok", max_rolling_length=4)
    handle = storage.open_write("ok")
    storage.write(handle, 0, b"0123456789")
    storage.create("sealed")
    sealed = storage.open_write("sealed")
    storage.write(sealed, 0, b"abc")
    storage.seal(sealed)
    return env, storage


def expect_unchanged(env: Env, error: type[SltsError], call: Callable[[], object]) -> SltsError:
    before = env.snapshot()
    with pytest.raises(error) as raised:
        call()
    assert env.snapshot() == before, "a rejected operation changed data or metadata"
    assert str(raised.value), "errors must say what was wrong"
    return raised.value


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_invalid_names_are_rejected_everywhere(
    populated: tuple[Env, ChunkedSegmentStorage], name: object
) -> None:
    env, storage = populated
    for operation in (storage.create, storage.exists, storage.info, storage.open_read, storage.open_write):
        expect_unchanged(env, InvalidName, lambda op=operation: op(name))  # type: ignore[misc]


def test_bad_offsets_and_lengths(populated: tuple[Env, ChunkedSegmentStorage]) -> None:
    env, storage = populated
    handle = storage.open_write("ok")
    cases: list[tuple[type[SltsError], Callable[[], object]]] = [
        (InvalidOffset, lambda: storage.write(handle, -1, b"x")),
        (InvalidOffset, lambda: storage.write(handle, 9, b"x")),  # not at the end
        (InvalidOffset, lambda: storage.write(handle, 11, b"x")),  # past the end
        (InvalidOffset, lambda: storage.write(handle, True, b"x")),
        (InvalidOffset, lambda: storage.read(handle, -1, 1)),
        (InvalidOffset, lambda: storage.read(handle, 0, -1)),
        (InvalidOffset, lambda: storage.read(handle, 5, 6)),  # passes the end
        (InvalidOffset, lambda: storage.read(handle, 11, 0)),
        (InvalidOffset, lambda: storage.read(handle, 1.5, 1)),  # type: ignore[arg-type]
        (InvalidOffset, lambda: storage.read_view(handle, -1, 1)),
        (InvalidOffset, lambda: storage.read_view(handle, 5, 6)),  # passes the end
        (InvalidOffset, lambda: storage.read_view(handle, True, 1)),
        (InvalidArgument, lambda: storage.read_view("ok", 0, 1)),  # type: ignore[arg-type]
        (InvalidArgument, lambda: storage.write(handle, 10, "text")),  # type: ignore[arg-type]
        (InvalidArgument, lambda: storage.create("new", max_rolling_length=0)),
        (InvalidArgument, lambda: storage.create("new", max_rolling_length=-5)),
        (InvalidArgument, lambda: storage.read("ok", 0, 1)),  # type: ignore[arg-type]
        (InvalidArgument, lambda: storage.write(storage.open_read("ok"), 10, b"x")),
        (InvalidArgument, lambda: storage.seal(storage.open_read("ok"))),
        (InvalidArgument, lambda: storage.delete(storage.open_read("ok"))),
    ]
    for error, call in cases:
        expect_unchanged(env, error, call)


def test_too_large_write_and_read(env: Env) -> None:
    storage = env.open(write_bytes_max=8, read_bytes_max=8, read_parallel_bytes_min=4)
    storage.create("big")
    handle = storage.open_write("big")
    expect_unchanged(env, InvalidArgument, lambda: storage.write(handle, 0, b"123456789"))
    storage.write(handle, 0, b"12345678")
    storage.write(handle, 8, b"9")
    expect_unchanged(env, InvalidArgument, lambda: storage.read(handle, 0, 9))
    expect_unchanged(env, InvalidArgument, lambda: storage.read_view(handle, 0, 9))


def test_state_errors(populated: tuple[Env, ChunkedSegmentStorage]) -> None:
    env, storage = populated
    sealed = storage.open_write("sealed")
    expect_unchanged(env, SegmentSealed, lambda: storage.write(sealed, 3, b"x"))
    expect_unchanged(env, SegmentExists, lambda: storage.create("ok"))
    for operation in (storage.info, storage.open_read, storage.open_write):
        expect_unchanged(env, SegmentNotFound, lambda op=operation: op("missing"))  # type: ignore[misc]
    ghost = SegmentHandle("missing", read_only=False)
    expect_unchanged(env, SegmentNotFound, lambda: storage.write(ghost, 0, b"x"))
    expect_unchanged(env, SegmentNotFound, lambda: storage.read(ghost, 0, 0))
    expect_unchanged(env, SegmentNotFound, lambda: storage.read_view(ghost, 0, 0))
    expect_unchanged(env, SegmentNotFound, lambda: storage.seal(ghost))
    expect_unchanged(env, SegmentNotFound, lambda: storage.delete(ghost))


def test_deleted_segment_rejects_everything(populated: tuple[Env, ChunkedSegmentStorage]) -> None:
    env, storage = populated
    handle = storage.open_write("ok")
    storage.delete(handle)
    assert not storage.exists("ok")
    expect_unchanged(env, SegmentNotFound, lambda: storage.write(handle, 10, b"x"))
    expect_unchanged(env, SegmentNotFound, lambda: storage.read(handle, 0, 1))
    expect_unchanged(env, SegmentNotFound, lambda: storage.unseal(handle))


def test_operations_after_close(populated: tuple[Env, ChunkedSegmentStorage]) -> None:
    env, storage = populated
    handle = storage.open_write("ok")
    storage.close()
    storage.close()  # idempotent
    for call in (
        lambda: storage.create("x"),
        lambda: storage.exists("ok"),
        lambda: storage.info("ok"),
        lambda: list(storage.list()),
        lambda: storage.open_write("ok"),
        lambda: storage.write(handle, 10, b"x"),
        lambda: storage.read(handle, 0, 1),
        lambda: storage.seal(handle),
        lambda: storage.delete(handle),
    ):
        expect_unchanged(env, StorageClosed, call)


def test_fenced_instance_changes_nothing(populated: tuple[Env, ChunkedSegmentStorage]) -> None:
    env, old = populated
    handle = old.open_write("ok")
    new = env.open()
    assert new.epoch > old.epoch
    for call in (
        lambda: old.write(handle, 10, b"zombie"),
        lambda: old.create("zombie"),
        lambda: old.seal(handle),
        lambda: old.delete(handle),
    ):
        expect_unchanged(env, Fenced, call)
    assert new.read(new.open_read("ok"), 0, 10) == b"0123456789"


def test_epoch_must_be_newer(env: Env) -> None:
    first = env.open()
    with pytest.raises(Fenced):
        env.open(epoch=first.epoch)
    with pytest.raises(InvalidArgument):
        env.open(epoch=0)
    assert env.open(epoch=first.epoch + 5).epoch == first.epoch + 5


def test_list_prefix_validation(populated: tuple[Env, ChunkedSegmentStorage]) -> None:
    env, storage = populated
    expect_unchanged(env, InvalidName, lambda: list(storage.list("a\x00")))
    expect_unchanged(env, InvalidName, lambda: list(storage.list(5)))  # type: ignore[arg-type]
    assert list(storage.list("")) == ["ok", "sealed"]
    assert list(storage.list("o")) == ["ok"]


def test_read_only_instance_observes_without_fencing(populated: tuple[Env, ChunkedSegmentStorage]) -> None:
    env, owner = populated
    observer = ChunkedSegmentStorage(0, None, env.binding, env.store, read_only=True)
    env.instances.append(observer)
    assert observer.epoch == owner.epoch
    handle = owner.open_write("ok")
    owner.write(handle, 10, b"AB")  # the owner is not fenced by the observer
    assert observer.read(observer.open_read("ok"), 0, 12) == b"0123456789AB"  # no stale cache
    assert observer.info("ok").length == 12 and list(observer.list()) == ["ok", "sealed"]
    writable = SegmentHandle("ok", read_only=False)
    for call in (
        lambda: observer.create("new"),
        lambda: observer.open_write("ok"),
        lambda: observer.write(writable, 12, b"x"),
        lambda: observer.seal(writable),
        lambda: observer.unseal(writable),
        lambda: observer.delete(writable),
        lambda: observer.gc.run_once(),
    ):
        expect_unchanged(env, ReadOnlyInstance, call)
    with pytest.raises(InvalidArgument):
        ChunkedSegmentStorage(0, 5, env.binding, env.store, read_only=True)


def test_a_write_needing_too_many_chunks_is_rejected(env: Env) -> None:
    storage = env.open(write_chunks_max=4)
    storage.create("tiny", max_rolling_length=2)
    handle = storage.open_write("tiny")
    expect_unchanged(env, InvalidArgument, lambda: storage.write(handle, 0, b"123456789"))
    storage.write(handle, 0, b"12345678")
    assert storage.info("tiny").length == 8
