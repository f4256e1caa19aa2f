"""Combined small writes (``ChunkedSegmentStorage.write``, ``_combine_appends``): writes of
different segments that each append all their bytes to their segment's last chunk, queued
while a group is in flight, run as one group: their data written and synced together
(``write_together``), then one metadata commit. A write that is the only one in flight
runs alone.

Checked here, with a binding that holds a group in flight until the test lets it go (no
sleeps: the test waits for the queue it can see), and a writer of another segment parked
inside its own write meanwhile (so that no write of the test is alone): the queued writes
form one group; each lands, readable and durable across a restart; a failed append is its
writer's error alone; a conflict on the group's commit sends each write to commit on its
own; a group whose instance was fenced meanwhile fails for every writer of it, and nothing
of it is readable; a lone writer's writes are never combined.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import pytest
from slts.bindings.base import ChunkAppend, ChunkHandle
from slts.bindings.memory import MemoryChunkStorage

from slts.config import StorageConfig
from slts.errors import Fenced, InvalidConfig, StorageUnavailable
from slts.metadata.lmdb_store import LmdbMetadataStore
from slts.metadata.schema import SEGMENTS, TABLES, name_key
from slts.metadata.store import Put
from slts.storage.chunked import COMBINED_WRITE_BYTES_MAX, ChunkedSegmentStorage
from tests.support.engine import Env

SEGMENTS_COUNT = 4


class HoldingBinding(MemoryChunkStorage):
    """The memory binding; ``hold()`` makes its next ``write_together`` wait, once its
    appends are written, for ``release()``, running ``during`` first; ``before_group``,
    if set, runs (once) before the next call's appends; every group's chunk names are
    recorded, and ``fail`` names chunks whose appends fail. With ``parking`` set, the next
    lone write waits in its data I/O for ``unpark()``."""

    def __init__(self) -> None:
        super().__init__()
        self.parking = False  # the next lone write waits in its data I/O for ``unpark``
        self.parked = threading.Event()
        self._unparked = threading.Event()
        self.groups: list[list[str]] = []
        self.fail: set[str] = set()
        self.during: Callable[[], None] = lambda: None
        self.before_group: Callable[[], None] | None = None
        self._held = False
        self.entered = threading.Event()
        self._released = threading.Event()

    def hold(self) -> None:
        self._held = True
        self.entered.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def unpark(self) -> None:
        self._unparked.set()

    def _do_write(self, handle: ChunkHandle, offset: int, data: bytes) -> int:
        if self.parking:
            self.parking = False
            self.parked.set()
            assert self._unparked.wait(30), "the test unparked the writer"
        return super()._do_write(handle, offset, data)

    def _do_write_together(self, appends: Sequence[ChunkAppend]) -> list[int | Exception]:
        if self.before_group is not None:
            run, self.before_group = self.before_group, None
            run()
        self.groups.append([append.handle.name for append in appends])
        results: list[int | Exception] = []
        for append in appends:
            if append.handle.name in self.fail:
                results.append(StorageUnavailable("append failed in this test", chunk=append.handle.name))
            else:
                results += super()._do_write_together([append])
        if self._held:
            self._held = False
            self.during()
            self.entered.set()
            assert self._released.wait(30), "the test released the group"
        return results


def _wait_until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) for ``condition``, a state other threads reach."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "the state was not reached"
        time.sleep(0.001)


@pytest.fixture
def env(tmp_path) -> Env:
    environment = Env(HoldingBinding(), LmdbMetadataStore(str(tmp_path / "metadata"), TABLES))
    yield environment
    for instance in environment.instances:
        instance.close()
    environment.store.close()


def _started(storage: ChunkedSegmentStorage) -> list:
    """``SEGMENTS_COUNT`` segments with one write each (each has a last chunk to append to),
    and the segment ``parked`` with one."""
    handles = []
    for name in [f"s{i}" for i in range(SEGMENTS_COUNT)] + ["parked"]:
        storage.create(name)
        handles.append(storage.open_write(name))
        storage.write(handles[-1], 0, b"first")
    return handles[:SEGMENTS_COUNT]


class _Parked:
    """``with _Parked(env, storage):`` a writer of segment ``parked`` waits inside its
    write (a lone one: its own data I/O) until the block ends, so that no write of the
    block is alone; its error, if any, is ``error``."""

    def __init__(self, env: Env, storage: ChunkedSegmentStorage) -> None:
        self.binding: HoldingBinding = env.binding  # type: ignore[assignment]
        handle = storage.open_write("parked")
        length = storage.info("parked").length
        self.error: BaseException | None = None

        def write() -> None:
            try:
                storage.write(handle, length, b"p")
            except BaseException as error:
                self.error = error

        self.writer = threading.Thread(target=write)

    def __enter__(self) -> None:
        self.binding.parking = True
        self.binding.parked.clear()
        self.writer.start()
        assert self.binding.parked.wait(30), "the parked writer reached its data I/O"

    def __exit__(self, *exc_info: object) -> None:
        self.binding.unpark()
        self.writer.join(30)
        assert not self.writer.is_alive()


def _write_during_a_held_group(
    env: Env,
    storage: ChunkedSegmentStorage,
    handles: list,
    pieces: list[bytes],
    before_next_group: Callable[[], None] | None = None,
) -> list[BaseException | None]:
    """Segment 0's write holds its group in flight until every other segment's write has
    queued behind it (each has read its segment's record); then ``before_next_group``
    is set to run before the next group's appends, and all run. Each writer's outcome:
    None or its error."""
    binding: HoldingBinding = env.binding  # type: ignore[assignment]
    outcomes: list[BaseException | None] = [None] * len(handles)

    def write(i: int) -> None:
        try:
            storage.write(handles[i], 5, pieces[i])
        except BaseException as error:
            outcomes[i] = error

    with _Parked(env, storage):
        binding.hold()
        threads = [threading.Thread(target=write, args=(0,))]
        threads[0].start()
        assert binding.entered.wait(30)
        threads += [threading.Thread(target=write, args=(i,)) for i in range(1, len(handles))]
        for thread in threads[1:]:
            thread.start()
        _wait_until(lambda: len(storage._appends._queue) == len(handles) - 1)
        binding.before_group = before_next_group
        binding.release()
        for thread in threads:
            thread.join()
    return outcomes


def test_writes_queued_behind_a_group_run_as_one_group_and_each_lands(env) -> None:
    storage = env.open()
    handles = _started(storage)
    env.binding.groups.clear()
    pieces = [bytes([65 + i]) * (100 + i) for i in range(SEGMENTS_COUNT)]
    assert _write_during_a_held_group(env, storage, handles, pieces) == [None] * SEGMENTS_COUNT
    assert [len(group) for group in env.binding.groups] == [1, SEGMENTS_COUNT - 1]
    for reopen in (False, True):
        reader = env.reopen() if reopen else storage
        for i, piece in enumerate(pieces):
            handle = reader.open_read(f"s{i}")
            assert reader.info(f"s{i}").length == 5 + len(piece)
            assert reader.read(handle, 0, 5 + len(piece)) == b"first" + piece


def test_a_failed_append_is_its_writers_error_alone(env) -> None:
    storage = env.open()
    handles = _started(storage)
    failing = storage._store.get(SEGMENTS, name_key("s2"))
    env.binding.fail = {storage.context.load("s2")[0].last_chunk}
    assert failing is not None
    pieces = [b"x" * 10] * SEGMENTS_COUNT
    outcomes = _write_during_a_held_group(env, storage, handles, pieces)
    assert isinstance(outcomes[2], StorageUnavailable)
    assert [outcomes[i] for i in (0, 1, 3)] == [None, None, None]
    assert storage.info("s2").length == 5
    assert [storage.info(f"s{i}").length for i in (0, 1, 3)] == [15, 15, 15]
    env.binding.fail = set()
    storage.write(handles[2], 5, b"again")  # to a new chunk: the failed one is not appended to
    assert storage.read(storage.open_read("s2"), 0, 10) == b"firstagain"


def test_a_conflict_on_the_group_commit_sends_each_write_to_commit_alone(env) -> None:
    """Segment 1's record changes (its version, not its end) after its writer read it and
    before its group's data is written: the group's one commit conflicts, and each write
    commits on its own (segment 1's re-based over the change)."""
    storage = env.open()
    handles = _started(storage)
    retries = storage.statistics().commit_retries

    def change_segment_1() -> None:
        stored = env.store.get(SEGMENTS, name_key("s1"))
        env.store.commit([Put(SEGMENTS, name_key("s1"), stored.value)])

    pieces = [bytes([97 + i]) * 7 for i in range(SEGMENTS_COUNT)]
    outcomes = _write_during_a_held_group(env, storage, handles, pieces, change_segment_1)
    assert outcomes == [None] * SEGMENTS_COUNT
    assert [len(group) for group in env.binding.groups[-2:]] == [1, SEGMENTS_COUNT - 1]
    assert storage.statistics().commit_retries > retries
    for i, piece in enumerate(pieces):
        assert storage.read(storage.open_read(f"s{i}"), 0, 12) == b"first" + piece


def test_a_group_fenced_meanwhile_fails_for_every_writer_and_nothing_of_it_is_readable(env) -> None:
    storage = env.open()
    handles = _started(storage)
    successor: list[ChunkedSegmentStorage] = []
    env.binding.during = lambda: successor.append(env.open())
    outcomes = _write_during_a_held_group(env, storage, handles, [b"late"] * SEGMENTS_COUNT)
    assert all(isinstance(outcome, Fenced) for outcome in outcomes), outcomes
    for i in range(SEGMENTS_COUNT):
        assert successor[0].info(f"s{i}").length == 5
        assert successor[0].read(successor[0].open_read(f"s{i}"), 0, 5) == b"first"


def test_only_small_appends_beside_other_writes_are_combined(env) -> None:
    """Beside another write in flight, a write of ``COMBINED_WRITE_BYTES_MAX`` bytes into
    the last chunk is combined (a group of its own here); one byte more goes alone (bound
    by bandwidth: its checksums beside its I/O); so does a write that needs a new chunk.
    A lone writer's writes are never combined."""
    storage = env.open()
    storage.create("s", max_rolling_length=1 << 20)
    storage.create("parked")
    storage.write(storage.open_write("parked"), 0, b"first")
    handle = storage.open_write("s")
    small, large = b"a" * COMBINED_WRITE_BYTES_MAX, b"b" * (COMBINED_WRITE_BYTES_MAX + 1)
    with _Parked(env, storage):
        storage.write(handle, 0, b"first")  # creates the chunk: alone
        assert env.binding.groups == []
        storage.write(handle, 5, small)
        assert len(env.binding.groups) == 1
        storage.write(handle, 5 + len(small), large)
        assert len(env.binding.groups) == 1
    storage.write(handle, 5 + len(small) + len(large), b"c")  # the only write in flight
    assert len(env.binding.groups) == 1
    length = 5 + len(small) + len(large) + 1
    assert storage.read(storage.open_read("s"), 0, length) == b"first" + small + large + b"c"


def test_always_combines_a_lone_write_too(env) -> None:
    """``combined_writes = "always"``: a lone writer's small append is a group of one."""
    storage = env.open(combined_writes="always")
    handles = _started(storage)
    storage.write(handles[0], 5, b"lone")
    assert env.binding.groups == [[storage.chunks("s0")[-1][1].name]]
    assert storage.read(storage.open_read("s0"), 0, 9) == b"firstlone"


def test_off_combines_nothing_even_beside_another_write(env) -> None:
    """``combined_writes = "off"``: no write is combined, not even beside another in flight."""
    storage = env.open(combined_writes="off")
    handles = _started(storage)
    storage.write(handles[0], 5, b"lone")
    with _Parked(env, storage):
        storage.write(handles[1], 5, b"beside")
    assert env.binding.groups == []
    assert storage.read(storage.open_read("s0"), 0, 9) == b"firstlone"
    assert storage.read(storage.open_read("s1"), 0, 11) == b"firstbeside"


@pytest.mark.parametrize("bad", ["sometimes", "", "AUTO", 1, None])
def test_a_bad_setting_is_refused_naming_the_values(bad: object) -> None:
    with pytest.raises(InvalidConfig, match="combined_writes must be"):
        StorageConfig(combined_writes=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 100_001, 1.5, True, "300"])
def test_a_bad_linger_is_refused_naming_the_setting(bad: object) -> None:
    with pytest.raises(InvalidConfig, match="combined_writes_linger_us must be"):
        StorageConfig(combined_writes_linger_us=bad)  # type: ignore[arg-type]


def test_a_linger_of_zero_or_the_maximum_is_taken() -> None:
    assert StorageConfig(combined_writes_linger_us=0).combined_writes_linger_us == 0
    assert StorageConfig(combined_writes_linger_us=100_000).combined_writes_linger_us == 100_000
