"""Zombies: an instance whose epoch was superseded changes nothing (DESIGN.md §5 invariant 4).

Two instances on one binding + metadata store: ``old`` (epoch e) opens its segments,
then ``new`` (epoch e+1) starts. Afterwards every change ``old`` attempts raises
``Fenced`` and leaves the metadata untouched; no byte ``old`` writes after the takeover
is ever readable through ``new`` (each such write carries ``MARKER``); chunks ``old``
managed to put on the chunk storage are covered by the GC queue and collected by
``new`` once ``gc_delay_s`` has passed (invariants 5, 6). A write of ``old`` that is in
flight when ``new`` takes over (its chunk bytes land after the takeover) is simulated
with a binding hook (``FaultyChunkStorage.before``) that starts ``new`` right before
``old``'s chunk call, and by appending to ``old``'s last chunk through the raw binding.

The last two tests are regressions: ``open_write`` by the old instance of a segment the
new one owns, and reads by the old instance after the new one truncated and collected,
raise typed errors (``Fenced``), not ``AssertionError``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from slts.bindings.base import ChunkHandle, ChunkStorage
from slts.bindings.faulty import FaultyChunkStorage

from slts.admin.verify import verify_container, verify_segment
from slts.config import StorageConfig
from slts.errors import Fenced, SegmentTruncated
from slts.metadata.schema import GC
from slts.storage.chunked import ChunkedSegmentStorage
from tests.support.engine import Env, segment_chunks

MARKER = b"<<ZOMBIE-BYTES>>"
GC_DELAY_S = 10.0


def instance(env: Env, binding: ChunkStorage | None = None, **config: object) -> ChunkedSegmentStorage:
    settings = StorageConfig(**{"gc_delay_s": GC_DELAY_S, "defrag_small_chunk_bytes": 64, **config})  # type: ignore[arg-type]
    storage = ChunkedSegmentStorage(0, None, binding or env.binding, env.store, settings, clock=env.clock)
    env.instances.append(storage)
    return storage


def contents(storage: ChunkedSegmentStorage) -> dict[str, tuple[int, int, bytes]]:
    """Every live segment: (start, length, readable bytes), as ``storage`` sees it."""
    result = {}
    for name in storage.list():
        info = storage.info(name)
        data = storage.read(storage.open_read(name), info.start_offset, info.length - info.start_offset)
        result[name] = (info.start_offset, info.length, data)
    return result


def assert_no_marker(storage: ChunkedSegmentStorage) -> None:
    for name, (_, _, data) in contents(storage).items():
        assert MARKER not in data, f"bytes the zombie wrote are readable in {name!r}"
        assert verify_segment(storage, name) == []


def collect_all(storage: ChunkedSegmentStorage) -> None:
    for _ in range(200):
        stats = storage.gc.run_once()
        if not (stats.chunks_deleted or stats.entries_kept or stats.tombstones_finished):
            return
    raise AssertionError("GC did not converge")


def referenced(storage: ChunkedSegmentStorage) -> set[str]:
    return {chunk.name for name in storage.list() for _, chunk in storage.chunks(name)}


def populate(old: ChunkedSegmentStorage) -> dict[str, bytes]:
    """Segments of every kind a zombie could touch; returns their content."""
    expected = {}
    old.create("z/main", max_rolling_length=64)
    main = old.open_write("z/main")
    old.write(main, 0, b"main-0123456789")
    expected["z/main"] = b"main-0123456789"
    old.create("z/source", max_rolling_length=64)
    source = old.open_write("z/source")
    old.write(source, 0, b"source-bytes")
    old.seal(source)
    expected["z/source"] = b"source-bytes"
    old.create("z/frag", max_rolling_length=64)  # small chunks spliced in: something to defrag
    frag = old.open_write("z/frag")
    for i in range(4):
        old.create(f"z/piece{i}")
        piece = old.open_write(f"z/piece{i}")
        old.write(piece, 0, b"f%03d" % i)
        old.seal(piece)
        old.concat(frag, i * 4, f"z/piece{i}")
    expected["z/frag"] = b"f000f001f002f003"
    assert old.info("z/frag").chunk_count == 4
    old.create("z/doomed")
    doomed = old.open_write("z/doomed")
    old.write(doomed, 0, b"x" * 10)
    old.delete(doomed)  # a tombstone and a queued chunk: GC work for the zombie to try
    return expected


@pytest.mark.parametrize("takeover", [False, True], ids=["container-only", "segments-taken-over"])
def test_every_change_by_the_old_epoch_raises_fenced(env: Env, takeover: bool) -> None:
    old = instance(env, concat_merge_seam=False)
    expected = populate(old)
    handles = {name: old.open_write(name) for name in expected}
    old.create("z/late")  # opened before the takeover, written never
    handles["z/late"] = old.open_write("z/late")
    expected["z/late"] = b""
    env.clock.advance(GC_DELAY_S + 1)  # the deleted segment's chunks are due

    new = instance(env)
    assert new.epoch > old.epoch
    if takeover:
        for name in expected:
            new.open_write(name)
    metadata_before = env.store.dump()
    chunks_before = segment_chunks(env.binding)

    attempts: list[tuple[str, Callable[[], object]]] = [
        ("write", lambda: old.write(handles["z/main"], len(expected["z/main"]), MARKER)),
        ("write to an empty segment", lambda: old.write(handles["z/late"], 0, MARKER * 8)),
        ("create", lambda: old.create("z/fresh")),
        ("seal", lambda: old.seal(handles["z/main"])),
        ("unseal", lambda: old.unseal(handles["z/source"])),
        ("concat", lambda: old.concat(handles["z/main"], len(expected["z/main"]), "z/source")),
        ("truncate", lambda: old.truncate(handles["z/main"], 5)),
        ("defrag", lambda: old.defrag("z/frag")),
        ("delete", lambda: old.delete(handles["z/frag"])),
        ("gc", lambda: old.gc.run_once()),
        ("write again", lambda: old.write(handles["z/main"], len(expected["z/main"]), MARKER)),
    ]
    for what, attempt in attempts:
        with pytest.raises(Fenced):
            attempt()
        assert env.store.dump() == metadata_before, f"the zombie's {what} changed metadata"
        assert segment_chunks(env.binding) == chunks_before, f"the zombie's {what} added or removed a chunk"

    # Through the new instance: the pre-takeover state exactly, no zombie byte anywhere.
    seen = contents(new)
    assert {name: data for name, (_, _, data) in seen.items()} == expected
    assert_no_marker(new)
    assert verify_container(new).problems == []

    # The new owner carries on: its next write goes to a chunk of its own epoch.
    main = new.open_write("z/main")
    count = new.info("z/main").chunk_count
    new.write(main, len(expected["z/main"]), b"+new")
    assert new.info("z/main").chunk_count == count + 1, "the new owner appended to the zombie's chunk"
    assert new.chunks("z/main")[-1][1].epoch == new.epoch
    assert new.read(main, 0, len(expected["z/main"]) + 4) == expected["z/main"] + b"+new"
    new.concat(main, len(expected["z/main"]) + 4, "z/source")
    assert new.read(main, 0, new.info("z/main").length) == expected["z/main"] + b"+new" + expected["z/source"]

    # GC by the new owner collects what the old one deleted (and the seam merge dropped).
    env.clock.advance(GC_DELAY_S + 1)
    collect_all(new)
    assert set(segment_chunks(env.binding)) == referenced(new)
    assert_no_marker(new)


@pytest.mark.parametrize("operation", ["write", "defrag"])
def test_zombie_chunk_that_lands_after_the_takeover_is_collected(env: Env, operation: str) -> None:
    """The old instance registered its GC intent and is creating a chunk (for a write, or
    for a defrag run) when the new one starts: the chunk lands, the commit is fenced, its
    bytes never show, and the new instance's GC deletes it once the delay has passed
    (not before)."""
    hooked = FaultyChunkStorage(env.binding)  # no faults: its hook only
    old = instance(env, hooked, concat_merge_seam=False)
    old.create("w", max_rolling_length=8 if operation == "write" else 64)
    handle = old.open_write("w")
    if operation == "write":
        old.write(handle, 0, b"12345678")  # a full chunk: the next write needs a new one
    else:
        for i in range(4):  # small chunks spliced in by concat: a defrag run of four
            old.create(f"w{i}")
            piece = old.open_write(f"w{i}")
            old.write(piece, 0, b"%d-%d" % (i, i))
            old.seal(piece)
            old.concat(handle, i * 3, f"w{i}")
        old.seal(handle)
    committed = old.read(handle, 0, old.info("w").length)
    started: list[ChunkedSegmentStorage] = []

    def take_over() -> None:
        if not started:
            started.append(instance(env))
            started[0].open_write("w")

    hooked.before(("create", "concat"), take_over)  # defrag: native concat or copy
    with pytest.raises(Fenced):
        if operation == "write":
            old.write(handle, 8, MARKER[:8])
        else:
            old.defrag("w")
    new = started[0]
    assert new.info("w").length == len(committed)
    assert new.read(new.open_read("w"), 0, len(committed)) == committed
    orphans = set(segment_chunks(env.binding)) - referenced(new)
    assert len(orphans) == 1, "the zombie's chunk should have landed on the chunk storage"
    (orphan,) = orphans
    landed = env.binding.read(env.binding.open_read(orphan), 0, 1 << 20)
    assert landed == (MARKER[:8] if operation == "write" else committed)
    assert any(orphan.encode() in key for key in env.store.dump()[GC]), (
        "a zombie chunk not covered by a GC intent"
    )
    assert verify_container(new).problems == []
    assert_no_marker(new)

    collect_all(new)  # not due yet: nothing may go
    assert env.binding.exists(orphan), "GC deleted a chunk before gc_delay_s"
    env.clock.advance(GC_DELAY_S + 1)
    collect_all(new)
    assert not env.binding.exists(orphan), "the zombie's chunk was not collected"
    assert set(segment_chunks(env.binding)) == referenced(new)
    assert env.store.dump()[GC] == {}

    new_handle = new.open_write("w")
    new.unseal(new_handle)
    new.write(new_handle, len(committed), b"after")
    assert new.read(new_handle, 0, len(committed) + 5) == committed + b"after"
    assert_no_marker(new)


def test_zombie_append_in_flight_during_takeover(env: Env) -> None:
    """The old instance appends to its own last chunk; the new one starts just before the
    bytes land. The commit is fenced; the segment's length stays the committed one and the
    new owner's next write goes to a new chunk."""
    if not env.binding.supports_append:
        pytest.skip("binding has no append: a zombie cannot extend an existing chunk")
    hooked = FaultyChunkStorage(env.binding)  # no faults: its hook only
    old = instance(env, hooked)
    old.create("a", max_rolling_length=1000)
    handle = old.open_write("a")
    old.write(handle, 0, b"committed|")
    started: list[ChunkedSegmentStorage] = []
    hooked.before("write", lambda: started.append(instance(env)))
    with pytest.raises(Fenced):
        old.write(handle, 10, MARKER)
    new = started[0]
    (last,) = [chunk.name for _, chunk in new.chunks("a")]
    assert env.binding.get_info(last).length == 10 + len(MARKER), "the in-flight append should have landed"
    assert_new_owner_ignores_bytes_past_the_committed_length(env, new, "a", b"committed|", last)


@pytest.mark.parametrize("restart_between", [False, True])
def test_raw_zombie_append_after_takeover(env: Env, restart_between: bool) -> None:
    """After the takeover the zombie extends its last chunk through the raw binding (a
    write that was in flight): lengths come from metadata only, never from the chunk."""
    if not env.binding.supports_append:
        pytest.skip("binding has no append: a zombie cannot extend an existing chunk")
    old = instance(env)
    old.create("r", max_rolling_length=1000)
    handle = old.open_write("r")
    old.write(handle, 0, b"abc")
    old.write(handle, 3, b"defg")
    new = instance(env)
    new.open_write("r")
    (last,) = [chunk.name for _, chunk in new.chunks("r")]
    env.binding.write(ChunkHandle(last, readonly=False), env.binding.get_info(last).length, MARKER)
    if restart_between:
        new = instance(env)  # one more failover: still the metadata length
    assert_new_owner_ignores_bytes_past_the_committed_length(env, new, "r", b"abcdefg", last)


def assert_new_owner_ignores_bytes_past_the_committed_length(
    env: Env, new: ChunkedSegmentStorage, name: str, committed: bytes, zombie_chunk: str
) -> None:
    handle = new.open_write(name)
    info = new.info(name)
    assert (info.length, info.chunk_count) == (len(committed), 1), "a length was taken from the chunk storage"
    assert new.read(handle, 0, len(committed)) == committed
    assert verify_segment(new, name) == []
    new.write(handle, len(committed), b"-NEXT-")
    chunks = new.chunks(name)
    assert len(chunks) == 2 and chunks[0][1].name == zombie_chunk, (
        "the new owner's write must start a new chunk, never append after the zombie's bytes"
    )
    assert chunks[1][1].epoch == new.epoch
    expected = committed + b"-NEXT-"
    assert new.info(name).length == len(expected)
    assert new.read(handle, 0, len(expected)) == expected
    # A defrag (native concat or copy) uses recorded lengths only: no zombie byte moves in.
    new.seal(handle)
    result = new.defrag(name)
    assert result.chunks_after == 1, result
    assert new.read(handle, 0, len(expected)) == expected
    merged = new.chunks(name)[0][1].name
    assert env.binding.read(env.binding.open_read(merged), 0, 1 << 20) == expected
    assert_no_marker(new)
    assert verify_container(new).problems == []
    env.clock.advance(GC_DELAY_S + 1)
    collect_all(new)
    assert not env.binding.exists(zombie_chunk), "the chunk holding the zombie's bytes was not collected"
    assert set(segment_chunks(env.binding)) == referenced(new)


def test_open_write_by_the_old_epoch_of_a_segment_the_new_one_owns_raises_fenced(env: Env) -> None:
    old = instance(env)
    new = instance(env)
    new.create("mine")  # owner_epoch = new.epoch; the old instance never cached it
    with pytest.raises(Fenced):
        old.open_write("mine")


def test_read_by_the_old_epoch_after_the_new_one_truncated_and_collected_is_a_typed_error(
    env: Env,
) -> None:
    old = instance(env)
    old.create("t", max_rolling_length=4)
    handle = old.open_write("t")
    old.write(handle, 0, b"0123456789ab")
    assert old.read(handle, 0, 12) == b"0123456789ab"  # cached by the old instance
    new = instance(env)
    new.truncate(new.open_write("t"), 8)
    env.clock.advance(GC_DELAY_S + 1)
    collect_all(new)
    # The old instance's cache follows commits it did not make, so it sees the new
    # owner's truncation: a typed error about the segment, never a read of deleted chunks.
    with pytest.raises(SegmentTruncated):
        old.read(handle, 0, 4)
