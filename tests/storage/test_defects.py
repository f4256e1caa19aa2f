"""Regression tests for user-reachable defects of the engine (issue 12), one per defect.

Each test fails on the code before its fix: a concat whose seam merge failed reported an
error after it had taken effect; 65 nested concats made a segment's tail unreadable;
a fenced instance reported success for changes that would be no-ops; C1 control
characters passed the name check; a released memoryview raised ``ValueError``.
"""

from __future__ import annotations

import pytest

from slts.admin.verify import verify_container
from slts.errors import ConcatTooDeep, Fenced, InvalidArgument, InvalidName, MetadataError
from slts.metadata import index
from slts.metadata.schema import SEGMENTS, name_key
from slts.metadata.store import Expect, Operation, Put
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env


def sealed(storage: ChunkedSegmentStorage, name: str, data: bytes) -> None:
    storage.create(name)
    handle = storage.open_write(name)
    storage.write(handle, 0, data)
    storage.seal(handle)


@pytest.mark.parametrize(
    "failure", [MetadataError("injected"), Fenced("injected")], ids=["metadata", "fenced"]
)
def test_concat_that_committed_succeeds_even_if_the_seam_merge_fails(
    env: Env, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    storage = env.open(concat_merge_seam=True)
    storage.create("target")
    storage.write(storage.open_write("target"), 0, b"ab")
    sealed(storage, "source", b"cd")
    commit = storage._ownership.commit
    calls: list[int] = []

    def failing_after_the_concat(ops: list[Operation], expect: list[Expect] = ()) -> int:
        calls.append(len(ops))
        if len(calls) > 1:  # the concat's own commit is the first; the seam merge's follow
            raise failure
        return commit(ops, expect)

    monkeypatch.setattr(storage._ownership, "commit", failing_after_the_concat)
    storage.concat(storage.open_write("target"), 2, "source")  # must not raise: it took effect
    monkeypatch.undo()
    assert len(calls) > 1, "the seam merge did not run: the test proves nothing"
    assert not storage.exists("source")
    assert storage.read(storage.open_read("target"), 0, 4) == b"abcd"
    assert verify_container(storage).problems == []


def test_concat_refuses_to_nest_links_past_the_index_limit(env: Env) -> None:
    """A chain of concat targets: each level adds one link a lookup follows."""
    storage = env.open(concat_merge_seam=False)
    sealed(storage, "level0", b"x")
    for level in range(1, index.LINK_DEPTH_MAX + 1):
        storage.create(f"level{level}")
        handle = storage.open_write(f"level{level}")
        storage.concat(handle, 0, f"level{level - 1}")
        storage.seal(handle)
    deepest = f"level{index.LINK_DEPTH_MAX}"
    assert storage.read(storage.open_read(deepest), 0, 1) == b"x"
    storage.create("top")
    before = env.store.dump()
    with pytest.raises(ConcatTooDeep, match="limit of 64"):
        storage.concat(storage.open_write("top"), 0, deepest)
    assert env.store.dump() == before  # nothing changed
    assert storage.read(storage.open_read(deepest), 0, 1) == b"x"


def test_depth_of_a_record_written_before_it_was_kept_is_read_from_the_index(env: Env) -> None:
    storage = env.open(concat_merge_seam=False)
    sealed(storage, "t", b"x")
    storage.create("b")
    storage.concat(storage.open_write("b"), 0, "t")
    storage.seal(storage.open_write("b"))
    record, version = storage.context.load("b")
    assert record.index_depth == 1
    legacy = record.replace(index_depth=None)
    storage._ownership.commit(
        [Put(SEGMENTS, name_key("b"), legacy.encode())],
        [Expect(SEGMENTS, name_key("b"), version)],
    )
    storage.create("a")
    storage.concat(storage.open_write("a"), 0, "b")
    assert storage.context.load("a")[0].index_depth == 2


@pytest.mark.parametrize("operation", ["truncate", "seal", "unseal", "defrag", "write"])
def test_fenced_instance_never_reports_success_for_a_no_op(env: Env, operation: str) -> None:
    old = env.open()
    old.create("s")
    handle = old.open_write("s")
    old.write(handle, 0, b"abc")
    if operation == "unseal":
        pass  # unseal of an unsealed segment
    elif operation == "seal":
        old.seal(handle)
    env.open()  # a newer epoch takes the container over
    no_op = {
        "truncate": lambda: old.truncate(handle, 0),
        "seal": lambda: old.seal(handle),
        "unseal": lambda: old.unseal(handle),
        "defrag": lambda: old.defrag("s"),
        "write": lambda: old.write(handle, 3, b""),
    }[operation]
    with pytest.raises(Fenced):
        no_op()


@pytest.mark.parametrize("char", ["\x80", "\x9b", "\x9f", "\x85"])
def test_c1_control_characters_are_not_allowed_in_names(env: Env, char: str) -> None:
    storage = env.open()
    with pytest.raises(InvalidName, match="control character"):
        storage.create(f"a{char}b")
    assert list(storage.list()) == []


def test_write_of_a_released_memoryview_is_a_typed_error(env: Env) -> None:
    storage = env.open()
    storage.create("s")
    view = memoryview(b"abc")
    view.release()
    with pytest.raises(InvalidArgument, match="released"):
        storage.write(storage.open_write("s"), 0, view)
    assert storage.info("s").length == 0


def test_read_only_read_of_a_missing_chunk_is_chunk_not_found(env: Env) -> None:
    """The read's retry path dropped the cache of a store that has none (AttributeError)."""
    from slts.bindings.base import ChunkHandle

    from slts.errors import ChunkNotFound

    storage = env.open()
    storage.create("s")
    storage.write(storage.open_write("s"), 0, b"abc")
    (chunk,) = [record.name for _, record in storage.chunks("s")]
    env.binding.delete(ChunkHandle(chunk, readonly=False))
    observer = ChunkedSegmentStorage(0, None, env.binding, env.store, storage.config, read_only=True)
    try:
        with pytest.raises(ChunkNotFound):
            observer.read(observer.open_read("s"), 0, 3)
    finally:
        observer.close()
