"""The filesystem binding's kept append descriptors (bindings/filesystem.py, module doc).

Invariants checked here: a chunk's next append reuses the descriptor its last append
opened (no path walk, no open); through a kept descriptor an append still sees
everything an append by path would: another writer's bytes (the length check), a
chunk made read-only, a chunk deleted by another process (``ChunkNotFound``, nothing
written anywhere); a delete in this process and ``close`` close the kept descriptors;
at most ``APPENDERS_MAX`` are open; a failed append keeps none.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from slts.bindings.base import ChunkHandle
from slts.bindings.filesystem import APPENDERS_MAX, FileSystemChunkStorage

from slts.errors import ChunkInvalidOffset, ChunkNotFound, ChunkReadOnly, ChunkStorageError


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
