"""The filesystem binding's kept append descriptors (bindings/filesystem.py, module doc).

Invariants checked here: a chunk's next append reuses the descriptor its last append
opened (no path walk, no open); through a kept descriptor an append still sees
everything an append by path would: another writer's bytes (the length check), a
chunk made read-only, a chunk deleted by another process (``ChunkNotFound``, nothing
written anywhere; or, created again, the new file); a delete in this process and
``close`` close the kept descriptors; at most ``APPENDERS_MAX`` are open; a failed
append keeps none.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from slts.bindings.base import ChunkAppend, ChunkHandle
from slts.bindings.filesystem import APPENDER_IDLE_S, APPENDERS_MAX, FileSystemChunkStorage

from slts.errors import ChunkExists, ChunkInvalidOffset, ChunkNotFound, ChunkReadOnly, ChunkStorageError
from tests.support.conformance import remove_tree


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[FileSystemChunkStorage]:
    storage = FileSystemChunkStorage(str(tmp_path / "root"))
    yield storage
    storage.close()


def _open_below(root: str) -> list[str]:
    """The files below ``root`` this process has a descriptor of (from /proc)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target.startswith(root + os.sep):
            found.append(target)
    return found


def _count_opens(monkeypatch: pytest.MonkeyPatch, root: str) -> list[str]:
    """Record every ``os.open`` of a path below ``root`` from now on."""
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if os.fspath(path).startswith(root):
            opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    return opened


def test_appends_reuse_the_descriptor_the_first_one_opened(fs, monkeypatch) -> None:
    handle = fs.create("s/c", b"")
    opened = _count_opens(monkeypatch, fs.root)
    for i in range(5):
        fs.write(handle, i * 4, b"abcd")
    assert len(opened) == 1, opened
    assert fs.read(fs.open_read("s/c"), 0, 100) == b"abcd" * 5
    assert len(_open_below(fs.root)) == 1


def test_another_writers_bytes_are_seen_through_a_kept_descriptor(fs, tmp_path) -> None:
    """Two bindings on one root stand for two processes (``flock`` is per open file)."""
    other = FileSystemChunkStorage(fs.root)
    try:
        handle = fs.create("c", b"")
        fs.write(handle, 0, b"one")  # kept
        other.write(ChunkHandle("c", readonly=False), 3, b"two")
        with pytest.raises(ChunkInvalidOffset, match="its length is 6"):
            fs.write(handle, 3, b"xxx")
        fs.write(handle, 6, b"six")
    finally:
        other.close()
    assert fs.read(fs.open_read("c"), 0, 100) == b"onetwosix"


def test_a_chunk_deleted_by_another_process_is_not_found_and_nothing_is_written(fs) -> None:
    handle = fs.create("c", b"")
    fs.write(handle, 0, b"head")
    path = fs._path("c")
    os.unlink(path)  # as another process's delete: this binding is not told
    with pytest.raises(ChunkNotFound):
        fs.write(handle, 4, b"tail")
    assert _open_below(fs.root) == [], "the descriptor of the deleted file is closed"
    assert not os.path.exists(path)
    with pytest.raises(ChunkNotFound):
        fs.write(handle, 4, b"tail")


def test_a_chunk_deleted_and_created_again_elsewhere_is_appended_to_as_by_path(fs) -> None:
    """The kept descriptor of a chunk another process deleted is dropped; the append goes
    to the file that now has the name, as an append by path would."""
    other = FileSystemChunkStorage(fs.root)
    try:
        handle = fs.create("c", b"")
        fs.write(handle, 0, b"old")  # kept
        os.unlink(fs._path("c"))
        other.create("c", b"new")
        fs.write(handle, 3, b"+")
    finally:
        other.close()
    assert fs.read(fs.open_read("c"), 0, 100) == b"new+"
    assert len(_open_below(fs.root)) == 1, "only the new file's descriptor is kept"


def test_a_delete_closes_the_kept_descriptor(fs) -> None:
    handle = fs.create("c", b"")
    fs.write(handle, 0, b"data")
    assert len(_open_below(fs.root)) == 1
    fs.delete(handle)
    assert _open_below(fs.root) == [], "the deleted file's space is not held open"
    with pytest.raises(ChunkNotFound):
        fs.write(handle, 4, b"more")


def test_a_chunk_made_read_only_refuses_appends_through_a_kept_descriptor(fs) -> None:
    handle = fs.create("c", b"")
    fs.write(handle, 0, b"data")
    fs.set_readonly(handle, True)
    with pytest.raises(ChunkReadOnly):
        fs.write(handle, 4, b"more")
    fs.set_readonly(handle, False)
    fs.write(handle, 4, b"more")
    assert fs.read(fs.open_read("c"), 0, 100) == b"datamore"


def test_a_truncate_between_appends_is_seen(fs) -> None:
    handle = fs.create("c", b"")
    fs.write(handle, 0, b"01234567")
    fs.truncate(handle, 4)
    with pytest.raises(ChunkInvalidOffset):
        fs.write(handle, 8, b"x")
    fs.write(handle, 4, b"abcd")
    assert fs.read(fs.open_read("c"), 0, 100) == b"0123abcd"


def test_at_most_appenders_max_descriptors_stay_open_and_close_releases_them(fs) -> None:
    count = APPENDERS_MAX + 5
    for i in range(count):
        fs.write(fs.create(f"c{i}", b""), 0, b"x")
    kept = _open_below(fs.root)
    assert len(kept) == APPENDERS_MAX
    assert fs._path("c0") not in kept, "the least recently appended go first"
    assert fs._path(f"c{count - 1}") in kept
    for i in range(count):  # an evicted chunk is opened again
        fs.write(ChunkHandle(f"c{i}", readonly=False), 1, b"y")
        assert fs.read(fs.open_read(f"c{i}"), 0, 10) == b"xy"
    fs.close()
    assert _open_below(fs.root) == []
    fs.close()  # idempotent
    fs.write(ChunkHandle("c0", readonly=False), 2, b"z")  # usable again: opens by path
    assert fs.read(fs.open_read("c0"), 0, 10) == b"xyz"


def test_a_failed_append_keeps_no_descriptor(fs, monkeypatch) -> None:
    handle = fs.create("c", b"")
    fs.write(handle, 0, b"head")

    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdatasync", no_space)
    with pytest.raises(ChunkStorageError):
        fs.write(handle, 4, b"tail")
    assert _open_below(fs.root) == []
    monkeypatch.undo()
    assert fs.read(fs.open_read("c"), 0, 100) == b"head"
    fs.write(handle, 4, b"tail")
    assert fs.read(fs.open_read("c"), 0, 100) == b"headtail"


def test_a_descriptor_idle_past_its_limit_is_closed_at_the_next_append(fs) -> None:
    """None is kept longer than ``APPENDER_IDLE_S`` after its last append: the next
    append to any chunk closes it (a file deleted elsewhere is not held for long)."""
    now = [1000.0]
    fs._appenders._clock = lambda: now[0]
    first = fs.create("first", b"")
    fs.write(first, 0, b"1")
    os.unlink(fs._path("first"))  # deleted elsewhere: its descriptor now holds the space
    now[0] += APPENDER_IDLE_S / 2
    fs.write(fs.create("second", b""), 0, b"2")
    assert len(_open_below(fs.root)) == 2, "not idle long enough yet"
    now[0] += APPENDER_IDLE_S
    fs.write(ChunkHandle("second", readonly=False), 1, b"2")
    assert _open_below(fs.root) == [fs._path("second")], "the idle one is closed"


# -- random programs against a model ------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "s/c"])
BINDINGS = st.sampled_from([0, 1])  # two bindings on one root stand for two processes
DATA = st.binary(min_size=1, max_size=64)


class AppendersMachine(RuleBasedStateMachine):
    """Two bindings on one root and deletes from outside both, against a model of the
    chunks' bytes and read-only flags. After every step: every chunk reads back exactly,
    and the descriptors open are exactly those the bindings keep (a binding's own
    deletes, failed appends and closes leave none behind)."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="slts-appenders-")
        root = os.path.join(self.folder, "root")
        self.bindings = [FileSystemChunkStorage(root), FileSystemChunkStorage(root)]
        self.root = self.bindings[0].root
        self.chunks: dict[str, bytearray] = {}
        self.read_only: set[str] = set()
        self.kept: tuple[set[str], set[str]] = (set(), set())  # names whose descriptor each keeps

    def teardown(self) -> None:
        for binding in self.bindings:
            binding.close()
        assert _open_below(self.root) == []
        remove_tree(self.folder)

    @rule(which=BINDINGS, name=NAMES, data=DATA)
    def create(self, which: int, name: str, data: bytes) -> None:
        if name in self.chunks:
            with pytest.raises(ChunkExists):
                self.bindings[which].create(name, data)
            return
        self.bindings[which].create(name, data)
        self.chunks[name] = bytearray(data)

    @rule(which=BINDINGS, name=NAMES, data=DATA, wrong=st.booleans())
    def append(self, which: int, name: str, data: bytes, wrong: bool) -> None:
        stored = self.chunks.get(name)
        offset = (len(stored) if stored is not None else 0) + (1 if wrong else 0)
        expected: type[Exception] | None = None
        if stored is None:
            expected = ChunkNotFound
        elif name in self.read_only:
            expected = ChunkReadOnly
        elif wrong:
            expected = ChunkInvalidOffset
        handle = ChunkHandle(name, readonly=False)
        if expected is not None:
            with pytest.raises(expected):
                self.bindings[which].write(handle, offset, data)
            self.kept[which].discard(name)  # a failed append closes its descriptor
            return
        self.bindings[which].write(handle, offset, data)
        assert stored is not None
        stored += data
        self.kept[which].add(name)

    @rule(which=BINDINGS, name=NAMES)
    def delete(self, which: int, name: str) -> None:
        handle = ChunkHandle(name, readonly=False)
        if name not in self.chunks:
            with pytest.raises(ChunkNotFound):
                self.bindings[which].delete(handle)
            return
        self.bindings[which].delete(handle)
        del self.chunks[name]
        self.read_only.discard(name)
        self.kept[which].discard(name)  # the other binding's descriptor stays

    @rule(name=NAMES)
    def delete_outside(self, name: str) -> None:
        if name in self.chunks:
            os.unlink(self.bindings[0]._path(name))
            del self.chunks[name]
            self.read_only.discard(name)

    @rule(which=BINDINGS, name=NAMES, cut=st.integers(0, 8))
    def truncate(self, which: int, name: str, cut: int) -> None:
        stored = self.chunks.get(name)
        if stored is None or name in self.read_only:
            with pytest.raises(ChunkNotFound if stored is None else ChunkReadOnly):
                self.bindings[which].truncate(ChunkHandle(name, readonly=False), 0)
            return
        length = max(0, len(stored) - cut)
        self.bindings[which].truncate(ChunkHandle(name, readonly=False), length)
        del stored[length:]

    @rule(which=BINDINGS, name=NAMES, flag=st.booleans())
    def set_read_only(self, which: int, name: str, flag: bool) -> None:
        if name not in self.chunks:
            with pytest.raises(ChunkNotFound):
                self.bindings[which].set_readonly(ChunkHandle(name, readonly=False), flag)
            return
        self.bindings[which].set_readonly(ChunkHandle(name, readonly=False), flag)
        (self.read_only.add if flag else self.read_only.discard)(name)

    @rule(which=BINDINGS)
    def close(self, which: int) -> None:
        self.bindings[which].close()
        self.kept[which].clear()

    @invariant()
    def chunks_read_back_and_only_kept_descriptors_stay_open(self) -> None:
        reader = self.bindings[0]
        for name in ("a", "b", "s/c"):
            stored = self.chunks.get(name)
            assert reader.exists(name) == (stored is not None), name
            if stored is not None:
                assert reader.read(reader.open_read(name), 0, 4096) == bytes(stored), name
        # One open descriptor per (binding, name) kept: a binding's own deletes, failed
        # appends and closes leave none; one of a file deleted elsewhere stays until then.
        assert len(_open_below(self.root)) == len(self.kept[0]) + len(self.kept[1])


def test_random_programs_of_two_bindings_match_the_model() -> None:
    run_state_machine_as_test(
        AppendersMachine,
        settings=settings(
            max_examples=60, stateful_step_count=40, deadline=None, derandomize=True, database=None
        ),
    )


# -- write_together: the syncs of several appends issued together ---------------------------


def _same_stripe_names(count: int) -> list[str]:
    """``count`` chunk names that share one stripe lock of the binding."""
    wanted = FileSystemChunkStorage._stripe("s0")
    names = [f"s{i}" for i in range(100_000) if FileSystemChunkStorage._stripe(f"s{i}") == wanted]
    assert len(names) >= count
    return names[:count]


def test_appends_together_share_one_sync_call_and_keep_their_descriptors(fs, monkeypatch) -> None:
    """Three appends, two of them under one stripe lock (no self-deadlock): one call of
    the shared syncs for all three, every file at its length, every descriptor kept (the
    next appends open nothing)."""
    names = [*_same_stripe_names(2), "other"]
    handles = [fs.create(name, b"ab") for name in names]
    calls: list[int] = []
    real = fs._syncs.sync_each
    monkeypatch.setattr(fs._syncs, "sync_each", lambda fds: calls.append(len(fds)) or real(fds))
    assert fs.write_together([ChunkAppend(h, 2, b"cd") for h in handles]) == [2, 2, 2]
    assert calls == [3]
    opened = _count_opens(monkeypatch, fs.root)
    assert fs.write_together([ChunkAppend(h, 4, b"e") for h in handles]) == [1, 1, 1]
    assert opened == []
    for name in names:
        assert fs.read(fs.open_read(name), 0, 10) == b"abcde"
    assert sorted(os.path.basename(p) for p in _open_below(fs.root)) == sorted(names)


def test_an_append_whose_sync_fails_is_cut_back_and_keeps_no_descriptor(fs, monkeypatch) -> None:
    """The sync of the second of three appends fails (EIO): that append is a typed
    ``ChunkStorageError``, its file back at its old length and its descriptor closed; the
    others land and keep theirs. The failed chunk's next append works (by the path)."""
    handles = [fs.create(f"c{i}", b"xy") for i in range(3)]
    real = fs._syncs.sync_each

    def failing_second(fds: list[int]) -> list[OSError | None]:
        outcomes = real(fds)
        outcomes[1] = OSError(errno.EIO, "I/O error injected")
        return outcomes

    monkeypatch.setattr(fs._syncs, "sync_each", failing_second)
    results = fs.write_together([ChunkAppend(h, 2, b"zz") for h in handles])
    monkeypatch.setattr(fs._syncs, "sync_each", real)
    assert results[0] == 2 and results[2] == 2
    assert isinstance(results[1], ChunkStorageError) and "errno 5" in str(results[1])
    assert [os.path.getsize(fs._path(f"c{i}")) for i in range(3)] == [4, 2, 4]
    assert sorted(os.path.basename(p) for p in _open_below(fs.root)) == ["c0", "c2"]
    assert fs.write(handles[1], 2, b"zz") == 2
    assert fs.read(fs.open_read("c1"), 0, 10) == b"xyzz"


def test_an_interrupted_call_leaves_nothing_written_locked_or_open(fs, monkeypatch) -> None:
    """An interruption while the syncs run (``KeyboardInterrupt``): it propagates, every
    append of the call is cut back and its descriptor closed, and the stripe locks are
    free (the next call goes through)."""
    handles = [fs.create(name, b"q") for name in _same_stripe_names(2)]

    def interrupted(fds: list[int]) -> list[OSError | None]:
        raise KeyboardInterrupt

    monkeypatch.setattr(fs._syncs, "sync_each", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fs.write_together([ChunkAppend(h, 1, b"r") for h in handles])
    monkeypatch.undo()
    assert [os.path.getsize(fs._path(h.name)) for h in handles] == [1, 1]
    assert _open_below(fs.root) == []
    assert fs.write_together([ChunkAppend(h, 1, b"r") for h in handles]) == [1, 1]
